"""The Index service's commands of the ``mqstore`` command line (registered by ``mqstore_cli.main``).

    mqstore query key demo order-42 [--begin-ms MS] [--end-ms MS] [--max N] [--messages] [--all]
    mqstore query id demo 7F0000017A2B18B4AAC25E4A7E210000 [--messages]
    mqstore query time demo 0 1700000000000
    mqstore index-stats

``--index-address`` (env MQSTORE_INDEX_ADDRESS, default 127.0.0.1:50052), before or after the command:
one Index instance, or several as ``host:port,host:port`` (``make run-ha`` runs two): a query that ends
UNAVAILABLE or DEADLINE_EXCEEDED on one is sent to the next (mqstore_rpc.endpoints; queries only read).
``--json`` prints the ProtoJSON of each response, one object per line. ``query key`` prints one page
and, when there is more, ``next page: <token>`` on stderr (pass it back with ``--page-token``);
``--all`` follows the tokens to the end (at most ``--max-pages`` pages).

This module is imported by ``mqstore_cli.main`` and must not import it back (the time and JSON helpers
it needs come through the ``cli`` object at run time).
"""

from __future__ import annotations

import argparse
import datetime
import os


from mqstore import defaults
from mqstore.errors import InvalidArgument
from mqstore.index import paging
from mqstore_rpc.endpoints import Failover
from mqstore_rpc.gen.mqstore.v1 import index_pb2, index_pb2_grpc

DEFAULT_INDEX_ADDRESS = defaults.INDEX_ADDRESS
MAX_MESSAGE_BYTES = defaults.MAX_MESSAGE_BYTES
DEFAULT_MAX_PAGES = 1_000


def _index_address_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("--index-address", default=default,
                        help=f"Index host:port, or host:port,host:port for several instances: a query "
                        f"one cannot answer (UNAVAILABLE, DEADLINE_EXCEEDED) goes to the next "
                        f"(env MQSTORE_INDEX_ADDRESS, default {DEFAULT_INDEX_ADDRESS})")


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Add ``query key|id|time`` and ``index-stats`` to the ``mqstore`` parser."""
    _index_address_option(parser, os.environ.get("MQSTORE_INDEX_ADDRESS", DEFAULT_INDEX_ADDRESS))
    # argparse offers no public way to reach a parser's subcommands once they exist.
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    query = sub.add_parser("query", help="find messages through the Index service: by key, id or time")
    qsub = query.add_subparsers(dest="query_command", required=True, metavar="COMMAND")

    p = qsub.add_parser("key", help="messages of a topic with a key, newest first")
    p.add_argument("topic")
    p.add_argument("key")
    p.add_argument("--begin-ms", type=int, default=0, help="store time from (ms since the epoch; default 0)")
    p.add_argument("--end-ms", type=int, default=0, help="store time to, inclusive (default 0 = now)")
    p.add_argument("--max", type=int, default=0, help="results per page (default 64 on the server; <= 10,000)")
    p.add_argument("--page-token", default="", help="continue a previous query")
    p.add_argument("--all", action="store_true", help="follow the page tokens to the end")
    p.add_argument("--max-pages", type=int, default=DEFAULT_MAX_PAGES, help="bound on pages with --all")
    p.add_argument("--messages", action="store_true", help="print the messages too")
    p.set_defaults(func=cmd_query_key)

    p = qsub.add_parser("id", help="the message with a UNIQ_KEY (client message id)")
    p.add_argument("topic")
    p.add_argument("uniq_key", metavar="UNIQ_KEY")
    p.add_argument("--messages", action="store_true", help="print the message too")
    p.set_defaults(func=cmd_query_id)

    p = qsub.add_parser("time", help="first queue offset stored at or after a time")
    p.add_argument("topic")
    p.add_argument("queue", type=int)
    p.add_argument("timestamp_ms", type=int, metavar="TIMESTAMP_MS")
    p.set_defaults(func=cmd_query_time)

    p = sub.add_parser("index-stats", help="index files, entries, lag behind the log, reads per query")
    p.set_defaults(func=cmd_index_stats)
    for command in (query, p, *qsub.choices.values()):
        _index_address_option(command, argparse.SUPPRESS)  # also accepted after the command


class _Index:
    """Channels to the Index instances of ``--index-address`` for one command (the next one answers when
    one is down: mqstore_rpc.endpoints.Failover). Not thread-safe."""

    def __init__(self, cli):
        self.cli = cli
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self.instances = Failover(cli.args.index_address, lambda address: cli.channel(address, options),
                                  index_pb2_grpc.IndexStub)

    def call(self, method: str, request, elsewhere=None):
        return self.instances.call(method, request, elsewhere, timeout=self.cli.args.timeout)

    def __enter__(self) -> _Index:
        return self

    def __exit__(self, *exc) -> None:
        self.instances.close()


def _time_text(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _page_lines(response: index_pb2.QueryByKeyResponse, with_messages: bool) -> list[str]:
    lines = []
    for i, loc in enumerate(response.locators):
        lines.append(f"{loc.msg_id}  {_time_text(loc.store_timestamp_ms)}  {loc.topic}  "
                     f"queue={loc.queue_id}  offset={loc.queue_offset}  physical_offset={loc.physical_offset}  "
                     f"uniq_key={loc.uniq_key}")
        if with_messages and i < len(response.messages):
            m = response.messages[i]
            keys = " ".join(m.keys)
            lines.append(f"    tags={m.tags}  keys={keys}  body={m.body.decode('utf-8', 'backslashreplace')}")
    return lines


def _emit(cli, response, human: list[str]) -> None:
    """ProtoJSON with --json (cli.emit), else the human lines (nothing for an empty page)."""
    if cli.args.json or human:
        cli.emit(response, "\n".join(human))


def _portable(request: index_pb2.QueryByKeyRequest) -> index_pb2.QueryByKeyRequest:
    """The request for another Index instance than the one that issued its page token (paging.portable)."""
    if not request.page_token:
        return request
    try:
        token = paging.portable(request.page_token)
    except InvalidArgument:  # not a token at all: the instance says so
        return request
    out = index_pb2.QueryByKeyRequest()
    out.CopyFrom(request)
    out.page_token = token
    return out


def cmd_query_key(cli) -> None:
    a = cli.args
    token, pages, found = a.page_token, 0, 0
    with _Index(cli) as index:
        while True:
            request = index_pb2.QueryByKeyRequest(topic=a.topic, key=a.key, begin_ms=a.begin_ms, end_ms=a.end_ms,
                                                  max_num=a.max, page_token=token, include_messages=a.messages)
            response = index.call("QueryByKey", request, _portable)
            pages, found, token = pages + 1, found + len(response.locators), response.next_page_token
            _emit(cli, response, _page_lines(response, a.messages))
            if not token or not a.all or pages >= a.max_pages:
                break
    if not a.json:
        cli.err.write(f"{found} message(s){'' if found else ' found'}"
                      f"{f'; next page: {token}' if token else ''}\n")


def cmd_query_id(cli) -> None:
    a = cli.args
    with _Index(cli) as index:
        response = index.call("QueryByUniqKey", index_pb2.QueryByUniqKeyRequest(
            topic=a.topic, uniq_key=a.uniq_key, include_messages=a.messages))
    _emit(cli, response, _page_lines(response, a.messages))


def cmd_query_time(cli) -> None:
    a = cli.args
    with _Index(cli) as index:
        response = index.call("QueryByTime", index_pb2.QueryByTimeRequest(
            topic=a.topic, queue_id=a.queue, timestamp_ms=a.timestamp_ms))
    _emit(cli, response, [str(response.offset)])


def cmd_index_stats(cli) -> None:
    with _Index(cli) as index:
        s = index.call("Stats", index_pb2.IndexStatsRequest())
    lines = [f"{field.name}: {value}" for field, value in s.ListFields()]
    _emit(cli, s, lines)
