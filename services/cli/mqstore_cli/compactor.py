"""The Compactor service's commands of the ``mqstore`` command line (registered by ``mqstore_cli.main``).

    mqstore compact run kv [--queue N] [--engine auto|local|spark] [--seal-active] [--catch-up]
    mqstore compact status kv [--queue N]          (DescribeQueue of one queue, or of every queue)
    mqstore kv get kv user-1 [user-2 ...]          (BatchGetLatest; a tombstone or a missing key says so)
    mqstore kv scan kv [--include-tombstones]      (every live key's latest value)

``compact run --catch-up`` first waits (at most ``--timeout``) until the compactor has applied what the
commit log at ``--address`` held for the topic when asked, so a round right after ``mqstore send``
covers it (without it, the round covers what the compactor has applied so far).
``compact status`` prints one ``name: value`` line per field (every field, zeros too), the last round
and the quarantine as sentences, times in UTC; with the compactor's ``--tier-url``, the queue's
``tier_*`` lines (local and tiered bytes, pending uploads, the last error: DescribeQueue's ``tier``).
A topic with no compaction log on the compactor (not a COMPACTION topic, or nothing written yet) is
NOT_FOUND for ``kv get`` as for ``kv scan``, while an
unknown key of a known topic prints ``(no value)``.

``--compactor-address`` (env MQSTORE_COMPACTOR_ADDRESS, default 127.0.0.1:50054), before or after the
command: one host:port, or several (``a:50054,b:50054``: the compactors of an HA deployment); a call that
ends UNAVAILABLE or DEADLINE_EXCEEDED goes to the next (mqstore_rpc.endpoints.Failover), so reads are
answered by any instance and ``compact run`` reaches the active one (a standby answers it UNAVAILABLE).
``--json`` prints the ProtoJSON of each response. Must not import mqstore_cli.main back.
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time

import grpc

from mqstore import defaults
from mqstore_cli.args import CliError
from mqstore_rpc.endpoints import RETRIED, Failover
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc

DEFAULT_ADDRESS = defaults.COMPACTOR_ADDRESS
CATCH_UP_POLL_S = 0.05
_ENGINES = {"auto": pb.COMPACTION_ENGINE_AUTO, "local": pb.COMPACTION_ENGINE_LOCAL, "spark": pb.COMPACTION_ENGINE_SPARK}


def _address_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("--compactor-address", default=default,
                        help=f"Compactor host:port, or several comma-separated (each is tried in turn when one is "
                             f"down; a standby sends compact run to the next) (env MQSTORE_COMPACTOR_ADDRESS, "
                             f"default {DEFAULT_ADDRESS})")


def add_commands(parser: argparse.ArgumentParser) -> None:
    _address_option(parser, os.environ.get("MQSTORE_COMPACTOR_ADDRESS", DEFAULT_ADDRESS))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    compact = sub.add_parser("compact", help="compaction rounds of COMPACTION topics (the Compactor service)")
    csub = compact.add_subparsers(dest="compact_command", required=True, metavar="COMMAND")
    p = csub.add_parser("run", help="run a round now and wait for it")
    p.add_argument("topic")
    p.add_argument("--queue", type=int, default=None, help="one queue (default: every queue of the topic)")
    p.add_argument("--engine", choices=sorted(_ENGINES), default="auto")
    p.add_argument("--seal-active", action="store_true", help="seal the active segment first (clean it too)")
    p.add_argument("--catch-up", action="store_true",
                   help="first wait until the compactor has applied what the commit log at --address holds for "
                        "the topic (a round right after a send then covers it)")
    p.set_defaults(func=cmd_compact_run)
    p = csub.add_parser("status", help="clean/dirty bytes, last round, tombstones, quarantine")
    p.add_argument("topic")
    p.add_argument("--queue", type=int, default=None)
    p.set_defaults(func=cmd_compact_status)
    kv = sub.add_parser("kv", help="latest values of a COMPACTION topic (the Compactor service)")
    ksub = kv.add_subparsers(dest="kv_command", required=True, metavar="COMMAND")
    p = ksub.add_parser("get", help="the latest value of each key")
    p.add_argument("topic")
    p.add_argument("keys", nargs="+")
    p.set_defaults(func=cmd_kv_get)
    p = ksub.add_parser("scan", help="every live key's latest value")
    p.add_argument("topic")
    p.add_argument("--include-tombstones", action="store_true")
    p.set_defaults(func=cmd_kv_scan)
    for command in (compact, kv, *csub.choices.values(), *ksub.choices.values()):
        _address_option(command, argparse.SUPPRESS)


class _Compactor:
    """Channels to the compactors of ``--compactor-address`` for one command (Failover). Not thread-safe."""

    def __init__(self, cli):
        self.cli = cli
        options = [("grpc.max_receive_message_length", defaults.MAX_MESSAGE_BYTES)]
        self.instances = Failover(cli.args.compactor_address, lambda address: cli.channel(address, options),
                                  compactor_pb2_grpc.CompactorStub)

    def call(self, method: str, request, timeout: float):
        return self.instances.call(method, request, timeout=timeout)

    def scan(self, request, timeout: float):
        """Scan's pages from the first instance that answers: another is tried while none has come yet."""
        error = None
        for stub in self.instances.in_turn():
            pages = stub.Scan(request, timeout=timeout)
            try:
                first = next(pages, None)
            except grpc.RpcError as exc:
                if exc.code() not in RETRIED:
                    raise
                error = exc
                continue
            if first is not None:
                yield first
                yield from pages
            return
        raise error

    def __enter__(self) -> _Compactor:
        return self

    def __exit__(self, *exc) -> None:
        self.instances.close()


def _value_line(v: pb.LatestValue) -> str:
    if not v.found:
        return f"{v.key}: (no value)"
    if v.tombstone:
        return f"{v.key}: (deleted)  queue={v.queue_id}  offset={v.queue_offset}"
    return f"{v.key}: {v.value.decode('utf-8', 'backslashreplace')}  queue={v.queue_id}  offset={v.queue_offset}"


def _applied_offset(c: _Compactor, topic: str, queue_id: int, timeout_s: float) -> int:
    try:
        request = pb.DescribeQueueRequest(topic=topic, queue_id=queue_id)
        return c.call("DescribeQueue", request, timeout_s).max_offset
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return 0  # no compaction log for this queue yet: the compactor has applied nothing of it


def catch_up(cli, c: _Compactor, topic: str, queue_id: int | None) -> None:
    """Wait (at most --timeout) until the compactor has applied every record that the commit log's queues
    of ``topic`` held when asked (the compaction logs keep the original queue offsets), so that a round
    run right after a send covers it. CliError DEADLINE_EXCEEDED names the queue that lags."""
    described = cli.call("DescribeTopic", commitlog_pb2.DescribeTopicRequest(name=topic))
    wanted = {q.queue_id: q.max_offset for q in described.queues
              if q.max_offset > 0 and queue_id in (None, q.queue_id)}
    deadline = time.monotonic() + cli.args.timeout
    pause = threading.Event()
    while wanted:
        for qid, offset in list(wanted.items()):
            have = _applied_offset(c, topic, qid, cli.args.timeout)
            if have >= offset:
                del wanted[qid]
            elif time.monotonic() > deadline:
                raise CliError("DEADLINE_EXCEEDED", f"the compactor at {cli.args.compactor_address} has applied "
                               f"queue {qid} of {topic} up to offset {have} of {offset} after {cli.args.timeout:.0f} "
                               f"s; is it following the commit log at {cli.args.address}? (mqstore compact status, "
                               f"Compactor/Stats)")
        pause.wait(CATCH_UP_POLL_S)


def cmd_compact_run(cli) -> None:
    a = cli.args
    request = pb.CompactRequest(topic=a.topic, engine=_ENGINES[a.engine], seal_active=a.seal_active)
    if a.queue is not None:
        request.queue_id = a.queue
    with _Compactor(cli) as c:
        if a.catch_up:
            catch_up(cli, c, a.topic, a.queue)
        response = c.call("Compact", request, max(cli.args.timeout, 3600))
    cli.emit(response, "\n".join(f"queue {r.queue_id}: {r.result}  engine={r.engine}  passes={r.passes}  "
                                 f"removed={r.records_removed}  tombstones_removed={r.tombstones_removed}  "
                                 f"bytes_reclaimed={r.bytes_reclaimed}" for r in response.rounds))


def _time_text(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _plural(count: int, word: str, plural: str = "") -> str:
    return f"{count} {word}" if count == 1 else f"{count} {plural or word + 's'}"


def _round_text(r: pb.RoundReport) -> str:
    if not r.started_ms:
        return "none yet"
    took = f", took {r.ended_ms - r.started_ms} ms" if r.ended_ms else ", still running"
    return (f"{r.result} at {_time_text(r.started_ms)}{took} (engine {r.engine}, trigger {r.trigger}, "
            f"{_plural(r.passes, 'pass', 'passes')}, {_plural(r.keys_mapped, 'key')} mapped, "
            f"{_plural(r.records_removed, 'record')} and {_plural(r.tombstones_removed, 'tombstone')} removed, "
            f"{r.bytes_reclaimed} bytes reclaimed)")


def _quarantine_text(d: pb.QueueDescription) -> str:
    if not d.quarantined:
        return "no" + (f" ({_plural(d.failures, 'failed round')} so far; last error: {d.last_error})"
                       if d.failures else "")
    return (f"yes, until {_time_text(d.quarantined_until_ms)} after {_plural(d.failures, 'failed round')}; "
            f"last error: {d.last_error}")


def status_text(d: pb.QueueDescription) -> str:
    """A QueueDescription as lines a person reads (the CLI's ``compact status``)."""
    pending = f"{d.tombstones_pending}" + (f" ({d.tombstones_pending_why})" if d.tombstones_pending_why else "")
    lines = [f"{d.topic} queue {d.queue_id}:",
             f"  clean_bytes: {d.clean_bytes}", f"  dirty_bytes: {d.dirty_bytes}",
             f"  active_bytes: {d.active_bytes}", f"  dirty_ratio: {d.dirty_ratio:.2f}",
             f"  cleaned_up_to_offset: {d.cleaned_up_to_offset}" + (" (no round yet)" if d.cleaned_up_to_offset < 0
                                                                      else ""),
             f"  min_offset: {d.min_offset}", f"  max_offset: {d.max_offset}",
             f"  records: {d.records}", f"  keys: {d.keys}",
             f"  last_round: {_round_text(d.last_round)}",
             f"  round_running: {'yes' if d.round_running else 'no'}",
             f"  due: {d.due or 'no'}",
             f"  tombstones_pending: {pending}",
             f"  quarantined: {_quarantine_text(d)}"]
    if d.HasField("tier"):  # the compactor's --tier-url: the queue's sealed segments, local and in the tier
        t = d.tier
        error = f"{t.last_error} (at {_time_text(t.last_error_ms)})" if t.last_error else "none"
        lines += [f"  tier: {t.tier_url}", f"  tier_local_bytes: {t.local_bytes}",
                  f"  tier_tiered_bytes: {t.tiered_bytes} ({t.tiered_segments} segments)",
                  f"  tier_pending_uploads: {t.pending_uploads} ({t.pending_bytes} bytes)",
                  f"  tier_last_error: {error}"]
    return "\n".join(lines)


def cmd_compact_status(cli) -> None:
    a = cli.args
    with _Compactor(cli) as c:
        queues = [a.queue] if a.queue is not None else [
            q.queue_id for q in c.call("ListQueues", pb.ListQueuesRequest(), cli.args.timeout).queues
            if q.topic == a.topic]
        for queue_id in queues:
            d = c.call("DescribeQueue", pb.DescribeQueueRequest(topic=a.topic, queue_id=queue_id), cli.args.timeout)
            cli.emit(d, status_text(d))


def cmd_kv_get(cli) -> None:
    a = cli.args
    with _Compactor(cli) as c:
        response = c.call("BatchGetLatest", pb.BatchGetLatestRequest(topic=a.topic, keys=a.keys), cli.args.timeout)
        if not any(v.found for v in response.values):
            # BatchGetLatest answers found=false for keys of a topic the compactor does not have; Scan
            # says NOT_FOUND for it (the server's own message): the same answer as `kv scan`.
            for _ in c.scan(pb.ScanRequest(topic=a.topic, page_size=1, max_pages=1), cli.args.timeout):
                pass
    cli.emit(response, "\n".join(_value_line(v) for v in response.values))


def cmd_kv_scan(cli) -> None:
    a = cli.args
    with _Compactor(cli) as c:
        for page in c.scan(pb.ScanRequest(topic=a.topic, include_tombstones=a.include_tombstones),
                           max(cli.args.timeout, 600)):
            if page.values or cli.args.json:
                cli.emit(page, "\n".join(_value_line(v) for v in page.values))
