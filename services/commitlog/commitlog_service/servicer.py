"""CommitLog gRPC servicer: a thin adapter from mqstore.v1 requests to one MessageStore call each.

Each method converts the request (mqstore_rpc.convert), calls one store method and converts the
result. It never catches: mqstore errors become status codes in mqstore_rpc.errors' interceptor. Append is
answered on the port's event loop (an ``async def``: the batch is written there and its waits, the fsync under
SYNC flush and the in-sync replicas under SYNC replication, are awaited, so a waiting append holds no thread and
one fsync wakes every append it covers in one hand-off), and so is GetStoreInfo. Pull, GetMessage and GetMessages
are answered on the loop when the read cannot block (mqstore.hot_reads: pull_at_once, records_at_once:
records in the local log's hot segments, no long poll that must wait, no filter; mqstore_rpc.aio.at_once_when),
and in the handler pool otherwise (an older segment, the tier, a long poll that waits); every other method runs
in the handler pool (mqstore_rpc.aio). bench/README.md, *Append on the event loop* and *Reads on the loop*, has
the figures.

Thread-safe: holds no state of its own beyond the store, which is thread-safe, and GetStoreInfo's last answer
(set and read on the loop only).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import grpc
from mqstore import filters, hot_reads, store_offsets, tailing
from mqstore.access import SERVICE_USER
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.format import record
from mqstore.model import StoreInfo
from mqstore.store import MessageStore
from mqstore.stream_appends import StreamAppends
from mqstore.timer.scheduling import Scheduler
from mqstore_rpc import aio, append_wire, auth, convert
from mqstore_rpc.errors import wire_codec
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

from commitlog_service import read_wire

SERVICE_NAME = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLog"].full_name


class CommitLogServicer(commitlog_pb2_grpc.CommitLogServicer):
    def __init__(self, store: MessageStore, *, scheduler: Scheduler, auth: bool = False):
        """``auth``: authentication is on, so a hold is durable only when the internal identity names it;
        ``scheduler``: the timer's way in (delayed messages, RecallTimer; mqstore.timer.scheduling)."""
        self._store = store
        self._auth = auth
        self._scheduler = scheduler
        self._store_info: tuple[StoreInfo, bytes] | None = None  # GetStoreInfo's last answer, on the loop only

    def _durable_hold(self, context) -> bool:
        """Whether a Tail's retention hold outlives its stream for retention_hold_max_ms (mqstore.retention_holds):
        named by the internal identity, or by anyone with authentication off (every caller is trusted then).
        The interceptor has authenticated the caller and checked ADMIN on the cluster before this runs."""
        if not self._auth:
            return True
        user, _ = auth.parse_credentials(context.invocation_metadata())
        return user == SERVICE_USER

    # ---- topics ----

    def CreateTopic(self, request, context):
        created = self._store.topic_admin.create(request.name, request.queue_count, convert.topic_kind_in(request.kind),
                                           request.retention_ms)
        return convert.topic(created)

    def UpdateTopic(self, request, context):
        retention_ms = request.retention_ms if request.HasField("retention_ms") else None
        return convert.topic(self._store.topic_admin.update(request.name, request.queue_count, retention_ms))

    def DeleteTopic(self, request, context):
        self._store.topic_admin.delete(request.name)
        return commitlog_pb2.DeleteTopicResponse()

    def ListTopics(self, request, context):
        topics = self._store.topic_admin.list(include_system=request.include_system)
        return commitlog_pb2.ListTopicsResponse(topics=[convert.topic(t) for t in topics])

    def DescribeTopic(self, request, context):
        return convert.topic_description(*self._store.topic_admin.describe(request.name))

    # ---- data ----

    # Append and AppendStream take their requests and give their responses through the codec in use
    # (mqstore_rpc.append_wire): the compiled one works on the wire bytes, with no object per field.

    @wire_codec(append_wire.parse_request)
    async def Append(self, request, context):
        results = await self._scheduler.append_async(request.topic, append_wire.messages(request, context.peer()),
                                                     replication=append_wire.replication(request))
        return append_wire.append_response((results,))

    @wire_codec(append_wire.parse_request)
    def AppendStream(self, request_iterator: Iterable, context):
        appends, peer = StreamAppends(self._store, self._scheduler.append), context.peer()
        for request in request_iterator:
            appends.admit(len(request.messages))
            appends.append(request.topic, append_wire.messages(request, peer),
                           replication=append_wire.replication(request))
        return append_wire.append_response(appends.batches)

    # Pull, GetMessage and GetMessages answer with serialized bytes: the compiled codec encodes them from the stored
    # records' bytes (commitlog_service.read_wire), the pure-Python one serializes convert's messages.

    # On the loop when the read cannot block (mqstore.hot_reads: pull_at_once, records_at_once: the hot
    # local log, no long poll that waits, no filter), else in the handler pool (mqstore_rpc.aio.at_once_when).

    def _pull_at_once(self, request) -> bool:
        return hot_reads.pull_at_once(self._store, request.topic, request.queue_id, request.offset,
                                      request.max_messages or 32,
                                      filtered=bool(request.tags or request.filter_expression),
                                      long_poll_ms=request.long_poll_ms)

    def _get_message_at_once(self, request) -> bool:
        locator = request.WhichOneof("locator")
        if locator == "physical_offset":
            return hot_reads.records_at_once(self._store, (request.physical_offset,))
        if locator == "msg_id":
            try:
                return hot_reads.records_at_once(self._store, (record.parse_offset_msg_id(request.msg_id)[2],))
            except ValueError:
                return True  # refused before any read (InvalidArgument)
        return True  # no locator: refused

    def _get_messages_at_once(self, request) -> bool:
        return hot_reads.records_at_once(self._store, request.physical_offsets)

    @wire_codec(commitlog_pb2.PullRequest.FromString)
    @aio.at_once_when("_pull_at_once")
    def Pull(self, request, context):
        args = (request.topic, request.queue_id, request.offset)
        tags, selector = filters.selection(convert.filter_type_in(request.filter_type), request.filter_expression,
                                           list(request.tags))
        limits = dict(max_messages=request.max_messages, max_bytes=request.max_bytes, tags=tags,
                      long_poll_ms=request.long_poll_ms, selector=selector)
        if read_wire.COMPILED:
            return read_wire.pull_response(self._store.pull_raw(*args, **limits))
        return convert.pull_response(self._store.pull(*args, **limits)).SerializeToString()

    @wire_codec(commitlog_pb2.GetMessageRequest.FromString)
    @aio.at_once_when("_get_message_at_once")
    def GetMessage(self, request, context):
        locator = request.WhichOneof("locator")
        raw = read_wire.COMPILED
        if locator == "msg_id":
            found = self._store.get_message_by_id(request.msg_id, raw=raw)
        elif locator == "physical_offset":
            found = (self._store.get_message_raw if raw else self._store.get_message)(request.physical_offset)
        else:
            raise InvalidArgument("locator: set either msg_id or physical_offset")
        answer = read_wire.stored_message(found) if raw else convert.stored_message(found).SerializeToString()
        if locator == "msg_id":
            prefix = read_wire.msg_id_prefix(found) if raw else found.msg_id[:-16]
            answer += _id_from_another_store(request.msg_id, prefix)
        return answer

    @wire_codec(commitlog_pb2.GetMessagesRequest.FromString)
    @aio.at_once_when("_get_messages_at_once")
    def GetMessages(self, request, context):
        offsets = list(request.physical_offsets)
        if read_wire.COMPILED:
            return read_wire.get_messages_response(self._store.get_messages(offsets, raw=True))
        return convert.get_messages_response(self._store.get_messages(offsets)).SerializeToString()

    def Tail(self, request, context) -> Iterator[commitlog_pb2.TailFrame]:
        durable = bool(request.hold_retention_as) and self._durable_hold(context)
        frames = tailing.tail(self._store, convert.tail_start(request.start), request.from_physical_offset,
                              list(request.topics), request.max_frame_bytes, request.heartbeat_ms,
                              is_active=context.is_active,
                              tx_types=[convert.tx_type_in(t) for t in request.transaction_types],
                              hold_retention_as=request.hold_retention_as, linger_ms=request.linger_ms,
                              hold_durable=durable)
        with contextlib.closing(frames):  # a cancelled stream ends its hold now (its grace starts), not at GC
            for frame in frames:
                yield convert.tail_frame(frame)

    def ListRetentionHolds(self, request, context):
        return commitlog_pb2.ListRetentionHoldsResponse(holds=[
            commitlog_pb2.RetentionHold(name=h.name, physical_offset=h.physical_offset, open_streams=h.open_streams,
                                        durable=h.durable, refreshed_ms=h.refreshed_ms, closed_ms=h.closed_ms,
                                        lapses_at_ms=h.lapses_at_ms)
            for h in self._store.retention.list_holds()])

    def GetTierStatus(self, request, context):
        status = self._store.tier_status
        if status is None:
            raise FailedPrecondition("the object storage tier is off on this commit log (no --tier-url)")
        return convert.tier_status(status(with_segments=request.segments))

    # ---- offsets ----

    def GetQueueInfo(self, request, context):
        return convert.queue_info(self._store.queue_info(request.topic, request.queue_id))

    def GetOffsetByTime(self, request, context):
        offset = self._store.offset_by_time(request.topic, request.queue_id, request.timestamp_ms,
                                            convert.time_boundary(request.boundary))
        return commitlog_pb2.GetOffsetByTimeResponse(offset=offset)

    def CommitOffset(self, request, context):
        store_offsets.commit_offset(self._store, request.group, request.topic, request.queue_id, request.offset)
        return commitlog_pb2.CommitOffsetResponse()

    def QueryOffset(self, request, context):
        offset = store_offsets.query_offset(self._store, request.group, request.topic, request.queue_id)
        return commitlog_pb2.QueryOffsetResponse(offset=offset)

    @wire_codec(commitlog_pb2.GetStoreInfoRequest.FromString)
    async def GetStoreInfo(self, request, context):
        """Answered on the loop: every figure is the store's in memory (no file read, no lock held long), so the
        hop to the handler pool and back would cost more than the answer (bench/README.md, *One concurrency
        model*). Pull and GetMessage(s) are too when their records are in the hot local log (above). The answer's
        bytes are made once per change of the figures and sent again while they stay (a poller's calls, or
        several between two appends: bench/README.md, *GetStoreInfo's layer*)."""
        info = self._store.store_info()
        answered = self._store_info
        if answered is None or answered[0] != info:
            answered = self._store_info = (info, convert.store_info(info).SerializeToString())
        return answered[1]

    def RecallTimer(self, request, context):
        return commitlog_pb2.RecallTimerResponse(deliver_at_ms=self._scheduler.recall(request.topic, request.msg_id))


def add_to_server(servicer: CommitLogServicer, server: grpc.Server) -> None:
    commitlog_pb2_grpc.add_CommitLogServicer_to_server(servicer, server)


def _id_from_another_store(msg_id: str, record_prefix: str) -> bytes:
    """StoredMessage.id_store_host, serialized, when the offset message id ``msg_id`` (valid: the store
    read its offset) names another store than the record found there (``record_prefix``, its id's host
    and port); b"" when it names this record's. Appended to the StoredMessage bytes: a serialized field
    after the others is what protobuf writes for it."""
    host, port, _ = record.parse_offset_msg_id(msg_id)
    if record.msg_id_prefix(host, port) == record_prefix.upper():
        return b""
    return common_pb2.StoredMessage(id_store_host=convert.host_text(host, port)).SerializeToString()
