"""The gRPC adapter to the CommitLog service: implements ports.CommitLogReader.

Every call has a timeout; every gRPC error becomes an mqstore exception (mqstore_rpc.remote_errors),
so the follower and the lookup see ``Unavailable`` / ``OutOfRange`` / ``NotFound`` and never grpc.

A Tail stream carries a deadline (``stream_deadline_s``): when it expires the stream just ends and the
follower re-opens it at its resume offset. That bounds how long a silently dead connection (no RST,
no heartbeats) can hold the follower, without keepalive pings the server would have to allow.
The channel retries connections quickly (50 ms doubling to ``max_reconnect_backoff_ms``), so a
restarted commit log is found again within that bound rather than gRPC's default of up to 2 minutes.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import grpc
from mqstore.errors import NotFound, OutOfRange
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from mqstore_rpc.remote_errors import from_rpc_error

from .ports import FetchedMessage, Frame

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class _GrpcTail:
    """One Tail call. Iterate once; ``cancel()`` from any thread ends it. A deadline that expires
    ends the iteration cleanly (the caller re-opens); other errors raise mqstore exceptions."""

    def __init__(self, call, peer: str):
        self._call = call
        self._peer = peer

    def __iter__(self) -> Iterator[Frame]:
        try:
            for f in self._call:
                yield Frame(f.records, f.record_count, f.next_physical_offset, f.log_end_physical_offset)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return  # the planned end of this stream (see the module docstring)
            raise from_rpc_error(exc, self._peer) from None

    def cancel(self) -> None:
        self._call.cancel()


class CommitLogClient:
    """Thread-safe (a gRPC channel and stub are). ``close()`` once, after the users have stopped."""

    def __init__(self, address: str, *, rpc_timeout_s: float = 10.0, stream_deadline_s: float = 60.0,
                 fetch_window: int = 64, max_reconnect_backoff_ms: int = 2_000):
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self.stream_deadline_s = stream_deadline_s
        self.fetch_window = fetch_window
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 50),
                   ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms)]
        self._channel = grpc.insecure_channel(address, options=options)
        self._stub = commitlog_pb2_grpc.CommitLogStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int) -> _GrpcTail:
        if from_physical_offset is None:
            request = commitlog_pb2.TailRequest(start=commitlog_pb2.TAIL_START_EARLIEST)
        else:
            request = commitlog_pb2.TailRequest(start=commitlog_pb2.TAIL_START_AT_OFFSET,
                                                from_physical_offset=from_physical_offset)
        request.max_frame_bytes = max_frame_bytes
        request.heartbeat_ms = heartbeat_ms
        return _GrpcTail(self._stub.Tail(request, timeout=self.stream_deadline_s), self.address)

    def min_physical_offset(self) -> int:
        try:
            info = self._stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
        return info.min_physical_offset

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        request = commitlog_pb2.GetOffsetByTimeRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms,
                                                       boundary=commitlog_pb2.TIME_BOUNDARY_LOWER)
        try:
            return self._stub.GetOffsetByTime(request, timeout=self.rpc_timeout_s).offset
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None

    def fetch(self, physical_offsets: Sequence[int]) -> list[FetchedMessage | None]:
        """GetMessage for each offset, ``fetch_window`` calls in flight at a time."""
        out: list[FetchedMessage | None] = []
        for first in range(0, len(physical_offsets), self.fetch_window):
            calls = [self._stub.GetMessage.future(commitlog_pb2.GetMessageRequest(physical_offset=offset),
                                                  timeout=self.rpc_timeout_s)
                     for offset in physical_offsets[first:first + self.fetch_window]]
            try:
                out.extend(self._result(call) for call in calls)
            finally:
                for call in calls:
                    call.cancel()  # a no-op for finished calls; stops the rest after an error
        return out

    def _result(self, call) -> FetchedMessage | None:
        try:
            m = call.result()
        except grpc.RpcError as exc:
            error = from_rpc_error(exc, self.address)
            if isinstance(error, (NotFound, OutOfRange)):
                return None  # retention removed the record since it was indexed
            raise error from None
        return FetchedMessage(m.physical_offset, m.topic, tuple(p for k in m.keys for p in k.split(" ") if p),
                              m.uniq_key, m.store_timestamp_ms, m.queue_id, m.queue_offset, m.msg_id,
                              m.size_bytes, m)
