"""What a grpc.aio server needs from the shared server skeleton (mqstore_rpc.server, ``aio=True``).

Why: grpc's synchronous server hands every message of a stream between its polling thread and the
handler's thread, twice (the request, then the wait for the response to be written), and each hand-off
is a turn at the GIL; a unary call pays the same. On a grpc.aio server a call's messages are read and
answered on the event loop's one thread. For Local mode's Transaction port, where a frame's work (the
coordinator and an in-process append) needs no other thread, a carried-Commit transaction at 8 producers
went from 0.54x to 0.78x the rate of a plain Append (bench/txn.py's notes).

How a ManagedServer with ``aio=True`` differs from the synchronous one:

  what                       how
  -------------------------  ------------------------------------------------------------------------------
  the server                 ``grpc.aio.server`` on an event loop of its own, run by the thread
                             ``grpc-aio-loop`` (:class:`LoopThread`); start and stop are that loop's
  async handlers             run on the loop: an ``async def`` unary call, or an ``async def`` generator of
                             a stream's responses; the interceptors (metrics, errors, authentication) wrap
                             them with their async variants. A handler must not block the loop: what may
                             wait (an fsync, another service) it runs in the pool (run_in_executor)
  every other handler        runs in the server's handler pool (mqstore_rpc.executor) as on a synchronous
                             server (grpc's ``migration_thread_pool``), with the same interceptors, seeing a
                             context that has what a synchronous one has (:class:`SyncContext`)
  health, reflection, TLS    as on the synchronous server (the health servicer's calls in the pool,
                             grpc's async reflection servicer on the loop)

The synchronous interceptors are given to grpc.aio through :class:`Interceptors`, which applies them to the
handler once per call as the synchronous server would (they cache their wrapped handlers per method).

Thread-safety: the loop runs on its own thread; :meth:`LoopThread.run` may be called from any other.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import grpc

from mqstore_rpc.handlers import PerMethod, behavior_of, like

T = TypeVar("T")


class LoopThread:
    """An event loop run by a daemon thread of its own, until :meth:`close`."""

    def __init__(self, name: str = "grpc-aio-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, make: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        """The result of the coroutine ``make()``, run on the loop (TimeoutError after ``timeout_s``)."""
        async def call() -> T:
            return await make()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


class SyncContext:
    """The context of a synchronous handler on a grpc.aio server, with what grpc.ServicerContext has and
    grpc's migration context lacks: ``is_active()`` (false once the call has ended: its callbacks ran) and
    ``code()`` (the code set or aborted with, else None). Everything else is the migration context's."""

    __slots__ = ("_context", "_ended", "_code")

    def __init__(self, context: Any):
        self._context = context
        self._ended = threading.Event()
        self._code: grpc.StatusCode | None = None
        context.add_callback(self._ended.set)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code = code
        self._context.abort(code, details)


def _with_sync_context(behavior: Callable) -> Callable:
    @functools.wraps(behavior)
    def call(request_or_iterator: Any, context: Any) -> Any:
        return behavior(request_or_iterator, SyncContext(context))
    return call


class Interceptors(grpc.aio.ServerInterceptor):
    """The synchronous interceptors ``chain`` (outermost first, as grpc.server takes them) on a grpc.aio
    server; a synchronous handler's behavior gets a :class:`SyncContext`. Thread-safe: holds a cache of
    the outermost handlers per method (registered methods only, so bounded; a race only wraps twice)."""

    def __init__(self, chain: Sequence[grpc.ServerInterceptor]):
        self._chain = list(reversed(chain))  # innermost first
        self._wrapped = PerMethod()

    async def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None

        def wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
            for interceptor in self._chain:
                handler = interceptor.intercept_service(functools.partial(_given, handler), handler_call_details)
            behavior = behavior_of(handler)
            if inspect.isasyncgenfunction(behavior) or inspect.iscoroutinefunction(behavior):
                return handler
            return like(handler, _with_sync_context(behavior))
        return self._wrapped.get(handler_call_details.method, handler, wrap)


def _given(handler: grpc.RpcMethodHandler, _details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
    return handler
