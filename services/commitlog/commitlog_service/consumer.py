"""The Consumer servicer (consumer.proto): pop consumption, a thin adapter onto mqstore.pop.PopService in
the commit log process. Each method converts the request, calls one PopService method and converts the
result; errors become status codes in mqstore_rpc.errors' interceptor. Receive answers with the response's
bytes (commitlog_service.read_wire: the compiled codec writes them from the records pop decoded).

Receive and Ack are answered on the port's event loop when they cannot wait (mqstore.pop.at_once: one node with
ASYNC flush, reads of the hot local files, no filter; mqstore_rpc.aio.at_once_when), in the handler pool
otherwise; a Receive on the loop never long-polls there (nothing found: again in the pool, aio.InPool).

In a replication group only the leader runs pop consumption (mqstore.pop.leadership): ``current()`` gives
the running PopService or raises NotLeader (FAILED_PRECONDITION with the leader in the trailer
``mqstore-leader``, as a write to a replica) or Unavailable (a new leader rebuilding its in-flight set).

Thread-safe: holds ``current`` (thread-safe) only.
"""

from __future__ import annotations

from typing import Callable

import grpc
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore.pop import at_once, receive, service as pop
from mqstore.pop.stats import PopStatsView, pop_stats
from mqstore_rpc import aio, convert
from mqstore_rpc.errors import wire_codec
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2, consumer_pb2, consumer_pb2_grpc

from commitlog_service import read_wire

CONSUMER_SERVICE_NAME = consumer_pb2.DESCRIPTOR.services_by_name["Consumer"].full_name

_START = {consumer_pb2.POP_START_EARLIEST: receive.START_EARLIEST,
          consumer_pb2.POP_START_LATEST: receive.START_LATEST}
_ACK_STATUS = {"ok": consumer_pb2.ACK_STATUS_OK, "expired": consumer_pb2.ACK_STATUS_EXPIRED,
               "not_in_flight": consumer_pb2.ACK_STATUS_NOT_IN_FLIGHT,
               "invalid": consumer_pb2.ACK_STATUS_INVALID_HANDLE}
_DURABILITY = {"": common_pb2.DURABILITY_UNSPECIFIED, "WRITTEN": common_pb2.DURABILITY_WRITTEN,
               "FLUSHED": common_pb2.DURABILITY_FLUSHED}


class ConsumerServicer(consumer_pb2_grpc.ConsumerServicer):
    def __init__(self, current: Callable[[], pop.PopService]):
        self._current = current

    def _receive_at_once(self, request) -> bool:
        try:
            current = self._current()
            filter_type = convert.filter_type_in(request.filter_type)
        except MqStoreError:
            return True  # refused before any work (NotLeader, Unavailable, InvalidArgument)
        return at_once.receive_at_once(
            current, request.group, request.topic, queue_id=request.queue_id if request.HasField("queue_id") else None,
            filter_type=filter_type, filter_expression=request.filter_expression, batch_size=request.batch_size,
            long_poll_ms=request.long_poll_ms)

    def _ack_at_once(self, request) -> bool:
        try:
            return at_once.ack_at_once(self._current(), len(request.receipt_handles))
        except MqStoreError:
            return True  # refused before any work

    @wire_codec(consumer_pb2.ReceiveRequest.FromString)
    @aio.at_once_when("_receive_at_once")
    def Receive(self, request, context):
        remaining_s = context.time_remaining()
        on_loop = aio.on_the_loop()  # then it never waits there: no long poll
        result = self._current().receive(
            request.group, request.topic, invisible_duration_ms=request.invisible_duration_ms,
            queue_id=request.queue_id if request.HasField("queue_id") else None,
            filter_expression=request.filter_expression, filter_type=convert.filter_type_in(request.filter_type),
            batch_size=request.batch_size,
            long_poll_ms=0 if on_loop else request.long_poll_ms, max_attempts=request.max_attempts,
            start=_start(request.start), max_bytes=request.max_bytes,
            time_left_ms=None if remaining_s is None else int(remaining_s * 1000))
        if on_loop and not result.deliveries and request.long_poll_ms > 0:
            raise aio.InPool  # nothing after all: the long poll waits on a thread
        return read_wire.receive_response(result.deliveries, result.pop_time_ms)

    @aio.at_once_when("_ack_at_once")
    def Ack(self, request, context):
        result = self._current().ack(request.group, request.topic, list(request.receipt_handles))
        return consumer_pb2.AckResponse(
            results=[consumer_pb2.AckResult(receipt_handle=o.receipt_handle, status=_ACK_STATUS[o.status],
                                            message=o.message) for o in result.outcomes],
            durability=_DURABILITY[result.durability])

    def ChangeInvisibleDuration(self, request, context):
        changed = self._current().change_invisible_duration(request.group, request.topic, request.receipt_handle,
                                                      request.invisible_duration_ms)
        return consumer_pb2.ChangeInvisibleDurationResponse(receipt_handle=changed.receipt_handle,
                                                            next_visible_time_ms=changed.visible_at_ms,
                                                            delivery_attempt=changed.attempt)

    def ForwardToDeadLetter(self, request, context):
        dlq, result = self._current().forward_to_dead_letter(request.group, request.topic, request.receipt_handle)
        return consumer_pb2.ForwardToDeadLetterResponse(dead_letter_topic=dlq, result=_append_result(result))

    def Stats(self, request, context):
        return _stats(pop_stats(self._current(), request.group, request.topic))

    def GetGroupSettings(self, request, context):
        return _settings(self._current().group_settings(request.group))

    def SetGroupSettings(self, request, context):
        return _settings(self._current().set_group_settings(request.group, ordered=request.ordered))


def _settings(settings) -> consumer_pb2.GroupSettings:
    return consumer_pb2.GroupSettings(group=settings.group, ordered=settings.ordered)


def _start(value: int) -> str:
    try:
        return _START[value]
    except KeyError:
        raise InvalidArgument(f"start: {value} is not a PopStart (EARLIEST = 0, LATEST = 1)") from None


def _append_result(r) -> commitlog_pb2.AppendResult:
    return commitlog_pb2.AppendResult(msg_id=r.msg_id, uniq_key=r.uniq_key, queue_id=r.queue_id,
                                      queue_offset=r.queue_offset, physical_offset=r.physical_offset,
                                      size_bytes=r.size_bytes, store_timestamp_ms=r.store_timestamp_ms,
                                      durability=_DURABILITY[r.durability])


def _stats(view: PopStatsView) -> consumer_pb2.PopStats:
    c = view.counts
    return consumer_pb2.PopStats(
        received=c.received, acked=c.acked, ack_failures=c.ack_failures, changed_invisible=c.changed_invisible,
        revived=c.revived, dead_lettered=c.dead_lettered, filtered=c.filtered, damaged_skipped=c.damaged_skipped,
        lost=c.lost, in_flight=view.in_flight, revive_offset=view.revive_offset, revive_log_end=view.revive_log_end,
        queues=[consumer_pb2.PopQueueState(topic=q.topic, queue_id=q.queue_id, pop_offset=q.pop_offset,
                                           max_offset=q.max_offset, in_flight=q.in_flight) for q in view.queues],
        group_in_flight=view.group_in_flight)


def add_to_server(servicer: ConsumerServicer, server: grpc.Server) -> None:
    consumer_pb2_grpc.add_ConsumerServicer_to_server(servicer, server)
