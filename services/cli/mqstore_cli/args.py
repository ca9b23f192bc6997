"""The argument parser of the ``mqstore`` command line (the commands live in ``mqstore_cli.main``)."""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
from types import ModuleType

from mqstore import defaults
from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.tls import client_tls

DEFAULT_ADDRESS = defaults.COMMITLOG_ADDRESS


class UsageError(Exception):
    """Arguments that argparse alone cannot reject; printed as a usage error (exit 2)."""


class CliError(Exception):
    """A failure found by the command line itself, printed as ``error: <status>: <message>``."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def _property(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a property is NAME=VALUE, not {text!r}")
    return name, value


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(text: str) -> int:
    number, unit = text.strip(), "ms"
    for suffix in sorted(_DURATION_UNITS_MS, key=len, reverse=True):
        if number.endswith(suffix):
            number, unit = number[:-len(suffix)], suffix
            break
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a duration is a number with ms, s, m, h or d, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a delay must be positive, not {text!r}")
    return int(value * _DURATION_UNITS_MS[unit])


def _instant_ms(text: str) -> int:
    if text.strip().isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a time is epoch milliseconds or ISO 8601, not {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def _add_topic_commands(sub, commands: ModuleType) -> None:
    topic = sub.add_parser("topic", help="create, list, describe, update or delete topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="COMMAND")
    p = tsub.add_parser("create", help="create a topic")
    p.add_argument("name")
    p.add_argument("--queues", type=int, default=0, help="queue count (default: the server's, 4)")
    p.add_argument("--kind", choices=["normal", "compaction"], default="normal")
    p.add_argument("--retention-ms", type=int, default=0, help="0 = the server's retention")
    p.set_defaults(func=commands.cmd_topic_create)
    p = tsub.add_parser("list", help="list topics")
    p.add_argument("--all", action="store_true", help="include system topics")
    p.set_defaults(func=commands.cmd_topic_list)
    p = tsub.add_parser("describe", help="a topic and the offsets of its queues")
    p.add_argument("name")
    p.set_defaults(func=commands.cmd_topic_describe)
    p = tsub.add_parser("update", help="grow the queue count or change the retention")
    p.add_argument("name")
    p.add_argument("--queues", type=int, default=0, help="new queue count (may only grow; 0 = unchanged)")
    p.add_argument("--retention-ms", type=int, default=None, help="new retention (0 = the server's)")
    p.set_defaults(func=commands.cmd_topic_update)
    p = tsub.add_parser("delete", help="delete a topic")
    p.add_argument("name")
    p.set_defaults(func=commands.cmd_topic_delete)


def _add_data_commands(sub, commands: ModuleType) -> None:
    p = sub.add_parser("send", help="append messages: the BODY arguments, or else one per stdin line")
    p.add_argument("topic")
    p.add_argument("bodies", nargs="*", metavar="BODY")
    p.add_argument("--key", action="append", help="a key (repeatable)")
    p.add_argument("--tag", help="the tag of every message")
    p.add_argument("--property", action="append", type=_property, metavar="NAME=VALUE", help="repeatable")
    p.add_argument("--queue", type=int, default=None, help="queue id (default: the server chooses)")
    p.add_argument("--batch", type=_positive, default=100, help="messages per Append call (default 100)")
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")
    p.add_argument("--quiet", action="store_true", help="no line per message, only a summary on stderr")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_duration_ms, metavar="DURATION",
                      help="delayed delivery: due this long after the server's clock (500ms, 10s, 5m, 2h; a bare "
                           "number is milliseconds); at most the server's --timer-max-delay-ms")
    when.add_argument("--deliver-at", type=_instant_ms, metavar="TIME",
                      help="delayed delivery: due at this time (epoch milliseconds, or ISO 8601 such as "
                           "2026-12-05T21:30:00Z; no zone: UTC); a time in the past is delivered at once")
    p.set_defaults(func=commands.cmd_send)

    p = sub.add_parser("recall", help="cancel a delayed message before it is due (its msg_id from send)")
    p.add_argument("topic")
    p.add_argument("msg_id")
    p.set_defaults(func=commands.cmd_recall)

    p = sub.add_parser("pull", help="read a queue")
    p.add_argument("topic")
    p.add_argument("--queue", type=int, default=0)
    p.add_argument("--offset", type=int, default=None, help="default: the queue's minimum offset")
    p.add_argument("--max", type=_positive, default=32, help="messages to read (per pull with --follow)")
    p.add_argument("--tag", action="append", help="only these tags (repeatable)")
    p.add_argument("--sql", default="", help="only messages this SQL92 selector over their properties (TAGS, KEYS, "
                                             "user properties) selects, e.g. \"region = 'eu' AND price > 10\"; "
                                             "with --tag, both must match")
    p.add_argument("--follow", action="store_true", help="keep pulling (long poll) until Ctrl-C")
    p.set_defaults(func=commands.cmd_pull)

    p = sub.add_parser("get", help="one message by offset message id or physical offset")
    p.add_argument("msg_id", nargs="?")
    p.add_argument("--physical-offset", type=int, default=None)
    p.set_defaults(func=commands.cmd_get)


def _add_offset_commands(sub, commands: ModuleType) -> None:
    p = sub.add_parser("queue-info", help="min and max offsets of one queue, or of every queue of a topic")
    p.add_argument("topic")
    p.add_argument("--queue", type=int, default=None)
    p.set_defaults(func=commands.cmd_queue_info)

    p = sub.add_parser("offset-by-time", help="the queue offset at a time (binary search on store times)")
    p.add_argument("topic")
    p.add_argument("--queue", type=int, default=0)
    p.add_argument("--time", type=commands.parse_time_ms, required=True, help="ms since the epoch or ISO 8601")
    p.add_argument("--upper", action="store_true", help="last offset stored at or before the time "
                                                        "(default: first offset stored at or after it)")
    p.set_defaults(func=commands.cmd_offset_by_time)

    offset = sub.add_parser("offset", help="consumer group offsets")
    osub = offset.add_subparsers(dest="offset_command", required=True, metavar="COMMAND")
    p = osub.add_parser("commit", help="commit a consumer group's offset")
    p.add_argument("topic")
    p.add_argument("--group", required=True)
    p.add_argument("--queue", type=int, required=True)
    p.add_argument("--offset", type=int, required=True)
    p.set_defaults(func=commands.cmd_offset_commit)
    p = osub.add_parser("query", help="a consumer group's committed offsets")
    p.add_argument("topic")
    p.add_argument("--group", required=True)
    p.add_argument("--queue", type=int, default=None, help="default: every queue")
    p.set_defaults(func=commands.cmd_offset_query)


_SECURITY_OPTIONS = {
    "tls_ca": "CA that signed the servers' certificates: TLS (env MQSTORE_TLS_CA)",
    "tls_client_cert": "client certificate for mutual TLS (env MQSTORE_TLS_CLIENT_CERT)",
    "tls_client_key": "its key (env MQSTORE_TLS_CLIENT_KEY)",
    "tls_server_name": "name the servers' certificate must carry (default: the host; env MQSTORE_TLS_SERVER_NAME)",
    "user": "user to authenticate as (env MQSTORE_USER); the secret comes from MQSTORE_SECRET or --secret-file",
    "secret_file": "file holding the user's secret (env MQSTORE_SECRET_FILE)",
}


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    for name, text in _SECURITY_OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name,
                            default=os.environ.get("MQSTORE_" + name.upper(), ""), help=text)


def peers_from_args(args: argparse.Namespace, env=os.environ) -> Peers:
    """TLS and credentials from the options (the environment fills what they leave out)."""
    tls = client_tls(args.tls_ca, args.tls_client_cert, args.tls_client_key, args.tls_server_name)
    if not args.user:
        return Peers(tls)
    secret = env.get("MQSTORE_SECRET", "")
    if args.secret_file:
        try:
            secret = pathlib.Path(args.secret_file).read_text().strip()
        except OSError as exc:
            raise CliError("INVALID_ARGUMENT", f"--secret-file: cannot read {args.secret_file}: "
                                               f"{exc.strerror or exc}") from None
    if not secret:
        raise CliError("UNAUTHENTICATED", f"--user {args.user} needs its secret: set MQSTORE_SECRET or "
                                          f"--secret-file")
    return Peers(tls, args.user, Secret(secret))


def build_parser(commands: ModuleType) -> argparse.ArgumentParser:
    """``commands`` is the module holding the ``cmd_*`` functions (mqstore_cli.main)."""
    parser = argparse.ArgumentParser(prog="mqstore", description="mqstore command line (talks gRPC to CommitLog)")
    parser.add_argument("--address", default=os.environ.get("MQSTORE_ADDRESS", DEFAULT_ADDRESS),
                        help=f"CommitLog host:port (env MQSTORE_ADDRESS, default {DEFAULT_ADDRESS})")
    parser.add_argument("--json", action="store_true", help="print ProtoJSON, one object per line")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")
    _add_security_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_topic_commands(sub, commands)
    _add_data_commands(sub, commands)
    _add_offset_commands(sub, commands)
    p = sub.add_parser("store-info", help="log-wide offsets, flush mode, read-only state")
    p.set_defaults(func=commands.cmd_store_info)
    p = sub.add_parser("retention-holds", help="the retention holds that keep the log now (needs ADMIN on the cluster)")
    p.set_defaults(func=commands.cmd_retention_holds)
    tier = sub.add_parser("tier", help="the object storage tier (--tier-url)")
    tsub = tier.add_subparsers(dest="tier_command", required=True, metavar="COMMAND")
    p = tsub.add_parser("status", help="local and tiered bytes, upload lag, last upload error, tier reads and "
                                       "cache of the commit log's segments, then the same per topic of its "
                                       "consume queue files, of the node at --address (needs ADMIN on the "
                                       "cluster; FAILED_PRECONDITION when the tier is off)")
    p.add_argument("--segments", action="store_true",
                   help="also one line per commit log segment: local, in the tier, or both, and its object key")
    p.set_defaults(func=commands.cmd_tier_status)
    p = sub.add_parser("repair", help="repair a stopped store's log (keeps a .broken copy); runs locally")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--segment-size-bytes", type=int, default=None,
                   help="default: from the segment file names (needed when the only segment was cut short)")
    p.set_defaults(func=commands.cmd_repair)
    return parser
