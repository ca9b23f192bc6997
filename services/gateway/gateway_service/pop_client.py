"""The gateway's way into pop consumption: the Consumer service of the commit log process (consumer.proto),
in the domain's types (mqstore.pop.service's Delivery, AckOutcome, ChangeResult). Every gRPC error
becomes the mqstore exception it came from (mqstore_rpc.remote_errors): FailedPrecondition for a handle
that no longer works, Unavailable when the commit log cannot be reached.

The calls go through the gateway's CommitLogClient (CommitLogClient.consumer_call), so with a replication
group (``--commitlog a:1,b:2,c:3``) they follow the leader: only the leader serves pop consumption, a
replica's NotLeader names it, and an unreachable node makes the next call try the next one.

Thread-safe (the CommitLogClient is).
"""

from __future__ import annotations

from typing import Sequence

from mqstore.filters import TAG
from mqstore.pop.receive import START_LATEST, Delivery, ReceiveResult
from mqstore.pop.service import AckOutcome, ChangeResult
from mqstore.pop.settings import GroupSettings

from mqstore_rpc import convert
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2

_ACK_STATUS = {consumer_pb2.ACK_STATUS_OK: "ok", consumer_pb2.ACK_STATUS_EXPIRED: "expired",
               consumer_pb2.ACK_STATUS_NOT_IN_FLIGHT: "not_in_flight",
               consumer_pb2.ACK_STATUS_INVALID_HANDLE: "invalid"}


class PopClient:
    """mqstore.gateway.consuming.PopPort over gRPC, on the commit log client it is given (whose owner
    closes it)."""

    def __init__(self, log_client: CommitLogClient):
        self._log = log_client

    def receive(self, group: str, topic: str, *, invisible_duration_ms: int, filter_expression: str, batch_size: int,
                long_poll_ms: int, max_attempts: int, start: str, filter_type: str = TAG) -> ReceiveResult:
        request = consumer_pb2.ReceiveRequest(
            group=group, topic=topic, filter_expression=filter_expression,
            filter_type=convert.filter_type_out(filter_type), batch_size=batch_size,
            invisible_duration_ms=invisible_duration_ms, long_poll_ms=long_poll_ms, max_attempts=max_attempts,
            start=consumer_pb2.POP_START_LATEST if start == START_LATEST else consumer_pb2.POP_START_EARLIEST)
        response = self._call("Receive", request, long_poll_ms / 1000)
        return ReceiveResult([Delivery(convert.stored_message_out(m.message), m.topic, m.receipt_handle,
                                       m.delivery_attempt, m.next_visible_time_ms) for m in response.messages],
                             response.pop_time_ms)

    def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[AckOutcome]:
        response = self._call("Ack", consumer_pb2.AckRequest(group=group, topic=topic, receipt_handles=receipt_handles))
        return [AckOutcome(r.receipt_handle, _ACK_STATUS.get(r.status, "invalid"), r.message) for r in response.results]

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str,
                                  invisible_duration_ms: int) -> ChangeResult:
        request = consumer_pb2.ChangeInvisibleDurationRequest(group=group, topic=topic, receipt_handle=receipt_handle,
                                                              invisible_duration_ms=invisible_duration_ms)
        response = self._call("ChangeInvisibleDuration", request)
        return ChangeResult(response.receipt_handle, response.next_visible_time_ms, response.delivery_attempt)

    def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> str:
        request = consumer_pb2.ForwardToDeadLetterRequest(group=group, topic=topic, receipt_handle=receipt_handle)
        return self._call("ForwardToDeadLetter", request).dead_letter_topic

    def group_settings(self, group: str) -> GroupSettings:
        response = self._call("GetGroupSettings", consumer_pb2.GetGroupSettingsRequest(group=group))
        return GroupSettings(response.group, response.ordered)

    def _call(self, method: str, request, extra_timeout_s: float = 0.0):
        return self._log.consumer_call(method, request, extra_timeout_s)
