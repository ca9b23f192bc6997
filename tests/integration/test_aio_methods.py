"""How a port finds a call's handler (mqstore_rpc.server): no method is registered with grpc's core, so the
grpc.aio server keeps one pending request for every call instead of one per registered method (and an
``asyncio.wait`` over all of them at every call); the methods the generated ``add_*_to_server`` functions
register are found by one lookup, and each answers as before."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore_rpc import aio
from mqstore_rpc.server import ManagedServer, ServerConfig
from tests.support.waiting import WAIT_S

pytestmark = pytest.mark.integration

SERVICE = "mqstore.test.Methods"


def _pending_requests(server: ManagedServer) -> list[str]:
    """The names of the loop's tasks that wait for grpc's core to hand over a new call."""
    async def names() -> list[str]:
        return [getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks()]
    return [name for name in server._loop.run(names, WAIT_S) if "_request" in name and "call" in name]


def test_registered_methods_are_served_by_one_pending_request():
    server = ManagedServer(ServerConfig(port=0, grace_s=0.5))
    handlers = {f"M{i}": grpc.unary_unary_rpc_method_handler(lambda request, context, i=i: b"%d:" % i + request)
                for i in range(20)}
    handlers["Loop"] = grpc.unary_unary_rpc_method_handler(_on_loop)
    # What a generated add_*_to_server does: the same handlers as a generic handler and as registered methods
    server.grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.grpc_server.add_registered_method_handlers(SERVICE, handlers)
    server.add_service_names([SERVICE])
    server.start()
    try:
        # Health and reflection register 2 methods more: 23 pending requests on grpc's own registration
        assert _pending_requests(server) == ["AioServer._request_call"]
        server.mark_serving()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            for i in (0, 7, 19):
                assert channel.unary_unary(f"/{SERVICE}/M{i}")(b"x", timeout=WAIT_S) == b"%d:x" % i
            assert channel.unary_unary(f"/{SERVICE}/Loop")(b"y", timeout=WAIT_S) == b"loop:y"
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE),
                                                               timeout=WAIT_S)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(f"/{SERVICE}/Missing")(b"", timeout=WAIT_S)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert _pending_requests(server) == ["AioServer._request_call"]
    finally:
        server.stop()


async def _on_loop(request: bytes, context) -> bytes:
    return b"loop:" + request


class Marked:
    """A servicer with a method the port answers on the loop when ``_small`` says so (mqstore_rpc.aio.at_once_when)."""

    def _small(self, request: bytes) -> bool:
        return len(request) < 4

    @aio.at_once_when("_small")
    def Where(self, request: bytes, context) -> bytes:
        return threading.current_thread().name.encode()


@aio.at_once_when("_small")
def _unbound(request: bytes, context) -> bytes:
    return threading.current_thread().name.encode()


def test_a_method_marked_at_once_when_runs_on_the_loop_only_when_its_check_says_so():
    server = ManagedServer(ServerConfig(port=0, grace_s=0.5))
    server.grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Where": grpc.unary_unary_rpc_method_handler(Marked().Where),
        "Unbound": grpc.unary_unary_rpc_method_handler(_unbound)}),))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            where = channel.unary_unary(f"/{SERVICE}/Where")
            assert where(b"x", timeout=WAIT_S) == b"grpc-aio-loop"
            assert where(b"long", timeout=WAIT_S).startswith(b"grpc-handler")
            # No servicer to ask (not a bound method): the pool, as an unmarked handler
            assert channel.unary_unary(f"/{SERVICE}/Unbound")(b"x", timeout=WAIT_S).startswith(b"grpc-handler")
    finally:
        server.stop()
