"""The gateway's way into pop consumption: the Consumer service of the commit log process (consumer.proto),
in the domain's types (mqstore.pop.service's Delivery, AckOutcome, ChangeResult). Every gRPC error
becomes the mqstore exception it came from (mqstore_rpc.remote_errors): FailedPrecondition for a handle
that no longer works, Unavailable when the commit log cannot be reached.

Thread-safe (a gRPC channel and stub are).
"""

from __future__ import annotations

from typing import Sequence

import grpc
from mqstore.pop.receive import START_LATEST, Delivery, ReceiveResult
from mqstore.pop.service import AckOutcome, ChangeResult

from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2, consumer_pb2_grpc
from mqstore_rpc.remote_errors import from_rpc_error
from mqstore_rpc.peers import Peers

_ACK_STATUS = {consumer_pb2.ACK_STATUS_OK: "ok", consumer_pb2.ACK_STATUS_EXPIRED: "expired",
               consumer_pb2.ACK_STATUS_NOT_IN_FLIGHT: "not_in_flight",
               consumer_pb2.ACK_STATUS_INVALID_HANDLE: "invalid"}


class PopClient:
    """mqstore.gateway.consuming.PopPort over gRPC. ``close()`` once, after the users have stopped."""

    def __init__(self, address: str, rpc_timeout_s: float, peers: Peers | None = None):
        self._channel = (peers or Peers()).channel(address, [
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 2_000)])
        self._stub = consumer_pb2_grpc.ConsumerStub(self._channel)
        self.address, self.rpc_timeout_s = address, rpc_timeout_s

    def close(self) -> None:
        self._channel.close()

    def receive(self, group: str, topic: str, *, invisible_duration_ms: int, filter_expression: str, batch_size: int,
                long_poll_ms: int, max_attempts: int, start: str) -> ReceiveResult:
        request = consumer_pb2.ReceiveRequest(
            group=group, topic=topic, filter_expression=filter_expression, batch_size=batch_size,
            invisible_duration_ms=invisible_duration_ms, long_poll_ms=long_poll_ms, max_attempts=max_attempts,
            start=consumer_pb2.POP_START_LATEST if start == START_LATEST else consumer_pb2.POP_START_EARLIEST)
        response = self._call(self._stub.Receive, request, long_poll_ms / 1000)
        return ReceiveResult([Delivery(convert.stored_message_out(m.message), m.topic, m.receipt_handle,
                                       m.delivery_attempt, m.next_visible_time_ms) for m in response.messages],
                             response.pop_time_ms)

    def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[AckOutcome]:
        response = self._call(self._stub.Ack, consumer_pb2.AckRequest(group=group, topic=topic,
                                                                      receipt_handles=receipt_handles))
        return [AckOutcome(r.receipt_handle, _ACK_STATUS.get(r.status, "invalid"), r.message) for r in response.results]

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str,
                                  invisible_duration_ms: int) -> ChangeResult:
        request = consumer_pb2.ChangeInvisibleDurationRequest(group=group, topic=topic, receipt_handle=receipt_handle,
                                                              invisible_duration_ms=invisible_duration_ms)
        response = self._call(self._stub.ChangeInvisibleDuration, request)
        return ChangeResult(response.receipt_handle, response.next_visible_time_ms, response.delivery_attempt)

    def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> str:
        request = consumer_pb2.ForwardToDeadLetterRequest(group=group, topic=topic, receipt_handle=receipt_handle)
        return self._call(self._stub.ForwardToDeadLetter, request).dead_letter_topic

    def _call(self, method, request, extra_timeout_s: float = 0.0):
        try:
            return method(request, timeout=self.rpc_timeout_s + extra_timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
