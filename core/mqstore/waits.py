"""Where a thread says it is about to wait for another (an fsync, a replica's acknowledgement), so that the
thread pool running it can let another thread run meanwhile.

The gRPC servers' handler pool (mqstore_rpc.executor) runs at most a few handlers at a time, since one GIL
runs one of them anyway; a handler that waits does not count while it waits. The pool finds waiting handlers
on its own, by their CPU clocks, within about 40 ms; the waits that calls make often or many at once (a SYNC
append's fsync, a replica's acknowledgement, long polls, Tail streams: mqstore_rpc.executor lists them) say
so at once with ``with waits.waiting():``, so that group commit sees every concurrent append without that
delay. A pool without a cap sets no hooks.

A synchronous stream handler waits for its client's next message inside its request iterator: the port
(mqstore_rpc.aio) takes every request stream it hands a pool thread through :func:`iterate`, which says so
around each wait; a capped pool handles each message after that wait as it would a new call, once a place is
free. A synchronous response stream's thread waits for the loop to ask for its next response under
``waiting()`` too. Outside such a pool (tests, background duties, other thread pools) ``waiting()`` does
nothing.

A call answered on an event loop (the CommitLog's Append on its grpc.aio port) does not park a thread: it
awaits a :class:`LoopWaiter`, which the thread that would have woken a parked one (the flush, a replica's
acknowledgement) wakes the same way (``release()`` / ``set()``). :func:`wake` wakes a list of both kinds,
handing each loop's waiters over in one call.

One version of each waiting operation (issue 33): an operation that may wait is written once, as a coroutine
that parks a :func:`waiter` and awaits it. On an event loop the waiter is a :class:`LoopWaiter` and the await
suspends; run on a thread by :func:`blocking` (or a method made by :func:`blocking_version`) the waiter is a
:class:`ThreadWaiter`, whose await blocks the thread under ``waiting()`` and never suspends, so the coroutine
runs to its end in one step, as the synchronous version did (``MessageStore.append`` is
``append_async`` so run; so are the SYNC flush's and the in-sync replicas' waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import functools
import time
from typing import Any, AsyncIterator, Callable, Coroutine, Iterable, Iterator, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

_local = threading.local()


def set_hooks(begin: Callable[[], None], end: Callable[[], None], resume: Callable[[], None] | None = None) -> None:
    """Called by a pool on each of its threads: ``begin`` before this thread waits, ``end`` after; ``resume``
    (default ``end``) after a request stream's wait (:func:`iterate`), where the thread holds nothing of
    the service's, so that the pool may keep it waiting for a place, as it would a new call."""
    _local.hooks = (begin, end)
    _local.stream_hooks = (begin, resume or end)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    hooks = getattr(_local, "hooks", None)
    if hooks is None:
        yield
        return
    hooks[0]()
    try:
        yield
    finally:
        hooks[1]()


def iterate(items: Iterable[T]) -> Iterator[T]:
    """``items``, each taken under ``waiting()`` of the thread that takes it (leaving the wait by its pool's
    ``resume`` hook; a thread of no capped pool, as the check-back readers that take a CheckBack stream's
    answers, takes them as they are). The thread must hold no lock while it takes the next item."""
    return _iterate(iter(items))


def _iterate(items: Iterator[T]) -> Iterator[T]:
    hooks = getattr(_local, "stream_hooks", None)  # of the thread that runs this generator
    if hooks is None:
        yield from items
        return
    begin, end = hooks
    while True:
        begin()
        try:
            item = next(items)
        except StopIteration:
            return
        finally:
            end()
        yield item


class LoopWaiter:
    """A waiter that an event loop awaits (:meth:`wait`) and any thread wakes through :func:`wake`, kept in
    the same heaps as parked threads' locks and events. Made on the loop. Waking it after its awaiter was
    cancelled does nothing."""

    __slots__ = ("loop", "future")

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future = self.loop.create_future()

    async def wait(self, timeout_s: float) -> None:
        """Until woken (then every later wait returns at once), or until ``timeout_s`` has passed. After a
        timeout the awaiter re-checks its condition before it waits again: a wake that raced with the
        timeout resolved either the old future or the fresh one, so it is never missed."""
        future = self.future
        if future.done():
            return
        timer = self.loop.call_later(timeout_s, _expire, self, future)
        try:
            await future
        finally:
            timer.cancel()


class ThreadWaiter:
    """:class:`LoopWaiter`'s face for a coroutine run on a thread by :func:`blocking`: :meth:`wait` blocks
    the thread (under ``waiting()``: a capped handler pool runs others meanwhile) and returns without
    suspending. Woken by :func:`wake` (``release()``) from any thread, once or more; after a wake every later
    wait returns at once."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def release(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # woken before: once is enough
            pass

    async def wait(self, timeout_s: float) -> None:
        with waiting():
            if self._lock.acquire(timeout=timeout_s):
                try:
                    self._lock.release()  # woken: later waits return at once
                except RuntimeError:  # a second wake released it meanwhile
                    pass


def waiter() -> ThreadWaiter | LoopWaiter:
    """The waiter for the coroutine running now: a :class:`ThreadWaiter` under :func:`blocking`, else a
    :class:`LoopWaiter` of the running loop."""
    return ThreadWaiter() if getattr(_local, "blocking", False) else LoopWaiter()


def blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of ``coroutine`` run to its end on this thread, its waits (:func:`waiter`) blocking here.
    The coroutine may await only what :func:`waiter` gives and coroutines that do the same: anything else
    would suspend it, which is a bug here (AssertionError, the coroutine closed)."""
    before = getattr(_local, "blocking", False)
    _local.blocking = True
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    finally:
        _local.blocking = before
    coroutine.close()
    raise AssertionError("a coroutine run by waits.blocking suspended: it awaited something other than a waiter")


def blocking_version(operation: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """``operation`` (a coroutine function, the one version of an operation) for a caller on a thread: each
    call runs it by :func:`blocking`. Made, not written, so that it holds nothing of the operation's own."""
    @functools.wraps(operation)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return blocking(operation(*args, **kwargs))
    name = operation.__name__.replace("_async", "")
    run.__qualname__ = operation.__qualname__.removesuffix(operation.__name__) + name
    run.__name__ = name
    run.__doc__ = f":meth:`{operation.__name__}` on this thread: its waits block here (mqstore.waits.blocking)."
    return run


async def sleep(seconds: float) -> None:
    """``asyncio.sleep`` on an event loop; under :func:`blocking`, ``time.sleep`` on the thread (under
    ``waiting()``: the handler pool runs others meanwhile)."""
    if getattr(_local, "blocking", False):
        with waiting():
            time.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


async def off_loop(call: Callable[[], T]) -> T:
    """``call()`` (a read that may touch the disk): on an event loop, on a thread of its default executor so
    that the loop answers other calls meanwhile; under :func:`blocking`, here."""
    if getattr(_local, "blocking", False):
        return call()
    return await asyncio.get_running_loop().run_in_executor(None, call)


def blocking_iter(items: AsyncIterator[T]) -> Iterator[T]:
    """The items of the async generator ``items``, each step run on the taking thread by :func:`blocking`
    (a stream's one version served on a synchronous port); closing this iterator closes ``items``."""
    try:
        while True:
            try:
                item = blocking(items.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        blocking(items.aclose())


def _expire(waiter: LoopWaiter, future: asyncio.Future) -> None:
    if not future.done():
        waiter.future = waiter.loop.create_future()  # the next wait waits afresh
        future.set_result(None)


def wake(waiters: list, first: Callable[[], None] | None = None) -> None:
    """Wake each of ``waiters``: a parked thread's lock or :class:`ThreadWaiter` (released) or event (set), or a
    :class:`LoopWaiter`, handing the loop waiters over to their loop in one call per loop rather than one each.
    ``first``: run on each such loop just before its waiters are woken (the flush's dispatch, when only loops
    wait)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
    for waiter in waiters:
        if isinstance(waiter, LoopWaiter):
            by_loop.setdefault(waiter.loop, []).append(waiter.future)
        elif isinstance(waiter, threading.Event):
            waiter.set()
        else:
            waiter.release()
    for loop, futures in by_loop.items():
        _hand_over(loop, futures, first)


def _hand_over(loop: asyncio.AbstractEventLoop, futures, first: Callable[[], None] | None = None) -> None:
    """``_resolve`` on ``loop``: from another thread through its self-pipe (call_soon_threadsafe); from a
    callback of ``loop`` itself (a replica's acknowledgement read on the loop waking the appends waiting
    there, an append waking the replication streams) by ``call_soon``, same order and turn, without the
    self-pipe's write and the extra turn of the loop that reads it (two of each a SYNC-replicated append)."""
    try:
        if asyncio._get_running_loop() is loop:
            loop.call_soon(_resolve, futures, first)
        else:
            loop.call_soon_threadsafe(_resolve, futures, first)
    except RuntimeError:  # the loop is closed: nobody awaits them any more
        pass


def _resolve(futures, first: Callable[[], None] | None = None) -> None:
    try:
        if first is not None:
            first()
    finally:
        for future in futures:
            if not future.done():
                future.set_result(None)
