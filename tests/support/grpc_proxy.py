"""A gRPC proxy in front of a real server, for faults that a real process cannot be made to show on cue:
an answer lost after the server did the work, an answer that comes after the caller's deadline, a request
lost before the server saw it. Every call is forwarded byte for byte (metadata included), unary calls,
server streams (Tail) and CommitLogInternal's lock-step streams (a response per request); a fault is
armed per method for the next calls (for a lock-step stream: its next requests). ``hold_streams()`` stops passing
stream messages on (a follower that lags: it sees nothing new) until ``release_streams()``.

  fault            what the caller sees                         what the server did
  ---------------- -------------------------------------------- ------------------------------------
  "answer_lost"    UNAVAILABLE                                  the call, completely
  "past_deadline"  DEADLINE_EXCEEDED (the proxy answers only    the call, completely
                   once the caller has given up)
  "request_lost"   UNAVAILABLE                                  nothing

Binds 127.0.0.1 port 0; ``stop()`` ends it (use it as a context manager).
"""

from __future__ import annotations

import queue
import threading
from concurrent import futures

import grpc

_IDENTITY = dict(request_deserializer=None, response_serializer=None)


class FaultyProxy:
    """Thread-safe: ``arm`` and ``hits`` take ``_lock``."""

    def __init__(self, target: str):
        self.target = target
        self._channel = grpc.insecure_channel(target)
        self._lock = threading.Lock()
        self._faults: dict[str, list[str]] = {}
        self.hits: list[tuple[str, str]] = []   # (method, fault) of every fault applied, in order
        self._streams_open = threading.Event()
        self._streams_open.set()
        self._server = grpc.server(futures.ThreadPoolExecutor(32, thread_name_prefix="test-proxy"))
        self._server.add_generic_rpc_handlers([_Handler(self)])
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, method: str, *faults: str) -> None:
        """``method`` as "/mqstore.v1.CommitLogInternal/Append"; the next calls of it get ``faults`` in order."""
        with self._lock:
            self._faults.setdefault(method, []).extend(faults)

    def hold_streams(self) -> None:
        self._streams_open.clear()

    def release_streams(self) -> None:
        self._streams_open.set()

    def _take(self, method: str) -> str:
        with self._lock:
            pending = self._faults.get(method)
            fault = pending.pop(0) if pending else ""
            if fault:
                self.hits.append((method, fault))
            return fault

    def stop(self) -> None:
        self._streams_open.set()
        self._server.stop(0).wait(10)
        self._channel.close()

    def __enter__(self) -> "FaultyProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- forwarding ------------------------------------------------------------------------------------
    def unary(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        fault = self._take(method)
        if fault == "request_lost":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected by the test proxy: the request was lost")
        call = self._channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            response = call(request, metadata=context.invocation_metadata(), timeout=_remaining(context))
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details())
        if fault == "answer_lost":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected by the test proxy: the answer was lost")
        if fault == "past_deadline":
            gone = threading.Event()
            context.add_callback(gone.set)  # runs when the caller's deadline ends the call
            if not gone.wait(60):
                raise AssertionError("past_deadline: the caller set no deadline")
        return response

    def stream(self, method: str, request: bytes, context: grpc.ServicerContext):
        call = self._channel.unary_stream(method, request_serializer=None, response_deserializer=None)(
            request, metadata=context.invocation_metadata(), timeout=_remaining(context))
        context.add_callback(call.cancel)
        try:
            for message in call:
                while not self._streams_open.wait(0.1):
                    if not context.is_active():
                        return
                yield message
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                context.abort(exc.code(), exc.details())


    def lockstep(self, method: str, requests, context: grpc.ServicerContext):
        """A bidirectional stream whose every request is answered by one response in order
        (AppendBatchesStream), forwarded one request at a time; a fault armed for ``method`` applies to
        the next request: "request_lost" ends the stream before forwarding it, "answer_lost" after the
        server answered it, "past_deadline" holds that answer until the caller gives up (cancels)."""
        outbox: queue.Queue = queue.Queue()
        call = self._channel.stream_stream(method, request_serializer=None, response_deserializer=None)(
            iter(outbox.get, None), metadata=context.invocation_metadata())
        context.add_callback(call.cancel)
        try:
            for request in requests:
                fault = self._take(method)
                if fault == "request_lost":
                    context.abort(grpc.StatusCode.UNAVAILABLE, "injected by the test proxy: the request was lost")
                outbox.put(request)
                response = next(call)
                if fault == "answer_lost":
                    context.abort(grpc.StatusCode.UNAVAILABLE, "injected by the test proxy: the answer was lost")
                if fault == "past_deadline":
                    gone = threading.Event()
                    context.add_callback(gone.set)  # runs when the caller cancels the stream
                    if not gone.wait(60):
                        raise AssertionError("past_deadline: the caller never gave up")
                    return
                yield response
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                context.abort(exc.code(), exc.details())
        except StopIteration:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the server ended the stream without answering")
        finally:
            outbox.put(None)


def _remaining(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e6 else max(remaining, 0.001)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: FaultyProxy):
        self.proxy = proxy

    def service(self, handler_call_details):
        method = handler_call_details.method
        if method.endswith("Stream") and "CommitLogInternal" in method:
            return grpc.stream_stream_rpc_method_handler(
                lambda requests, context: self.proxy.lockstep(method, requests, context), **_IDENTITY)
        if method.endswith("/Tail"):
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: self.proxy.stream(method, request, context), **_IDENTITY)
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self.proxy.unary(method, request, context), **_IDENTITY)
