"""The one kind of server every port is (mqstore_rpc.server): grpc.aio on an event loop of its own, and how a
synchronous handler is served there.

Why: grpc's synchronous server hands every message of a stream between its polling thread and the
handler's thread, twice (the request, then the wait for the response to be written), and each hand-off
is a turn at the GIL; a unary call pays the same. On a grpc.aio server a call's messages are read and
answered on the event loop's one thread, and a call that waits (a SYNC append's fsync, a replica's
acknowledgement, a Transaction frame's append) holds no thread. bench/README.md, *One concurrency model*, has
the measurement that made it the only kind of port.

  what                       how
  -------------------------  ------------------------------------------------------------------------------
  the server                 ``grpc.aio.server`` on an event loop of its own, run by the thread
                             ``grpc-aio-loop`` (:class:`LoopThread`); start and stop are that loop's. The
                             loop is uvloop's (``MQSTORE_EVENT_LOOP=asyncio``: asyncio's standard one)
  async handlers             run on the loop: an ``async def`` unary call, or an ``async def`` generator of
                             a stream's responses. A handler must not block the loop: what may wait (an
                             fsync, another service, a read of the tier) it runs off the loop
                             (mqstore.waits.off_loop, run_in_executor)
  a synchronous handler      made an async one once, when its method is first called (:func:`on_loop`): its
                             body runs in the server's bounded handler pool (mqstore_rpc.executor) by
                             run_in_executor, seeing a context that has what a synchronous one has
                             (:class:`SyncContext`: ``is_active()``, ``code()``, ``abort`` that raises) and
                             the call's context variables (the authenticated caller); a request stream is
                             read through the loop (:class:`_BlockingRequests`)
  a synchronous handler      marked :func:`at_once_when`: run on the loop, with the same context, for the calls
  that may not block         its servicer's check says cannot block (the CommitLog's Pull of the hot local
                             log, the Consumer's Receive and Ack), in the pool for the others; a call that
                             finds on the loop that it would have to wait after all (a Receive with nothing
                             ready that asked for a long poll) raises :class:`InPool` before it changed
                             anything, and is run again in the pool (:func:`on_the_loop` says where it runs)
  a synchronous response     runs on one pool thread, but its responses are handed to the loop by
  stream                     :func:`_driven_stream`, not by grpc: grpc's hand-off blocks the thread on a
                             one-item queue that nothing reads once the client has cancelled, so each
                             cancelled stream (a Tail, a CheckBack stream) would hold a pool thread until the
                             server stops. Here the thread computes a response only when the loop asks for
                             one (its wait between them says so to the pool: mqstore.waits), and the call's
                             end (a cancel included) ends it and closes the handler
  the interceptors           metrics, errors, authentication (:class:`Interceptors`) wrap only async handlers,
                             on the loop, one adapter each: a synchronous handler is wrapped after it is made
                             async, so that its errors, figures and checks are the same as an async one's
  health, reflection         grpc's health servicer as any synchronous handler; grpc's async reflection
                             servicer on the loop

Thread-safety: the loop runs on its own thread; :meth:`LoopThread.run` may be called from any other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import os
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Sequence, TypeVar

import grpc
import structlog

from mqstore import profiling, waits
from mqstore.errors import MqStoreError
from mqstore_rpc.handlers import PerMethod, behavior_of, like

T = TypeVar("T")
log = structlog.get_logger("mqstore_rpc.aio")


EVENT_LOOP_ENV = "MQSTORE_EVENT_LOOP"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for a port: uvloop's (its loop and handles in C: grpc.aio's ~17 callbacks and 3 tasks
    a unary call cost less there; bench/README.md, *The ports' loop: uvloop*), or asyncio's standard one when
    ``MQSTORE_EVENT_LOOP=asyncio``. Any other value is refused (ValueError naming the variable)."""
    kind = os.environ.get(EVENT_LOOP_ENV, "uvloop").strip().lower() or "uvloop"
    if kind == "asyncio":
        return asyncio.new_event_loop()
    if kind != "uvloop":
        raise ValueError(f"{EVENT_LOOP_ENV}={kind!r}: expected 'uvloop' (the default) or 'asyncio'")
    import uvloop

    return uvloop.new_event_loop()


class LoopThread:
    """An event loop (:func:`new_event_loop`) run by a daemon thread of its own, until :meth:`close`."""

    def __init__(self, name: str = "grpc-aio-loop"):
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=profiling.run, args=(self.loop.run_forever,), name=name, daemon=True)
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
    """The context of a synchronous handler, with what grpc.ServicerContext has: ``is_active()`` (false once
    the call has ended: its callbacks ran) and ``code()`` (the code set or aborted with, else None). Everything
    else is the given context's (a :class:`_LoopContext`)."""

    __slots__ = ("_context", "_ended", "_code")

    def __init__(self, context: Any):
        self._context = context
        self._ended = False  # set on the loop, read on the handler's thread (a plain flag: one per call is cheap)
        self._code: grpc.StatusCode | None = None
        context.add_callback(self._end)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def _end(self) -> None:
        self._ended = True

    def is_active(self) -> bool:
        return not self._ended

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code = code
        self._context.abort(code, details)


class Interceptors(grpc.aio.ServerInterceptor):
    """The interceptors ``chain`` (outermost first: metrics, errors, then the caller's, authentication) on a
    grpc.aio server: each method's handler is made async (:func:`on_loop`, its synchronous body run in ``pool``)
    and then wrapped by each of them, once per method. An interceptor here is an object whose
    ``intercept_service(continuation, details)`` returns the wrapped handler of ``continuation(details)``,
    an async one. Thread-safe: holds a cache of the outermost handlers per method (registered methods only,
    so bounded; a race only wraps twice)."""

    def __init__(self, chain: Sequence[grpc.ServerInterceptor], pool: concurrent.futures.Executor):
        self._chain = list(reversed(chain))  # innermost first
        self._pool = pool
        self._wrapped = PerMethod()
        # Interceptors that give some calls another handler (the authentication's screened one, for
        # credentials not cached: mqstore_rpc.auth): asked per call, their answer is part of the cache key
        self._screens = [i for i in chain if hasattr(i, "screens")]

    async def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        # Per call, on the loop: what a call that finds its handler wrapped already does is kept to lookups
        # (no closure, no generator; bench/README.md, *GetStoreInfo's layer*)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        screened = False
        for interceptor in self._screens:
            if interceptor.screens(handler_call_details, handler):
                screened = True
                break
        method = handler_call_details.method
        key = (method, True) if screened else method
        wrapped = self._wrapped.find(key, handler)
        if wrapped is None:
            details = _Screened(handler_call_details, screened) if self._screens else handler_call_details
            wrapped = self._wrapped.get(key, handler, functools.partial(self._wrap, details))
        return wrapped

    def _wrap(self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        handler = on_loop(handler, self._pool)
        for interceptor in self._chain:
            handler = interceptor.intercept_service(functools.partial(_given, handler), details)
        return handler


def on_loop(handler: grpc.RpcMethodHandler, pool: concurrent.futures.Executor) -> grpc.RpcMethodHandler:
    """``handler`` as an async one: itself if it is; a synchronous unary-response behavior as a coroutine that
    runs it in ``pool`` (:func:`_in_pool`); a synchronous response stream as an async generator driving it in
    ``pool`` (:func:`_driven_stream`). The behavior's attributes (a wire parser: mqstore_rpc.errors.wire_codec)
    are kept."""
    behavior = behavior_of(handler)
    if inspect.isasyncgenfunction(behavior) or inspect.iscoroutinefunction(behavior):
        return handler
    check = getattr(behavior, "at_once_when", None)
    owner = getattr(behavior, "__self__", None)  # the servicer whose method it is (a bound method)
    if check is not None and owner is not None and not handler.request_streaming and not handler.response_streaming:
        return like(handler, _at_once_or_in_pool(behavior, getattr(owner, check), pool))
    if handler.response_streaming:
        return like(handler, functools.wraps(behavior)(_driven_stream(behavior, pool, handler.request_streaming)))
    return like(handler, _in_pool(behavior, pool, handler.request_streaming))


def _in_pool(behavior: Callable, pool: concurrent.futures.Executor, request_streaming: bool) -> Callable:
    """A synchronous unary-response ``behavior`` as a coroutine: run on a thread of ``pool`` with a
    :class:`SyncContext` and the call's context variables, its request stream (if any) read through the loop.
    ``context.abort`` there ends the call from the loop with its status."""
    @functools.wraps(behavior)
    async def call(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        loop = asyncio.get_running_loop()
        requests = _BlockingRequests(request_or_iterator, loop) if request_streaming else None
        sync_context = SyncContext(_LoopContext(context, loop))
        taken = waits.iterate(requests) if requests is not None else request_or_iterator
        try:
            return await loop.run_in_executor(pool, contextvars.copy_context().run, behavior, taken, sync_context)
        except _Aborted as aborted:
            await context.abort(aborted.code, aborted.details)
        finally:
            if requests is not None:
                requests.cancel()
    return call


class InPool(Exception):
    """Raised by a handler run on the loop (:func:`at_once_when`) that finds it would have to wait, before it
    changed anything: the port runs the call again in the handler pool."""


def on_the_loop() -> bool:
    """Whether this code runs on an event loop's thread (a handler :func:`at_once_when` runs there), not on a
    thread of the pool."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def at_once_when(check: str) -> Callable[[Callable], Callable]:
    """Mark a synchronous unary servicer method that the port runs on the loop when its servicer's method
    ``check(request)`` says this call cannot block (what mqstore.hot_reads says: pull_at_once, a read of the
    hot local log), and in the handler pool otherwise, as an unmarked one. ``check`` is looked up on the bound
    method's servicer (a handler that is no bound method runs in the pool) and runs on the loop: it must not
    block either."""
    def mark(method: Callable) -> Callable:
        method.at_once_when = check
        return method
    return mark


def _at_once_or_in_pool(behavior: Callable, at_once: Callable[[Any], bool],
                        pool: concurrent.futures.Executor) -> Callable:
    """A synchronous unary ``behavior`` as a coroutine that runs it here, on the loop, when ``at_once(request)``
    (with the same :class:`SyncContext` as in the pool), else in ``pool`` (:func:`_in_pool`); again in ``pool``
    when it raises :class:`InPool` here."""
    in_pool = _in_pool(behavior, pool, False)

    @functools.wraps(behavior)
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not at_once(request):
            return await in_pool(request, context)
        try:
            return behavior(request, SyncContext(_LoopContext(context, asyncio.get_running_loop())))
        except _Aborted as aborted:
            await context.abort(aborted.code, aborted.details)
        except InPool:
            return await in_pool(request, context)
    return call


class _Screened:
    """A call's details with the screening decided once (``screened``), so that the handler cached for
    one answer is never made from the other."""

    __slots__ = ("method", "invocation_metadata", "screened")

    def __init__(self, details: grpc.HandlerCallDetails, screened: bool):
        self.method, self.invocation_metadata, self.screened = details.method, details.invocation_metadata, screened


def _given(handler: grpc.RpcMethodHandler, _details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
    return handler


# ---- synchronous response streams ------------------------------------------------------------------------

_END = object()  # the stream's responses are all sent


class _Aborted(BaseException):
    """``context.abort`` in a synchronous stream handler: the loop ends the call with this status. A
    BaseException, so that the handler's wrappers (``except Exception``: the error mapping) let it through
    rather than map it once more, as an internal error."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(code, details)
        self.code, self.details = code, details


class _StreamEnded(grpc.RpcError):
    """A request stream read from a handler's thread ended abnormally (the call was cancelled), as a
    synchronous server's request iterator raises grpc.RpcError then."""


class _LoopContext:
    """A grpc.aio call's context as a synchronous handler's thread uses it: what grpc.aio makes coroutines
    (abort, send_initial_metadata) and the callbacks at the call's end; everything else is the context's."""

    __slots__ = ("_context", "_loop")

    def __init__(self, context: Any, loop: asyncio.AbstractEventLoop):
        self._context, self._loop = context, loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple = ()) -> None:
        if trailing_metadata:
            self._context.set_trailing_metadata(trailing_metadata)
        raise _Aborted(code, details)

    def send_initial_metadata(self, metadata: Sequence) -> None:
        asyncio.run_coroutine_threadsafe(_awaited(self._context.send_initial_metadata(metadata)), self._loop).result()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._context.add_done_callback(lambda _context: callback())
        return True


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class _BlockingRequests:
    """A grpc.aio call's request stream as a synchronous handler's threads read it: each item is awaited on
    the loop (parsed and checked there by the interceptors: an item they refuse raises their MqStoreError here).
    Ends with StopIteration, or with grpc.RpcError once the call has ended (:meth:`cancel`)."""

    def __init__(self, requests: Any, loop: asyncio.AbstractEventLoop):
        self._requests, self._loop = requests, loop
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future | None = None
        self._cancelled = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._cancelled:
                raise _StreamEnded()
            self._pending = pending = asyncio.run_coroutine_threadsafe(_awaited(self._requests.__anext__()),
                                                                       self._loop)
        try:
            return pending.result()
        except StopAsyncIteration:
            raise StopIteration from None
        except MqStoreError:  # an item refused on the loop (unparsable, not permitted): the handler's error
            raise
        except (Exception, concurrent.futures.CancelledError) as exc:
            raise _StreamEnded() from exc

    def cancel(self) -> None:
        """The call has ended: a read in progress and every later one raise grpc.RpcError."""
        with self._lock:
            self._cancelled = True
            pending = self._pending
        if pending is not None:
            pending.cancel()


class _Producer:
    """A synchronous handler's responses, computed on one pool thread one at a time, each when the loop
    asks for it (:meth:`next`), until the handler ends or the loop says the call has ended (:meth:`end`).

    Thread-safe: ``_wanted`` and ``_ended`` are guarded by ``_lock``; the loop's future is resolved on the
    loop (call_soon_threadsafe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._asked = threading.Condition(self._lock)
        self._wanted: tuple[asyncio.Future, contextvars.Context] | None = None
        self._ended = False

    def next(self) -> asyncio.Future:
        """On the loop: the next response, _END after the last; raises what the handler raised. The step runs in
        a copy of the loop's context variables now (the authenticated caller, set for this step only)."""
        future = self._loop.create_future()
        with self._lock:
            self._wanted = (future, contextvars.copy_context())
            self._asked.notify()
        return future

    def end(self) -> None:
        """On the loop: the call has ended; the thread closes the handler once its current step returns."""
        with self._lock:
            self._ended = True
            self._asked.notify()

    def run(self, make: Callable[[], Iterator[Any]]) -> None:
        """On the pool thread: the handler's responses, one per :meth:`next`."""
        responses: Iterator[Any] | None = None
        try:
            while True:
                with waits.waiting():  # for the loop to send the last response and ask for the next
                    asked = self._wait_asked()
                if asked is None:
                    return
                wanted, context = asked
                try:
                    if responses is None:
                        responses = context.run(make)
                    item = context.run(next, responses, _END)
                except BaseException as exc:  # noqa: BLE001 - handed to the loop, which ends the call with it
                    self._hand(wanted, None, exc)
                    return
                self._hand(wanted, item, None)
                if item is _END:
                    return
        finally:
            close = getattr(responses, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - a handler's cleanup failing must not kill the pool thread
                    log.warning("rpc.stream_close_failed", error=type(exc).__name__, message=str(exc))

    def _wait_asked(self) -> tuple[asyncio.Future, contextvars.Context] | None:
        with self._lock:
            while self._wanted is None and not self._ended:
                if self._loop.is_closed():
                    return None
                self._asked.wait(1.0)
            if self._ended:
                return None
            wanted, self._wanted = self._wanted, None
            return wanted

    def _hand(self, future: asyncio.Future, item: Any, exc: BaseException | None) -> None:
        try:
            self._loop.call_soon_threadsafe(_settle, future, item, exc)
        except RuntimeError:  # the loop is closed: nobody waits for it
            pass


def _settle(future: asyncio.Future, item: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(item)


def _driven_stream(behavior: Callable, pool: concurrent.futures.Executor, request_streaming: bool) -> Callable:
    """A synchronous response-streaming ``behavior`` as an async generator: the behavior runs on one thread of
    ``pool`` with a :class:`SyncContext` (its request stream, if any, read through the loop), each step in the
    context variables of the loop's ask for it, and each of its responses is sent from the loop. When the call
    ends, however it ends, the thread is told to stop: it closes the behavior's generator after the step it is
    in (a Tail between frames returns within its heartbeat, seeing ``is_active()`` false) and goes back to the
    pool."""
    async def drive(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        requests = _BlockingRequests(request_or_iterator, loop) if request_streaming else request_or_iterator
        taken = waits.iterate(requests) if request_streaming else requests
        sync_context = SyncContext(_LoopContext(context, loop))
        producer = _Producer(loop)
        pool.submit(producer.run, lambda: iter(behavior(taken, sync_context)))
        try:
            while True:
                try:
                    item = await producer.next()
                except _Aborted as aborted:
                    await context.abort(aborted.code, aborted.details)
                if item is _END:
                    return
                yield item
        finally:
            producer.end()
            if request_streaming:
                requests.cancel()
    return drive
