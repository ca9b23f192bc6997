"""The Replication service (replication.proto) and the replica's gRPC link to its leader: adapters between
the stream's protos and mqstore.replication's plain messages. The protocol itself is the domain's
(core/mqstore/replication/README.md).

Thread-safety: the servicer holds the store and the node (both thread-safe); each Replicate call is answered
on the port's event loop, a task of the call reading the replica's acknowledgements. A link's streams are used
by the replica's follower thread, which also runs the call itself (:class:`SingleThreadedCall`: it polls the
call's completion queue and sends the acks; no grpc thread of the synchronous client's); ``cancel()`` may come
from any thread.

The threads, and why each is one:

  thread                        whose            ends
  ----------------------------  ---------------  ----------------------------------------------------------
  replication-watchdog          one replica's    a :class:`~mqstore.background.Duty` (:class:`SilenceWatch`):
                                stream           stopped and joined by the stream's ``cancel()``, which the
                                                 follower always calls (and the stream's own end); a bug in it
                                                 is the link's ``problem()``, so the follower's health
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import AsyncIterator, Iterator

import grpc
import structlog
from google.protobuf.message import DecodeError
from mqstore import defaults, waits
from mqstore.background import Duty
from mqstore.errors import FailedPrecondition, InvalidArgument, Unavailable
from mqstore.replication import epochs, tier_join
from mqstore.replication.leader import ReplicaSession
from mqstore.replication.messages import Ack, Hello, LogData, QueueStart, Welcome
from mqstore.replication.node import ReplicationNode
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as pb, replication_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.remote_errors import from_rpc_error
from mqstore_rpc.tls import ClientTls, open_channel

from commitlog_service.data_link import HEADER, MAX_ACK_FRAME_BYTES, DataConnection, DataPort, read_frame

try:  # grpc's internal call API, for SingleThreadedCall (grpc's own single-threaded unary-stream call uses it)
    from grpc._cython import cygrpc
    from grpc._common import CYGRPC_STATUS_CODE_TO_STATUS_CODE as _STATUS_CODES
except ImportError:  # pragma: no cover (another grpc): the synchronous stream-stream call instead
    cygrpc, _STATUS_CODES = None, {}

log = structlog.get_logger()
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Replication"].full_name
_MAX_MESSAGE_BYTES = defaults.MAX_MESSAGE_BYTES
ACK_READER_JOIN_S = 1.0  # a Replicate handler's wait for its ack reader once the call is over
STATUS_WAIT_S = 1.0  # a replica whose data connection ended waits this long for the call's status, then cancels it
# A channel to a node that was down retries its connection at most this far apart: a restarted node elected
# leader is reached within it (1 s here added up to a second to a failover, issue 34)
RECONNECT_BACKOFF_MAX_MS = 200


def history_out(history: epochs.EpochHistory) -> list[pb.EpochEntry]:
    return [pb.EpochEntry(epoch=e.epoch, start_offset=e.start_offset) for e in history.entries]


def history_in(entries) -> epochs.EpochHistory:
    try:
        return epochs.EpochHistory(tuple(epochs.EpochEntry(e.epoch, e.start_offset) for e in entries))
    except InvalidArgument as exc:
        raise InvalidArgument(f"epochs: {exc}") from None


class ReplicationServicer(replication_pb2_grpc.ReplicationServicer):
    def __init__(self, store, node: ReplicationNode, controller=None, data_port: DataPort | None = None):
        self._store = store
        self._node = node
        self.controller = controller  # mqstore.replication.controller.Controller; None in a static group
        self.data_messages = DataMessages()  # built once for every replica's stream
        self.data_port = data_port  # the streams' data connections (commitlog_service.data_link); None: on gRPC

    def TransferLeadership(self, request, context) -> pb.TransferLeadershipResponse:
        if self.controller is None:
            raise FailedPrecondition("this group has no controller (a static group: --replica-of); restart the "
                                     "nodes with the roles swapped instead")
        timeout_s = (request.timeout_ms or 10_000) / 1000
        return pb.TransferLeadershipResponse(
            handed_over_at_offset=self.controller.transfer(request.target_node_id, timeout_s))

    async def Replicate(self, request_iterator, context) -> AsyncIterator[pb.LeaderMessage]:
        """Answered on the port's event loop: each data message and each acknowledgement is handled there
        (a synchronous handler handed every one between a pool thread and the loop: a leader of two replicas
        spent ~13 us of CPU a SYNC-replicated message so, bench/README.md *The replication benchmark*)."""
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        # off the loop: a welcome from the tier reads every consume queue's entries below the leader's local start
        session = await waits.off_loop(lambda: self._session(first))
        port = self.data_port if first.hello.takes_data_connection else None
        token = port.offer() if port is not None else b""
        try:
            # off the loop too: each part's entries are cut and copied into its message (the first counts every part)
            messages = welcome_messages(session.welcome, paged=session.hello.pages_welcome,
                                        data_address=port.address if port is not None else "", data_token=token)
            while (message := await waits.off_loop(lambda: next(messages, None))) is not None:
                yield message
            if port is not None:
                reader, writer = await port.connection(token, session.hello.replica_id)
                await self._serve_data(session, reader, writer)
                return
        finally:
            if port is not None:
                port.forget(token)
        acks = asyncio.ensure_future(_read_acks(requests, session))
        try:
            async for d in session.data_async():
                yield self.data_messages.get(session.epoch, d)
        finally:
            acks.cancel()
            self.data_messages.log_counts(session.hello.replica_id)

    async def _serve_data(self, session: ReplicaSession, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        """The stream on its data connection (commitlog_service.data_link): its data messages sent, its acks
        read, until either ends (the replica's end: Unavailable, for the call's status) or the call does."""
        acks = asyncio.ensure_future(_read_data_acks(reader, session))
        sending = asyncio.ensure_future(self._send_data(session, writer))
        try:
            done, _ = await asyncio.wait((acks, sending), return_when=asyncio.FIRST_COMPLETED)
            if sending in done:
                sending.result()  # the session's end (or its error, the call's status)
                return
            acks.result()
            raise Unavailable(f"replica {session.hello.replica_id} closed its data connection")
        finally:
            acks.cancel()
            sending.cancel()
            writer.close()
            self.data_messages.log_counts(session.hello.replica_id)

    async def _send_data(self, session: ReplicaSession, writer: asyncio.StreamWriter) -> None:
        pack, get, epoch = HEADER.pack, self.data_messages.get, session.epoch
        async for d in session.data_async():
            message = get(epoch, d)
            if type(message) is not list:  # a heartbeat
                message = [message.SerializeToString()]
            writer.writelines([pack(sum(map(len, message))), *message])  # one writev, the log's bytes not joined
            await writer.drain()

    def _session(self, first) -> ReplicaSession:
        if first is None or first.WhichOneof("kind") != "hello":
            raise InvalidArgument("Replicate: the first message must be a hello")
        h = first.hello
        return ReplicaSession(self._store, self._node, Hello(h.replica_id, h.address, h.end_offset, h.min_offset,
                                                             history_in(h.epochs), h.segment_size_bytes,
                                                             h.reads_tier, h.pages_welcome))

    def GetReplicationState(self, request, context) -> pb.ReplicationState:
        node, lead = self._node, self._node.leadership
        views = node.in_sync.views() if node.is_leader else []
        return pb.ReplicationState(
            node_id=node.config.node_id, role=lead.role, leader_id=lead.leader_id, leader_address=lead.leader_address,
            epoch=lead.epoch, in_sync=sorted(node.in_sync.published()) if node.is_leader else [],
            min_insync_replicas=node.config.min_insync_replicas, end_offset=self._store.log_end(),
            epochs=history_out(node.history), default_replication=node.config.default_replication, fenced=node.fenced,
            replicas=[pb.ReplicaProgress(replica_id=v.replica_id, address=v.address, written_offset=v.written_offset,
                                         flushed_offset=v.flushed_offset, in_sync=v.in_sync, connected=v.connected,
                                         lag_bytes=v.lag_bytes, last_ack_age_ms=v.last_ack_age_ms) for v in views])


def welcome_messages(w: Welcome, paged: bool = True, page_bytes: int | None = None, data_address: str = "",
                     data_token: bytes = b"") -> Iterator[pb.LeaderMessage]:
    """The welcome, then its more parts, made one at a time as the stream takes them: the queues' entries and the
    upload records in parts (mqstore.replication.tier_join.parts; one part unless they outgrow a message). Not
    ``paged`` (a hello without pages_welcome, an earlier version): one message holding all, as that version
    reads it; FailedPrecondition (naming the upgrade) when that is more than gRPC sends. ``data_address``: the
    data connection offered (commitlog_service.data_link), with its token."""
    welcome = pb.LeaderWelcome(leader_id=w.leader_id, epoch=w.epoch, truncate_to=w.truncate_to,
                               epochs=history_out(w.history), start_empty=w.start_empty,
                               data_address=data_address, data_token=data_token)
    if w.tier_min is None:
        yield pb.LeaderMessage(welcome=welcome)
        return
    size = (tier_join.WELCOME_ENTRY_BYTES if page_bytes is None else page_bytes) if paged else None
    welcome.from_tier, welcome.tier_min_offset = True, w.tier_min
    welcome.more_parts = tier_join.part_count(w.queues, w.tier_uploads, size) - 1
    parts = tier_join.parts(w.queues, w.tier_uploads, size)
    queues, uploads = next(parts)
    welcome.queues.extend(_queue_out(q) for q in queues)
    welcome.tier_uploads.extend(uploads)
    message = pb.LeaderMessage(welcome=welcome)
    if not paged and message.ByteSize() > _MAX_MESSAGE_BYTES:  # what gRPC would refuse to send, unexplained
        raise FailedPrecondition(
            f"the welcome of a replica starting from the tier is {message.ByteSize()} bytes "
            f"({len(w.tier_uploads)} upload records), more than one gRPC message ({_MAX_MESSAGE_BYTES}) carries "
            f"to a replica of an earlier version: upgrade it (this version takes the welcome in parts), or copy "
            f"the leader's data directory")
    yield message
    del message, welcome, queues, uploads  # one part held at a time
    for queues, uploads in parts:
        yield pb.LeaderMessage(welcome_part=pb.LeaderWelcomePart(queues=[_queue_out(q) for q in queues],
                                                                 tier_uploads=uploads))


def _queue_out(q: QueueStart) -> pb.TieredQueueStart:
    return pb.TieredQueueStart(topic=q.topic, queue_id=q.queue_id, min_offset=q.min_offset,
                               first_offset=q.first_offset, entries=q.entries, physical_end=q.physical_end)


def _queues_in(queues) -> list[QueueStart]:
    return [QueueStart(q.topic, q.queue_id, q.min_offset, q.first_offset, q.entries, q.physical_end) for q in queues]


def welcome_in(first: pb.LeaderWelcome, parts: list[pb.LeaderWelcomePart]) -> Welcome:
    """The Welcome of a welcome message and its more parts (their queues joined: tier_join.merged; their upload
    records after the welcome's, in order)."""
    pieces, uploads = _queues_in(first.queues), list(first.tier_uploads)
    for part in parts:
        pieces += _queues_in(part.queues)
        uploads += part.tier_uploads
    return Welcome(first.leader_id, first.epoch, first.truncate_to, history_in(first.epochs), first.start_empty,
                   first.tier_min_offset if first.from_tier else None, tier_join.merged(pieces), tuple(uploads))


def _data(d: LogData) -> pb.LeaderMessage:
    return pb.LeaderMessage(data=pb.LogData(offset=d.offset, data=d.data, next_offset=d.next_offset,
                                            leader_end_offset=d.leader_end_offset, committed_offset=d.committed_offset))


def _varint(value: int) -> bytes:
    """A protobuf varint (int64: a negative value as its 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, value: int) -> bytes:
    """A proto3 int64 field (none for 0, the default, as protobuf writes it)."""
    return _varint(number << 3) + _varint(value) if value else b""


def data_message_bytes(d: LogData) -> bytes:
    """``_data(d).SerializeToString()`` written directly: the log's bytes copied once, into the message,
    where building the protobuf copies them and serializing it copies them again (a data message holds up
    to replication_chunk_bytes; tests/unit/replication/test_data_messages.py checks the bytes are equal)."""
    return b"".join(data_message_parts(d))


def data_message_parts(d: LogData) -> list[bytes]:
    """:func:`data_message_bytes` in pieces, the log's bytes one of them as they are: a data connection
    writes them together (writev) without copying the log's bytes into one message first."""
    tail = _field(3, d.next_offset) + _field(4, d.leader_end_offset) + _field(5, d.committed_offset)
    if not d.data:
        head = _field(1, d.offset)
        return [b"\x12" + _varint(len(head) + len(tail)) + head + tail]
    data_key = b"\x12" + _varint(len(d.data))  # LogData.data (field 2)
    head = _field(1, d.offset) + data_key
    # LeaderMessage.data (field 2, length-delimited)
    return [b"\x12" + _varint(len(head) + len(d.data) + len(tail)) + head, d.data, tail]


def leader_message_in(raw: bytes) -> LogData | pb.LeaderMessage:
    """Replicate's response deserializer on the replica: a data message as LogData, its ``data`` a view of
    ``raw`` (protobuf's parse copies the log's bytes, and reading the field copies them again: up to
    replication_chunk_bytes each, ~50 us for 250 KiB); anything else (the welcome, or a data message in a
    shape this does not read: fields repeated at the top, unknown ones) as protobuf parses the LeaderMessage.
    tests/unit/replication/test_data_messages.py holds it to protobuf's parse."""
    found = _log_data_in(raw)
    return found if found is not None else pb.LeaderMessage.FromString(raw)


def _log_data_in(raw: bytes) -> LogData | None:
    """``LeaderMessage.data`` when ``raw`` is that one field, its LogData as protobuf writes it (each field once,
    none at its default), with its ``data`` a view of ``raw``; None otherwise. The fields beside ``data`` are
    parsed by protobuf, from a copy of their few bytes."""
    size = len(raw)
    if size < 2 or raw[0] != 0x12:  # LeaderMessage.data: field 2, length-delimited
        return None
    length, start = _varint_in(raw, 1)
    if length is None or start + length != size:
        return None
    at = start
    while at < size and raw[at] in _VARINT_KEYS:  # the int64 fields before ``data`` (protobuf writes offset there)
        at = _varint_in(raw, at + 1)[1]
    if at < size and raw[at] == 0x12:  # LogData.data
        length, data_at = _varint_in(raw, at + 1)
        if length is None or data_at + length > size:
            return None
        data: bytes | memoryview = memoryview(raw)[data_at:data_at + length]
        rest = raw[start:at] + raw[data_at + length:]
    else:
        data, rest = b"", raw[start:]
    try:
        d = pb.LogData.FromString(rest)
    except DecodeError:
        return None
    if d.data or d.ByteSize() != len(rest):  # a field repeated, or written at its default: protobuf's parse decides
        return None
    return LogData(d.offset, data, d.next_offset, d.leader_end_offset, d.committed_offset)


_VARINT_KEYS = (0x08, 0x18, 0x20, 0x28)  # LogData's int64 fields 1, 3, 4 and 5, varints


def _varint_in(raw: bytes, at: int) -> tuple[int | None, int]:
    """The varint at ``at`` (its low 64 bits, as protobuf keeps for an int64) and the position after it; None
    when it runs past ``raw`` or over 10 bytes."""
    value = shift = 0
    for position in range(at, min(at + 10, len(raw))):
        byte = raw[position]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, position + 1
        shift += 7
    return None, at + 1


class DataMessages:
    """Data messages built and serialized once for every replica's stream (issue 34): the streams of a
    leader's replicas, woken by the same append, send the same range of the log, so the second finds the
    first's bytes here, keyed by (epoch, offset, next_offset), the last KEEP ranges kept. Such a message
    carries the committed and written ends of its first sending: no newer than the log's at the second, so
    a replica shows its readers no more than it would (the next message or heartbeat brings them up to
    date). Heartbeats (no bytes) are built for each stream: they carry the committed end fresh.

    Thread-safe (the synchronous port's streams run on handler threads)."""

    KEEP = 4  # ranges: two replicas' streams a few appends apart; a range is up to replication_chunk_bytes

    def __init__(self):
        self._lock = threading.Lock()
        self._built: dict[tuple[int, int, int], list[bytes]] = {}
        self.built = 0   # data messages serialized
        self.reused = 0  # sent again from here

    def get(self, epoch: int, d: LogData) -> pb.LeaderMessage | list[bytes]:
        """The message for ``d`` as the stream sends it: serialized, in pieces (:func:`data_message_parts`:
        a data connection writes them as they are, add_to_server's serializer joins them) or, for a
        heartbeat, the message."""
        if d.next_offset == d.offset:
            return _data(d)
        key = (epoch, d.offset, d.next_offset)
        with self._lock:
            message = self._built.get(key)
            if message is not None:
                self.reused += 1
                return message
        message = data_message_parts(d)
        with self._lock:
            self.built += 1
            self._built[key] = message
            while len(self._built) > self.KEEP:
                del self._built[next(iter(self._built))]  # the oldest range
        return message

    def log_counts(self, replica_id: str) -> None:
        """At a stream's end: how many data messages the leader's streams built and reused so far."""
        log.info("replication.data_messages_shared", replica=replica_id, built=self.built, reused=self.reused)


def _leader_message_bytes(message: pb.LeaderMessage | list[bytes] | bytes) -> bytes:
    """Replicate's response serializer: a message DataMessages serialized already goes as it is (joined)."""
    if type(message) is list:
        return b"".join(message)
    return message if type(message) is bytes else message.SerializeToString()


async def _read_acks(requests: AsyncIterator, session: ReplicaSession) -> None:
    """The replica's acknowledgements, until its stream ends: a task on the loop, cancelled when the stream's
    handler ends."""
    try:
        async for message in requests:
            if message.WhichOneof("kind") == "ack":
                session.ack(Ack(message.ack.written_offset, message.ack.flushed_offset))
    except (grpc.RpcError, grpc.aio.BaseError) as exc:  # the call ended under it
        log.info("replication.ack_stream_ended", replica=session.hello.replica_id, error=type(exc).__name__)


async def _read_data_acks(reader: asyncio.StreamReader, session: ReplicaSession) -> None:
    """The replica's acknowledgements on its data connection, until it ends."""
    parse, ack = pb.ReplicaMessage.FromString, session.ack
    try:
        while True:
            message = parse(await read_frame(reader, MAX_ACK_FRAME_BYTES))
            if message.WhichOneof("kind") == "ack":
                ack(Ack(message.ack.written_offset, message.ack.flushed_offset))
    except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:  # the connection ended
        log.info("replication.data_connection_ended", replica=session.hello.replica_id, error=type(exc).__name__)
    except (ValueError, DecodeError) as exc:
        log.warning("replication.data_connection_garbled", replica=session.hello.replica_id, error=str(exc))


def add_to_server(servicer: ReplicationServicer, server: grpc.Server) -> None:
    """replication_pb2_grpc.add_ReplicationServicer_to_server's handlers, Replicate's response serializer
    taking DataMessages' bytes too."""
    handlers = {
        "Replicate": grpc.stream_stream_rpc_method_handler(
            servicer.Replicate, request_deserializer=pb.ReplicaMessage.FromString,
            response_serializer=_leader_message_bytes),
        "GetReplicationState": grpc.unary_unary_rpc_method_handler(
            servicer.GetReplicationState, request_deserializer=pb.GetReplicationStateRequest.FromString,
            response_serializer=pb.ReplicationState.SerializeToString),
        "TransferLeadership": grpc.unary_unary_rpc_method_handler(
            servicer.TransferLeadership, request_deserializer=pb.TransferLeadershipRequest.FromString,
            response_serializer=pb.TransferLeadershipResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


# ---- the replica's side ---------------------------------------------------------------------------------

class GrpcReplicationStream:
    """One Replicate call: ``welcome`` once open, iterate for data, ``ack()``, ``cancel()`` (any thread). A
    watchdog cancels the call when the leader sends nothing for ``silence_s`` (its heartbeats stopped: a
    dead connection or a partition), so the follower reconnects instead of waiting for ever; the time between the
    welcome and the first read of data (the replica's own handshake) does not count. ``takes_data``: the stream
    takes a data connection when the leader offers one (commitlog_service.data_link; with ``data_tls``, the
    channel's TLS): data and acks go there, the call ends with the status."""

    def __init__(self, stub, address: str, hello: Hello, silence_s: float, takes_data: bool = False,
                 data_tls: ClientTls | None = None):
        self._address = address
        self._takes_data, self._data_tls = takes_data, data_tls
        self._data: DataConnection | None = None
        self._cancelled = False
        self._data_lock = threading.Lock()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox.put(pb.ReplicaMessage(hello=pb.ReplicaHello(
            replica_id=hello.replica_id, address=hello.address, end_offset=hello.end_offset,
            min_offset=hello.min_offset, epochs=history_out(hello.history),
            segment_size_bytes=hello.segment_size_bytes, reads_tier=hello.reads_tier,
            pages_welcome=hello.pages_welcome, takes_data_connection=takes_data)))
        self._call = stub.Replicate(iter(self._outbox.get, None))
        # the acks: the single-threaded call sends them itself; grpc's synchronous one takes them from the outbox
        self._send = getattr(self._call, "send", self._outbox.put)
        self._last_s = time.monotonic()
        self.watchdog = SilenceWatch(self, address, silence_s)
        self.watchdog.start()
        self.welcome: Welcome | None = None

    def read_welcome(self) -> None:
        """Wait for the leader's welcome (``cancel()`` from another thread ends the wait: Unavailable)."""
        address = self._address
        first = self._next()
        if first is None or type(first) is LogData or first.WhichOneof("kind") != "welcome":
            self.cancel()
            raise Unavailable(f"the leader at {address} did not answer the hello with a welcome")
        parts = []
        for _ in range(first.welcome.more_parts):  # (bounded by the leader's count)
            part = self._next()
            if part is None or part.WhichOneof("kind") != "welcome_part":
                self.cancel()
                raise Unavailable(f"the leader at {address} ended its welcome after {len(parts) + 1} of "
                                  f"{first.welcome.more_parts + 1} parts")
            parts.append(part.welcome_part)
        self.welcome = welcome_in(first.welcome, parts)
        if first.welcome.data_address and self._takes_data:
            self._connect(first.welcome.data_address, first.welcome.data_token)

    def _connect(self, address: str, token: bytes) -> None:
        data = DataConnection(address, token, self._data_tls)  # Unavailable when it cannot
        with self._data_lock:
            self._data, cancelled = data, self._cancelled
        if cancelled:
            data.close()
            raise Unavailable(f"the stream from {self._address} was cancelled while its data connection opened")
        log.info("replication.data_connection", leader=self._address, data_address=address)

    def _next(self):
        try:
            message = next(self._call, None)
        except grpc.RpcError as exc:
            self.cancel()
            if exc.code() == grpc.StatusCode.CANCELLED:
                return None
            raise from_rpc_error(exc, self._address) from None
        if message is None:
            self.cancel()  # the leader ended the stream: its watchdog with it
        self._last_s = time.monotonic()
        return message

    def silent_s(self) -> float:
        return time.monotonic() - self._last_s

    def __iter__(self) -> Iterator[LogData]:
        # the leader's silence counts from here: the replica's own handshake since the welcome (a cut of its log)
        # is not the leader's (a slow cut made the watchdog end the stream, and the replica handshook twice)
        self._last_s = time.monotonic()
        if self._data is not None:
            yield from self._data_messages()
            return
        while (message := self._next()) is not None:
            if type(message) is LogData:  # leader_message_in read it
                yield message
                continue
            d = message.data
            yield LogData(d.offset, d.data, d.next_offset, d.leader_end_offset, d.committed_offset)

    def _data_messages(self) -> Iterator[LogData]:
        """The data connection's messages, then (it ended) the call's status: an error raised as the call's
        (the leader ends both; a call still open STATUS_WAIT_S later is cancelled: an end with nothing to say)."""
        read = self._data.read_frame
        while (frame := read()) is not None:
            self._last_s = time.monotonic()
            message = leader_message_in(frame)
            if type(message) is LogData:
                yield message
                continue
            if message.WhichOneof("kind") != "data":
                self.cancel()
                raise Unavailable(f"the leader at {self._address} sent a {message.WhichOneof('kind')} message on its "
                                  f"data connection; reconnecting")
            d = message.data
            yield LogData(d.offset, d.data, d.next_offset, d.leader_end_offset, d.committed_offset)
        self._data.close()
        timer = threading.Timer(STATUS_WAIT_S, self._call.cancel)
        timer.daemon = True
        timer.start()
        try:
            while self._next() is not None:
                pass  # (nothing more comes on the call but its status)
        finally:
            timer.cancel()

    def ack(self, ack: Ack) -> None:
        message = pb.ReplicaMessage(ack=pb.ReplicaAck(written_offset=ack.written_offset,
                                                      flushed_offset=ack.flushed_offset))
        if self._data is not None:
            self._data.send_frame(message.SerializeToString())  # (an ended connection: its read reports the end)
        else:
            self._send(message)

    def cancel(self) -> None:
        """End the call, its data connection and its watchdog (joined, a bounded wait; from the watchdog itself:
        not joined)."""
        with self._data_lock:
            self._cancelled, data = True, self._data
        if data is not None:
            data.close()
        self._outbox.put(None)
        self._call.cancel()
        self.watchdog.stop(timeout_s=2.0)


class SilenceWatch(Duty):
    """A stream's watchdog: cancels it when the leader has sent nothing for ``silence_s``, looking every
    quarter of that. Started with the stream, stopped by its ``cancel()``."""

    def __init__(self, stream: GrpcReplicationStream, address: str, silence_s: float):
        super().__init__("replication-watchdog", interval_s=silence_s / 4)
        self._stream, self._address, self._silence_s = stream, address, silence_s

    def step(self) -> None:
        if self._stream.silent_s() > self._silence_s:
            log.warning("replication.leader_silent", leader=self._address, silent_s=self._silence_s)
            self._stream.cancel()


class _ReplicateStub:
    """replication_pb2_grpc.ReplicationStub's Replicate, its data messages read by :func:`leader_message_in`:
    grpc's synchronous stream-stream call (a channel thread and a request-consumer thread besides the reader).
    What :class:`GrpcLeaderLink` uses when grpc's internals that :class:`SingleThreadedReplicate` needs are
    missing."""

    def __init__(self, channel: grpc.Channel):
        self.Replicate = channel.stream_stream(f"/{SERVICE_NAME}/Replicate",
                                               request_serializer=pb.ReplicaMessage.SerializeToString,
                                               response_deserializer=leader_message_in)


_REPLICATE_METHOD = f"/{SERVICE_NAME}/Replicate".encode()
_SENT, _RECEIVED, _METADATA, _STATUS = "sent", "received", "metadata", "status"  # the call's batches' tags


class CallEnded(grpc.RpcError):
    """A :class:`SingleThreadedCall`'s status, when not OK (what from_rpc_error reads of an RpcError)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailing


class SingleThreadedCall:
    """One Replicate call run by the thread that reads it (issue 34): that thread polls the call's own
    completion queue for the next data message and sends each ack itself, where grpc's synchronous stream-stream
    call has a channel thread poll for every call and a second thread take the acks from a queue, each data
    message and ack handed between three threads (bench/replication_floor.py measures both).

    Iterate (on the owner: the thread that made the call) for the leader's messages as
    :func:`leader_message_in` reads them: StopIteration at an OK end, :class:`CallEnded` at any other;
    ``send()`` (the owner) a message, once the one before it left (gRPC takes one send at a time);
    ``cancel()`` from any thread; on the owner it also collects what the call still has due, so its queue
    is freed. Only the owner polls the queue: grpc frees it with the call's last batch.

    Built on grpc's internal call API (``grpc._cython.cygrpc``, as grpc's own single-threaded unary-stream
    call is): :func:`single_threaded_stub` checks for it, tests/integration/test_replication.py that this
    grpc has it. The channel's TLS is the call's; its credentials go as the call's metadata."""

    def __init__(self, channel, metadata: tuple, first: pb.ReplicaMessage):
        self._owner = threading.get_ident()
        self._due = {_SENT, _METADATA, _STATUS}  # our batches not completed: while any, the call's queue lives
        self._message: bytes | None = None
        self._status: tuple | None = None
        self._call = channel.segregated_call(
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, _REPLICATE_METHOD, None, None, metadata, None,
            (((cygrpc.SendInitialMetadataOperation(metadata, 0),
               cygrpc.SendMessageOperation(first.SerializeToString(), 0)), _SENT),
             ((cygrpc.ReceiveInitialMetadataOperation(0),), _METADATA),
             ((cygrpc.ReceiveStatusOnClientOperation(0),), _STATUS)),
            cygrpc.build_census_context(), None)

    def _collect(self) -> None:
        """The next completed batch (blocks; the owner only, with something due)."""
        try:
            event = self._call.next_event()
        except BaseException:  # a signal handler's exception (the main thread): grpc freed the call and its queue
            self._due.clear()
            raise
        self._due.discard(event.tag)
        if event.tag is _RECEIVED:
            self._message = event.batch_operations[0].message()
        elif event.tag is _STATUS:
            op = event.batch_operations[0]
            code = _STATUS_CODES.get(op.code(), grpc.StatusCode.UNKNOWN)
            details = op.details()
            details = details.decode(errors="replace") if isinstance(details, bytes) else details
            self._status = (code, details, tuple(op.trailing_metadata() or ()))

    def __iter__(self):
        return self

    def __next__(self):
        if _RECEIVED not in self._due:
            if not self._due or not self._call.operate((cygrpc.ReceiveMessageOperation(0),), _RECEIVED):
                return self._end()
            self._due.add(_RECEIVED)
        while _RECEIVED in self._due:
            self._collect()
        message, self._message = self._message, None
        if message is None:  # the stream is over: its status says how
            return self._end()
        return leader_message_in(message)

    def _end(self):
        while _STATUS in self._due:
            self._collect()
        code, details, trailing = self._status or (grpc.StatusCode.UNKNOWN, "the call ended", ())
        if code is grpc.StatusCode.OK:
            raise StopIteration
        raise CallEnded(code, details, trailing)

    def send(self, message: pb.ReplicaMessage) -> None:
        while _SENT in self._due:
            self._collect()
        if self._status is None and self._call.operate(
                (cygrpc.SendMessageOperation(message.SerializeToString(), 0),), _SENT):
            self._due.add(_SENT)
        # else the call is over: the ack goes nowhere, and the next read reports the end

    def cancel(self) -> None:
        self._call.cancel(cygrpc.StatusCode.cancelled, "Locally cancelled")  # thread-safe; nothing once over
        if threading.get_ident() == self._owner:
            while self._due:  # every batch completes soon once cancelled
                self._collect()


class SingleThreadedReplicate:
    """A stub whose Replicate is a :class:`SingleThreadedCall`: its first request taken from the iterator
    (the hello), later ones through the call's ``send()``."""

    def __init__(self, channel, metadata: tuple):
        self._channel, self._metadata = channel, metadata

    def Replicate(self, request_iterator) -> SingleThreadedCall:
        return SingleThreadedCall(self._channel, self._metadata, next(request_iterator))


def single_threaded_stub(channel: grpc.Channel, metadata: tuple) -> SingleThreadedReplicate | None:
    """A :class:`SingleThreadedReplicate` on ``channel`` (a channel of grpc.insecure_channel or
    grpc.secure_channel, no interceptors); None when this grpc lacks what it needs."""
    raw = getattr(channel, "_channel", None)
    if cygrpc is None or not hasattr(raw, "segregated_call") or not hasattr(cygrpc, "build_census_context"):
        return None
    return SingleThreadedReplicate(raw, metadata)


class GrpcLeaderLink:
    """mqstore.replication.replica.LeaderLink over gRPC: one channel per leader address. Thread-safe."""

    def __init__(self, heartbeat_ms: int, peers: Peers | None = None, single_threaded: bool = True,
                 data_connection: bool = True):
        self._silence_s = max(2.0, 10 * heartbeat_ms / 1000)
        self._peers = peers or Peers()  # the server's TLS and its `service` identity (mqstore_rpc.peers)
        self._single_threaded = single_threaded  # SingleThreadedCall; False: grpc's synchronous call (a benchmark's)
        self._data_connection = data_connection  # take the leader's data connection when it offers one
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._last: GrpcReplicationStream | None = None  # the stream opened last: its watchdog's health
        self._opening: set[GrpcReplicationStream] = set()  # waiting for their welcome

    def open(self, address: str, hello: Hello) -> GrpcReplicationStream:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                # the peers' TLS; their credentials go as each call's metadata (self._stub), not by interceptors
                channel = open_channel(address, self._peers.tls, [
                    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                    ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS)])
                self._channels[address] = channel
        stream = GrpcReplicationStream(self._stub(channel), address, hello, self._silence_s,
                                       self._data_connection, self._peers.tls)
        with self._lock:
            self._last = stream
            self._opening.add(stream)
        try:
            stream.read_welcome()
        except BaseException:  # a welcome it cannot read: the call ends here (its batches collected, the watchdog)
            stream.cancel()
            raise
        finally:
            with self._lock:
                self._opening.discard(stream)
        return stream

    def _stub(self, channel: grpc.Channel) -> SingleThreadedReplicate | _ReplicateStub:
        stub = single_threaded_stub(channel, self._peers.metadata()) if self._single_threaded else None
        if stub is None:
            stub = _ReplicateStub(grpc.intercept_channel(channel, *self._peers.interceptors()))
        return stub

    def cancel_opening(self) -> None:
        """Cancel the streams still waiting for their welcome (a frozen leader never sends it): the follower,
        told of a new leader, goes there now rather than after the silence watchdog."""
        with self._lock:
            opening = list(self._opening)
        for stream in opening:
            stream.cancel()

    def problem(self) -> str:
        """"" while healthy; why not when the last stream's watchdog died of a bug (ReplicaFollower's health)."""
        with self._lock:
            stream = self._last
        return stream.watchdog.problem() if stream is not None else ""

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
