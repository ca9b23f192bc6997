"""Every port's event loop (mqstore_rpc.aio.LoopThread, made by mqstore_rpc.server.ManagedServer) is uvloop's;
``MQSTORE_EVENT_LOOP=asyncio`` gives asyncio's standard loop, and any other value is refused."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import uvloop

from mqstore_rpc import aio
from mqstore_rpc.server import ManagedServer, ServerConfig
from tests.support.waiting import WAIT_S

pytestmark = pytest.mark.integration

SERVICE = "mqstore.test.Loop"


async def _which_loop(request: bytes, context) -> bytes:
    loop = asyncio.get_running_loop()
    return f"{type(loop).__module__}.{type(loop).__qualname__}".encode()


def _served_on() -> tuple[type, str]:
    """The class of a fresh port's loop, and what an async handler of the port saw as its running loop."""
    server = ManagedServer(ServerConfig(port=0, grace_s=0.5))
    handlers = {"Which": grpc.unary_unary_rpc_method_handler(_which_loop)}
    server.grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_service_names([SERVICE])
    server.start()
    try:
        server.mark_serving()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            seen = channel.unary_unary(f"/{SERVICE}/Which")(b"", timeout=WAIT_S).decode()
        return type(server._loop.loop), seen
    finally:
        server.stop()


def test_a_port_runs_on_uvloop_by_default(monkeypatch):
    monkeypatch.delenv(aio.EVENT_LOOP_ENV, raising=False)
    kind, seen = _served_on()
    assert issubclass(kind, uvloop.Loop)
    assert seen == f"{uvloop.Loop.__module__}.{uvloop.Loop.__qualname__}"


def test_mqstore_event_loop_asyncio_gives_the_standard_loop(monkeypatch):
    monkeypatch.setenv(aio.EVENT_LOOP_ENV, "asyncio")
    kind, seen = _served_on()
    assert not issubclass(kind, uvloop.Loop)
    assert issubclass(kind, asyncio.BaseEventLoop)
    assert seen.startswith("asyncio.")


def test_an_unknown_mqstore_event_loop_is_refused(monkeypatch):
    monkeypatch.setenv(aio.EVENT_LOOP_ENV, "tokio")
    with pytest.raises(ValueError, match="MQSTORE_EVENT_LOOP='tokio'"):
        aio.new_event_loop()
