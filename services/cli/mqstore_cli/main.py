"""The ``mqstore`` command line: topics, send, pull, get, offsets and store facts over gRPC.

    mqstore topic create demo --queues 4          mqstore send demo hello world
    seq 1 100000 | mqstore send demo --tag t       mqstore pull demo --queue 0 --offset 0 --max 10
    mqstore pull demo --queue 0 --follow           mqstore get 7F0000010000C3830000000000000000
    mqstore pull demo --sql "region = 'eu' AND price BETWEEN 10 AND 20"
    mqstore queue-info demo                        mqstore offset commit demo --group g --queue 0 --offset 5
    mqstore receive demo --group g --ack           mqstore ack demo --group g HANDLE...
    mqstore store-info --json                      mqstore repair --data-dir ./data
    mqstore retention-holds                        mqstore tier status --segments

``--address`` (env MQSTORE_ADDRESS, default 127.0.0.1:50051). TLS: ``--tls-ca`` (env MQSTORE_TLS_CA: the
CA that signed the servers' certificates), ``--tls-client-cert``/``--tls-client-key`` for mutual TLS,
``--tls-server-name``; credentials when the servers require them: ``--user`` (env MQSTORE_USER) and the
secret from MQSTORE_SECRET or ``--secret-file`` (never a flag: flags show in ps). ``--json`` prints the
ProtoJSON of each response (snake_case names, int64 as numbers, bytes as base64): one object per line,
and for send and pull one line per message. ``send`` prints both ids of each message: ``msg_id=`` (the offset message
id, for ``get``) and ``uniq_key=`` (for ``query id``). Errors print ``error: <STATUS>: <message>`` on
stderr and exit 1; UNIMPLEMENTED names the services the server at that address serves
(mqstore_cli.errors).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import sys
import time
from typing import Callable, Iterable, Iterator, Sequence, TextIO

import grpc
from google.protobuf import json_format

from mqstore import defaults
from mqstore.errors import MqStoreError
from mqstore_cli import access, compactor, index, offline, pop, replication, top, txn
from mqstore_rpc import logging as mqlogging
from mqstore_cli.args import CliError, UsageError, build_parser, peers_from_args
from mqstore_cli.errors import error_line
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.peers import Peers

MAX_MESSAGE_BYTES = defaults.MAX_MESSAGE_BYTES
BATCH_BODY_BYTES = 4 * 1024 * 1024      # the server's default limit on the bodies of one Append
FOLLOW_LONG_POLL_MS = 5_000
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


class Cli:
    """One invocation: the parsed arguments, a lazily opened channel, and output. Not thread-safe."""

    def __init__(self, args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr):
        self.args = args
        self.out = out
        self.err = err
        self._channel: grpc.Channel | None = None
        self._stub: commitlog_pb2_grpc.CommitLogStub | None = None

    @functools.cached_property
    def peers(self) -> Peers:
        """TLS and credentials of every channel this invocation opens (mqstore_cli.args: --tls-*, --user)."""
        return peers_from_args(self.args)

    def channel(self, address: str, options=()) -> grpc.Channel:
        return self.peers.channel(address, options)

    @property
    def first_address(self) -> str:
        """The first node of ``--address`` (a replication group may be given as ``a:1,b:2,...``)."""
        return self.args.address.split(",")[0].strip()

    @property
    def log_channel(self) -> grpc.Channel:
        """To the commit log node this invocation uses: the first of ``--address``, then a leader it was sent to."""
        if self._channel is None:
            self._connect(self.first_address)
        return self._channel

    def _connect(self, address: str) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self.channel(address, CHANNEL_OPTIONS)
        self._stub = commitlog_pb2_grpc.CommitLogStub(self._channel)

    @property
    def stub(self) -> commitlog_pb2_grpc.CommitLogStub:
        self.log_channel  # noqa: B018 - opens it
        return self._stub

    def call(self, method: str, request, extra_timeout_s: float = 0.0, *, service=None):
        """``method`` of the CommitLog service (or of ``service``, a stub class such as ConsumerStub, on the
        same node). A write that reaches a replica (FAILED_PRECONDITION with the trailer mqstore-leader) is
        sent once more, to the leader it names: the replica wrote nothing."""
        make = service or (lambda channel: self._stub)
        try:
            return getattr(make(self.log_channel), method)(request, timeout=self.args.timeout + extra_timeout_s)
        except grpc.RpcError as exc:
            leader = dict(exc.trailing_metadata() or ()).get("mqstore-leader") if exc.code() == \
                grpc.StatusCode.FAILED_PRECONDITION else None
            if not leader:
                raise
            self._connect(leader)
            return getattr(make(self.log_channel), method)(request, timeout=self.args.timeout + extra_timeout_s)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def emit(self, message, human: str) -> None:
        if self.args.json:
            self.out.write(to_json(message) + "\n")
        else:
            self.out.write(human + "\n")
        self.out.flush()


def to_json(message) -> str:
    if isinstance(message, dict):  # rows the CLI builds itself
        return json.dumps(message, separators=(",", ":"))
    as_dict = json_format.MessageToDict(message, always_print_fields_with_no_presence=True,
                                        preserving_proto_field_name=True, unquote_int64_if_possible=True)
    return json.dumps(as_dict, separators=(",", ":"))


def _text(body: bytes) -> str:
    return body.decode("utf-8", "backslashreplace").replace("\n", "\\n")


def _time_text(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _kind(kind: int) -> str:
    return common_pb2.TopicKind.Name(kind).removeprefix("TOPIC_KIND_")


def _topic_line(t: commitlog_pb2.Topic) -> str:
    return (f"{t.name}  queues={t.queue_count}  kind={_kind(t.kind)}  retention_ms={t.retention_ms}  "
            f"created={_time_text(t.created_ms)}")


def _queue_line(q: commitlog_pb2.QueueInfo) -> str:
    return f"{q.topic}  queue={q.queue_id}  min_offset={q.min_offset}  max_offset={q.max_offset}"


def _message_line(m: common_pb2.StoredMessage) -> str:
    parts = [f"{m.queue_id}:{m.queue_offset}", m.msg_id]
    if m.tags:
        parts.append(f"tags={m.tags}")
    if m.keys:
        parts.append("keys=" + ",".join(m.keys))
    parts.append(_text(m.body))
    return "  ".join(parts)


def _message_detail(m: common_pb2.StoredMessage) -> str:
    lines = [f"msg_id: {m.msg_id}", f"uniq_key: {m.uniq_key}", f"topic: {m.topic}", f"queue_id: {m.queue_id}",
             f"queue_offset: {m.queue_offset}", f"physical_offset: {m.physical_offset}",
             f"size_bytes: {m.size_bytes}", f"tags: {m.tags}", f"keys: {' '.join(m.keys)}",
             f"born: {_time_text(m.born_timestamp_ms)} from {m.born_host}",
             f"stored: {_time_text(m.store_timestamp_ms)} on {m.store_host}", f"body_crc: {m.body_crc}"]
    lines += [f"property {k}: {v}" for k, v in sorted(m.properties.items())]
    lines.append(f"body: {_text(m.body)}")
    return "\n".join(lines)


# ---- topics -------------------------------------------------------------------------------------------

def cmd_topic_create(cli: Cli) -> None:
    a = cli.args
    kind = common_pb2.TopicKind.Value("TOPIC_KIND_" + a.kind.upper())
    t = cli.call("CreateTopic", commitlog_pb2.CreateTopicRequest(name=a.name, queue_count=a.queues, kind=kind,
                                                                 retention_ms=a.retention_ms))
    cli.emit(t, "created " + _topic_line(t))


def cmd_topic_list(cli: Cli) -> None:
    response = cli.call("ListTopics", commitlog_pb2.ListTopicsRequest(include_system=cli.args.all))
    cli.emit(response, "\n".join(_topic_line(t) for t in response.topics) or "(no topics)")


def cmd_topic_describe(cli: Cli) -> None:
    d = cli.call("DescribeTopic", commitlog_pb2.DescribeTopicRequest(name=cli.args.name))
    cli.emit(d, "\n".join([_topic_line(d.topic), *("  " + _queue_line(q) for q in d.queues)]))


def cmd_topic_update(cli: Cli) -> None:
    a = cli.args
    request = commitlog_pb2.UpdateTopicRequest(name=a.name, queue_count=a.queues)
    if a.retention_ms is not None:
        request.retention_ms = a.retention_ms
    t = cli.call("UpdateTopic", request)
    cli.emit(t, "updated " + _topic_line(t))


def cmd_topic_delete(cli: Cli) -> None:
    response = cli.call("DeleteTopic", commitlog_pb2.DeleteTopicRequest(name=cli.args.name))
    cli.emit(response, f"deleted {cli.args.name}")


# ---- send ---------------------------------------------------------------------------------------------

class Progress:
    """A progress line on stderr at most once per interval. Not thread-safe."""

    def __init__(self, err: TextIO, enabled: bool, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self._err, self._enabled, self._interval_s, self._clock = err, enabled, interval_s, clock
        self._tty = enabled and err.isatty()
        self._start = self._last = clock()
        self._shown = False

    def update(self, sent: int, final: bool = False) -> None:
        now = self._clock()
        if not self._enabled or (not final and now - self._last < self._interval_s) or (final and not self._shown):
            return
        self._last, self._shown = now, True
        rate = sent / max(now - self._start, 1e-9)
        start = "\r" if self._tty else ""
        end = "\n" if final or not self._tty else ""
        self._err.write(f"{start}sent {sent} messages ({rate:,.0f} msg/s){end}")
        self._err.flush()


def _bodies(cli: Cli) -> Iterator[bytes]:
    if cli.args.bodies:
        for body in cli.args.bodies:
            yield body.encode("utf-8")
        return
    for line in sys.stdin.buffer:
        yield line.removesuffix(b"\n").removesuffix(b"\r")


def _batches(cli: Cli, bodies: Iterable[bytes]) -> Iterator[list[common_pb2.MessageInput]]:
    a = cli.args
    template = common_pb2.MessageInput(tags=a.tag or "", keys=a.key or [], properties=dict(a.property or []))
    if a.queue is not None:
        template.queue_id = a.queue
    if a.delay:
        template.delay_ms = a.delay
    if a.deliver_at is not None:
        template.deliver_at_ms = max(a.deliver_at, 1)  # 0 means none on the wire: 1 ms is as past
    batch: list[common_pb2.MessageInput] = []
    batch_bytes = 0
    for body in bodies:
        if batch and (len(batch) >= a.batch or batch_bytes + len(body) > BATCH_BODY_BYTES):
            yield batch
            batch, batch_bytes = [], 0
        message = common_pb2.MessageInput()
        message.CopyFrom(template)
        message.body = body
        batch.append(message)
        batch_bytes += len(body)
    if batch:
        yield batch


def _sent_line(r: commitlog_pb2.AppendResult) -> str:
    """Both ids, labelled: ``get`` takes the offset msg id, ``query id`` the UNIQ_KEY."""
    durability = common_pb2.Durability.Name(r.durability).removeprefix("DURABILITY_")
    return f"msg_id={r.msg_id}  uniq_key={r.uniq_key}  queue={r.queue_id}  offset={r.queue_offset}  {durability}"


def cmd_send(cli: Cli) -> None:
    a = cli.args
    progress = Progress(cli.err, enabled=a.progress or cli.err.isatty())
    sent = 0
    for batch in _batches(cli, _bodies(cli)):
        response = cli.call("Append", commitlog_pb2.AppendRequest(topic=a.topic, messages=batch))
        sent += len(response.results)
        if not a.quiet:
            for r in response.results:
                cli.emit(r, _sent_line(r))
        progress.update(sent)
    progress.update(sent, final=True)
    if a.quiet:
        cli.err.write(f"sent {sent} messages to {a.topic}\n")


def cmd_recall(cli: Cli) -> None:
    a = cli.args
    answer = cli.call("RecallTimer", commitlog_pb2.RecallTimerRequest(topic=a.topic, msg_id=a.msg_id))
    cli.emit(answer, f"recalled {a.msg_id} of {a.topic} (it was due at {answer.deliver_at_ms} ms)")


# ---- pull and get -------------------------------------------------------------------------------------

def _start_offset(cli: Cli) -> int:
    if cli.args.offset is not None:
        return cli.args.offset
    info = cli.call("GetQueueInfo", commitlog_pb2.GetQueueInfoRequest(topic=cli.args.topic, queue_id=cli.args.queue))
    return info.min_offset


def _pull(cli: Cli, offset: int, max_messages: int, long_poll_ms: int) -> commitlog_pb2.PullResponse:
    a = cli.args
    request = commitlog_pb2.PullRequest(topic=a.topic, queue_id=a.queue, offset=offset, max_messages=max_messages,
                                        tags=a.tag or [], long_poll_ms=long_poll_ms)
    if a.sql:
        request.filter_type, request.filter_expression = common_pb2.FILTER_TYPE_SQL92, a.sql
    return cli.call("Pull", request, extra_timeout_s=long_poll_ms / 1000)


def cmd_pull(cli: Cli) -> None:
    offset = _start_offset(cli)
    remaining = cli.args.max
    while cli.args.follow or remaining > 0:
        want = cli.args.max if cli.args.follow else remaining
        response = _pull(cli, offset, want, FOLLOW_LONG_POLL_MS if cli.args.follow else 0)
        for m in response.messages:
            cli.emit(m, _message_line(m))
        remaining -= len(response.messages)
        caught_up = response.next_offset >= response.max_offset or response.next_offset == offset
        offset = response.next_offset
        if caught_up and not cli.args.follow:
            break


def cmd_get(cli: Cli) -> None:
    a = cli.args
    if (a.msg_id is None) == (a.physical_offset is None):
        raise UsageError("get needs exactly one of MSG_ID or --physical-offset")
    if a.msg_id is not None:
        request = commitlog_pb2.GetMessageRequest(msg_id=a.msg_id)
    else:
        request = commitlog_pb2.GetMessageRequest(physical_offset=a.physical_offset)
    m = cli.call("GetMessage", request)
    if m.id_store_host:  # the id came from another store: this is whatever this one holds at its offset
        cli.err.write(f"warning: {a.msg_id} is an id of the store at {m.id_store_host}, not of {cli.first_address} "
                      f"(whose record at physical offset {m.physical_offset} is shown, written by {m.store_host}): "
                      f"ask the store that gave the id (--address {m.id_store_host}), or look the message up "
                      f"by key or uniq key in the index\n")
    cli.emit(m, _message_detail(m))


# ---- offsets and store --------------------------------------------------------------------------------

def _queue_ids(cli: Cli) -> list[int]:
    if cli.args.queue is not None:
        return [cli.args.queue]
    d = cli.call("DescribeTopic", commitlog_pb2.DescribeTopicRequest(name=cli.args.topic))
    return [q.queue_id for q in d.queues]


def cmd_queue_info(cli: Cli) -> None:
    for queue_id in _queue_ids(cli):
        q = cli.call("GetQueueInfo", commitlog_pb2.GetQueueInfoRequest(topic=cli.args.topic, queue_id=queue_id))
        cli.emit(q, _queue_line(q))


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, or ISO 8601 (UTC when no zone is given)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ms since the epoch nor ISO 8601: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def cmd_offset_by_time(cli: Cli) -> None:
    a = cli.args
    boundary = commitlog_pb2.TIME_BOUNDARY_UPPER if a.upper else commitlog_pb2.TIME_BOUNDARY_LOWER
    r = cli.call("GetOffsetByTime", commitlog_pb2.GetOffsetByTimeRequest(topic=a.topic, queue_id=a.queue,
                                                                         timestamp_ms=a.time, boundary=boundary))
    cli.emit(r, str(r.offset))


def cmd_offset_commit(cli: Cli) -> None:
    a = cli.args
    r = cli.call("CommitOffset", commitlog_pb2.CommitOffsetRequest(group=a.group, topic=a.topic, queue_id=a.queue,
                                                                   offset=a.offset))
    cli.emit(r, f"committed {a.group} {a.topic} queue={a.queue} offset={a.offset}")


def cmd_offset_query(cli: Cli) -> None:
    """One queue: its offset or NOT_FOUND. Every queue: a line each, offset "none" (null) where nothing
    was committed, since a group usually has committed on some queues only."""
    a = cli.args
    for queue_id in _queue_ids(cli):
        request = commitlog_pb2.QueryOffsetRequest(group=a.group, topic=a.topic, queue_id=queue_id)
        try:
            offset = cli.call("QueryOffset", request).offset
        except grpc.RpcError as exc:
            if a.queue is not None or exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            offset = None
        row = {"group": a.group, "topic": a.topic, "queue_id": queue_id, "offset": offset}
        cli.emit(row, f"{a.group} {a.topic} queue={queue_id} offset={'none' if offset is None else offset}")


def cmd_store_info(cli: Cli) -> None:
    s = cli.call("GetStoreInfo", commitlog_pb2.GetStoreInfoRequest())
    lines = [f"{field.name}: {getattr(s, field.name)}" for field in s.DESCRIPTOR.fields]
    cli.emit(s, "\n".join(lines))


def cmd_retention_holds(cli: Cli) -> None:
    """One line per hold (mqstore.retention_holds): name, physical offset, open streams or since when closed,
    whether durable (named by the internal identity), when it lapses (UTC)."""
    holds = cli.call("ListRetentionHolds", commitlog_pb2.ListRetentionHoldsRequest()).holds
    if cli.args.json:
        for hold in holds:
            cli.emit(hold, "")
        return
    if not holds:
        cli.out.write("no retention holds\n")
    for h in holds:
        state = f"open streams={h.open_streams}" if h.open_streams else f"closed at {_utc(h.closed_ms)}"
        cli.out.write(f"{h.name} physical_offset={h.physical_offset} {state} durable={str(h.durable).lower()} "
                      f"lapses at {_utc(h.lapses_at_ms)}\n")
    cli.out.flush()


def cmd_tier_status(cli: Cli) -> None:
    """The tier's figures (mqstore.tier.status): the commit log's, one ``name: value`` a line; one line per topic
    (its consume queue files' figures, ``name=value``); then with --segments one line per segment: base, size,
    where it is (local, tiered, local+tiered), sealed or open, its object key."""
    s = cli.call("GetTierStatus", commitlog_pb2.GetTierStatusRequest(segments=cli.args.segments))
    if cli.args.json:
        cli.emit(s, "")
        return
    lines = []
    for field in s.DESCRIPTOR.fields:
        if field.name in ("segments", "topics"):
            continue
        value = getattr(s, field.name)
        if field.name.endswith("_bytes"):
            value = f"{value} ({_size(value)})"
        elif field.name in ("last_error_ms",) and value:
            value = f"{value} ({_utc(value)})"
        lines.append(f"{field.name}: {value}")
    for topic in s.topics:
        figures = " ".join(f"{f.name}={getattr(topic, f.name)!r}" if f.name == "last_error" else
                           f"{f.name}={getattr(topic, f.name)}" for f in topic.DESCRIPTOR.fields if f.name != "topic")
        lines.append(f"topic {topic.topic} {figures}")
    for seg in s.segments:
        where = "+".join(w for w, on in (("local", seg.local), ("tiered", seg.tiered)) if on)
        lines.append(f"segment {seg.base:020d} size={seg.size} {where} {'sealed' if seg.sealed else 'open'}"
                     f"{' key=' + seg.key if seg.key else ''}")
    cli.emit(s, "\n".join(lines))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="seconds")


def cmd_repair(cli: Cli) -> None:
    try:
        from mqstore.log.repair import repair  # only this command needs the storage engine itself
    except ImportError as exc:
        raise CliError("UNIMPLEMENTED", f"repair is not available in this build ({exc})") from None
    report = repair(cli.args.data_dir, cli.args.segment_size_bytes)
    as_dict = dataclasses.asdict(report) if dataclasses.is_dataclass(report) else report
    if cli.args.json:
        cli.out.write(json.dumps(as_dict, default=str) + "\n")
    elif isinstance(as_dict, dict):
        cli.out.write("".join(f"{k}: {v}\n" for k, v in as_dict.items()))
    else:
        cli.out.write(f"{report}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(sys.modules[__name__])
    index.add_commands(parser)
    txn.add_commands(parser)
    pop.add_commands(parser)
    compactor.add_commands(parser)
    offline.add_commands(parser)
    replication.add_commands(parser)
    access.add_commands(parser)
    top.add_commands(parser)
    args = parser.parse_args(argv)
    mqlogging.configure("warning")  # stdout is for results; events of local commands (repair) go to stderr
    cli = Cli(args)
    try:
        status = args.func(cli)  # a command may return its exit status (check: 1 if the log is damaged)
        return status if isinstance(status, int) else 0
    except UsageError as exc:
        parser.error(str(exc))
    except (grpc.RpcError, CliError, MqStoreError) as exc:  # MqStoreError: from repair, which runs locally
        print(error_line(exc, args), file=sys.stderr)
    except KeyboardInterrupt:
        return 0 if getattr(args, "follow", False) else 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # e.g. `mqstore pull ... | head`
        return 0
    finally:
        cli.close()
    return 1


if __name__ == "__main__":
    sys.exit(main())
