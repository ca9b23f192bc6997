"""Synchronous streaming handlers on a grpc.aio server (mqstore_rpc.aio, ``_driven_stream``): the CommitLog's
Tail and replica streams, the Transaction ports' CheckBack. Each runs on one handler-pool thread and its
responses are sent from the loop; when the client cancels, the thread closes the handler after the step it is
in and goes back to the pool (grpc's own hand-off would block it until the server stops). Errors and aborts
end the call with their status; request streams are read through the loop."""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import pytest

from mqstore.errors import InvalidArgument
from mqstore_rpc.server import ManagedServer, ServerConfig
from tests.support.waiting import WAIT_S, wait_until

pytestmark = pytest.mark.integration

SERVICE = "mqstore.test.SyncStreams"
WORKERS = 2  # fewer threads than the streams each test cancels: a thread that is not given back stops the server


class Handlers:
    """Raw-bytes handlers that count the streams whose generators were closed (their ``finally`` ran)."""

    def __init__(self) -> None:
        self.closed = 0
        self.lock = threading.Lock()
        self.slow_threads: list[str] = []
        self.release = threading.Event()

    def _closed(self) -> None:
        with self.lock:
            self.closed += 1

    def forever(self, request: bytes, context):
        """A response every few ms, never asking whether the call is still on: only the driver can end it."""
        try:
            while True:
                yield b"x"
                time.sleep(0.005)
        finally:
            self._closed()

    def fails(self, request: bytes, context):
        yield b"first"
        raise InvalidArgument("the start offset is past the end; start at 0")

    def aborts(self, request: bytes, context):
        yield b"first"
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now")

    def echo(self, requests, context):
        try:
            for request in requests:
                yield b"echo:" + request
        finally:
            self._closed()

    def ping(self, request: bytes, context) -> bytes:
        return b"pong"

    def slow(self, request: bytes, context) -> bytes:
        """Holds its thread until ``release`` is set (bounded): the pool's threads, all taken."""
        with self.lock:
            self.slow_threads.append(threading.current_thread().name)
        return b"done" if self.release.wait(WAIT_S) else b"timed out"

    async def quick(self, request: bytes, context) -> bytes:
        return threading.current_thread().name.encode()


@contextlib.contextmanager
def serving():
    handlers = Handlers()
    server = ManagedServer(ServerConfig(port=0, max_workers=WORKERS, grace_s=0.5))
    server.grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Forever": grpc.unary_stream_rpc_method_handler(handlers.forever),
        "Fails": grpc.unary_stream_rpc_method_handler(handlers.fails),
        "Aborts": grpc.unary_stream_rpc_method_handler(handlers.aborts),
        "Echo": grpc.stream_stream_rpc_method_handler(handlers.echo),
        "Ping": grpc.unary_unary_rpc_method_handler(handlers.ping),
        "Slow": grpc.unary_unary_rpc_method_handler(handlers.slow),
        "Quick": grpc.unary_unary_rpc_method_handler(handlers.quick),
    }),))
    assert isinstance(server.grpc_server, grpc.aio.Server)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield handlers, channel
    finally:
        handlers.release.set()
        server.stop()


def _call(channel: grpc.Channel, method: str, streaming_requests: bool = False):
    make = channel.stream_stream if streaming_requests else channel.unary_stream
    return make(f"/{SERVICE}/{method}")


def test_cancelled_streams_give_their_threads_back():
    with serving() as (handlers, channel):
        for n in range(1, 2 * WORKERS + 2):
            call = _call(channel, "Forever")(b"", timeout=WAIT_S)
            assert next(call) == b"x"
            call.cancel()
            wait_until(lambda n=n: handlers.closed == n, what=f"the handler of cancelled stream {n} closed")
        # Every thread is back: a synchronous unary call and a new stream are served.
        assert channel.unary_unary(f"/{SERVICE}/Ping")(b"", timeout=WAIT_S) == b"pong"
        call = _call(channel, "Forever")(b"", timeout=WAIT_S)
        assert [next(call) for _ in range(3)] == [b"x"] * 3
        call.cancel()


def test_an_error_after_a_response_ends_the_stream_with_its_status():
    with serving() as (_, channel):
        call = _call(channel, "Fails")(b"", timeout=WAIT_S)
        assert next(call) == b"first"
        with pytest.raises(grpc.RpcError) as info:
            next(call)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "the start offset is past the end; start at 0"
        assert ("mqstore-error", "InvalidArgument") in info.value.trailing_metadata()
        call = _call(channel, "Aborts")(b"", timeout=WAIT_S)
        assert next(call) == b"first"
        with pytest.raises(grpc.RpcError) as info:
            next(call)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "not now")
        assert channel.unary_unary(f"/{SERVICE}/Ping")(b"", timeout=WAIT_S) == b"pong"  # still serving


def test_a_request_stream_is_read_through_the_loop_and_a_cancel_ends_its_read():
    with serving() as (handlers, channel):
        assert list(_call(channel, "Echo", True)(iter([b"a", b"b", b"c"]), timeout=WAIT_S)) == \
            [b"echo:a", b"echo:b", b"echo:c"]
        wait_until(lambda: handlers.closed == 1, what="the finished stream's handler closed")
        for n in range(2, 2 * WORKERS + 3):  # each handler is blocked reading its next request when cancelled
            more = threading.Event()

            def requests(more=more):
                yield b"one"
                more.wait(WAIT_S)

            call = _call(channel, "Echo", True)(requests(), timeout=WAIT_S)
            assert next(call) == b"echo:one"
            call.cancel()
            more.set()
            wait_until(lambda n=n: handlers.closed == n, what=f"the handler of cancelled stream {n} closed")
        assert channel.unary_unary(f"/{SERVICE}/Ping")(b"", timeout=WAIT_S) == b"pong"


def test_stop_ends_open_streams():
    with serving() as (handlers, channel):
        calls = [_call(channel, "Forever")(b"", timeout=WAIT_S) for _ in range(WORKERS)]
        for call in calls:
            assert next(call) == b"x"
    # serving() stopped the server with both streams open: their handlers were closed and the stop returned.
    wait_until(lambda: handlers.closed == WORKERS, what="the open streams' handlers closed by the stop")


def test_synchronous_calls_run_in_the_pool_while_the_loop_answers():
    """Every port is a grpc.aio server: a synchronous handler runs on a thread of the handler pool, so that with
    every thread of the pool held by one, an async handler is still answered on the loop at once."""
    with serving() as (handlers, channel):
        slow = [channel.unary_unary(f"/{SERVICE}/Slow").future(b"", timeout=WAIT_S) for _ in range(WORKERS)]
        wait_until(lambda: len(handlers.slow_threads) == WORKERS, what="every pool thread in a slow call")
        assert channel.unary_unary(f"/{SERVICE}/Quick")(b"", timeout=WAIT_S) == b"grpc-aio-loop"
        assert not any(call.done() for call in slow)  # answered while each slow call still held its thread
        assert all(name.startswith("grpc-handler") for name in handlers.slow_threads), handlers.slow_threads
        handlers.release.set()
        assert [call.result(timeout=WAIT_S) for call in slow] == [b"done"] * WORKERS
