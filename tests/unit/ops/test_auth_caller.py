"""mqstore_rpc.auth.current_caller: the authenticated caller is known to the servicer in every kind of
handler (a unary call, each step of a response stream, async on the loop and synchronous in the handler pool
through mqstore_rpc.aio), never outside the call, and its own refusals are the interceptor's (logged, counted,
marked as the caller's denial)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import grpc
import pytest

from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.authority import Authority
from mqstore.clock import SystemClock
from mqstore.errors import PermissionDenied
from mqstore.meta.auth import AuthStore
from mqstore.metrics import Registry
from mqstore_rpc import aio, auth
from mqstore_rpc.permissions import Need

METHOD = "/test.Service/Call"


class Context:
    def invocation_metadata(self):
        return ((auth.METADATA_KEY, auth.token("ann", "ann-secret-1")),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def add_done_callback(self, callback) -> None:  # the call never ends here
        pass


@pytest.fixture
def interceptor(tmp_path):
    store = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    AccessAdmin(store).create_user("ann", access.NORMAL, "ann-secret-1")
    yield auth.AuthInterceptor(Authority(store), Registry(), {METHOD: Need(access.PUB, lambda request: ())})
    store.close()


def wrapped(interceptor: auth.AuthInterceptor, handler: grpc.RpcMethodHandler):
    return interceptor._wrap(handler, METHOD)


@pytest.fixture
def pool():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a stream holds one thread; the test's checks the other
        yield pool


def test_a_synchronous_unary_call_and_each_step_of_a_stream_know_their_caller(interceptor, pool):
    """A synchronous handler runs in the pool (mqstore_rpc.aio.on_loop), each step of its stream seeing the caller
    the loop's guard set for it; the pool's thread does not keep it between steps nor after."""
    unary = wrapped(interceptor, aio.on_loop(grpc.unary_unary_rpc_method_handler(
        lambda request, context: auth.caller_name()), pool))
    between: list = []

    def steps(request, context):
        yield auth.caller_name()
        yield auth.caller_name()
    stream = wrapped(interceptor, aio.on_loop(grpc.unary_stream_rpc_method_handler(steps), pool))

    async def run():
        answered = await unary.unary_unary(b"", Context())
        responses = stream.unary_stream(b"", Context())
        streamed = [await anext(responses)]
        between.append(await asyncio.get_running_loop().run_in_executor(pool, auth.caller_name))
        streamed += [a async for a in responses]
        return answered, streamed
    assert asyncio.run(run()) == ("ann", ["ann", "ann"])
    assert between == [None]  # between steps, on a pool thread, the caller is not set
    assert pool.submit(auth.current_caller).result() is None and auth.current_caller() is None


def test_a_call_on_a_loop_knows_its_caller(interceptor):
    async def unary(request, context):
        return auth.caller_name()

    async def steps(request, context):
        yield auth.caller_name()
        yield auth.current_caller().name

    async def run():
        answered = await wrapped(interceptor, grpc.unary_unary_rpc_method_handler(unary)).unary_unary(b"", Context())
        streamed = [a async for a in wrapped(interceptor, grpc.unary_stream_rpc_method_handler(steps)).unary_stream(
            b"", Context())]
        return answered, streamed
    assert asyncio.run(run()) == ("ann", ["ann", "ann"])


def test_a_servicers_refusal_is_the_callers_denial(interceptor, pool):
    def call(request, context):
        caller = auth.current_caller()
        assert not caller.allowed(access.ADMIN, access.CLUSTER_RESOURCE)
        caller.refuse(PermissionDenied("not yours: use your own id"))
    handler = wrapped(interceptor, aio.on_loop(grpc.unary_unary_rpc_method_handler(call), pool))
    with pytest.raises(PermissionDenied, match="not yours") as caught:
        asyncio.run(handler.unary_unary(b"", Context()))
    assert auth.is_denial(caught.value) and not auth.is_denial(PermissionDenied("from a service we called"))


class As(Context):
    """A call carrying ``user``'s credentials."""

    def __init__(self, user: str, secret: str):
        self._metadata = ((auth.METADATA_KEY, auth.token(user, secret)),)

    def invocation_metadata(self):
        return self._metadata


def test_two_tenants_at_once_in_the_pool_each_see_their_own_caller(tmp_path):
    """Another tenant's call running in the pool at the same moment never lends its caller to this one: each
    synchronous body, run while the other is in flight on the other pool thread, sees the user its own call
    authenticated (the caller travels with the call's context, not with a thread)."""
    store = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    try:
        admin = AccessAdmin(store)
        admin.create_user("ann", access.NORMAL, "ann-secret-1")
        admin.create_user("bob", access.NORMAL, "bob-secret-1")
        interceptor = auth.AuthInterceptor(Authority(store), Registry(), {METHOD: Need(access.PUB, lambda r: ())})
        both_in = threading.Barrier(2, timeout=30)

        def body(request, context):
            before = auth.caller_name()
            both_in.wait()  # the other tenant's call is in the pool now too
            return before, auth.caller_name()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            handler = wrapped(interceptor, aio.on_loop(grpc.unary_unary_rpc_method_handler(body), pool))

            async def run():
                return await asyncio.gather(*(handler.unary_unary(b"", As(user, f"{user}-secret-1"))
                                              for user in ("ann", "bob", "bob", "ann")))
            seen = asyncio.run(run())
        assert seen == [("ann", "ann"), ("bob", "bob"), ("bob", "bob"), ("ann", "ann")]
    finally:
        store.close()
