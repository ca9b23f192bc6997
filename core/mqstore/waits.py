"""Where a thread says it is about to wait for another (an fsync, a replica's acknowledgement), so that the
thread pool running it can let another thread run meanwhile.

The gRPC servers' handler pool (mqstore_rpc.executor) runs at most a few handlers at a time, since one GIL
runs one of them anyway; a handler that waits does not count while it waits. The pool finds waiting handlers
on its own, by their CPU clocks, within about 40 ms; the waits that calls make often or many at once (a SYNC
append's fsync, a replica's acknowledgement, long polls, Tail streams: mqstore_rpc.executor lists them) say
so at once with ``with waits.waiting():``, so that group commit sees every concurrent append without that
delay. A pool without a cap sets no hooks.

A stream's handler waits for its client's next message inside grpc's request iterator: the servers' error
wrapper (mqstore_rpc.errors) takes every request stream through :func:`iterate`, which says so around each
wait; a capped pool handles each message after that wait as it would a new call, once a place is free.
The same wrapper takes every response stream through :func:`responses`: grpc waits for each response to be
written before it asks for the next, and that wait says so too. Outside such a pool (tests, background
duties, other thread pools) ``waiting()`` does nothing.

A call answered on an event loop (the CommitLog's Append on its grpc.aio port) does not park a thread: it
awaits a :class:`LoopWaiter`, which the thread that would have woken a parked one (the flush, a replica's
acknowledgement) wakes the same way (``release()`` / ``set()``). :func:`wake` wakes a list of both kinds,
handing each loop's waiters over in one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

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


def responses(items: Iterable[T]) -> Iterator[T]:
    """``items`` (a stream handler's responses), each yielded under ``waiting()`` of the thread that takes
    them: grpc sends a response and waits for it to be written before it asks for the next."""
    return _responses(iter(items))


def _responses(items: Iterator[T]) -> Iterator[T]:
    hooks = getattr(_local, "hooks", None)
    if hooks is None:
        yield from items
        return
    begin, end = hooks
    for item in items:
        begin()
        try:
            yield item
        finally:
            end()


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


def _expire(waiter: LoopWaiter, future: asyncio.Future) -> None:
    if not future.done():
        waiter.future = waiter.loop.create_future()  # the next wait waits afresh
        future.set_result(None)


def wake(waiters: list, first: Callable[[], None] | None = None) -> None:
    """Wake each of ``waiters``: a parked thread's lock (released) or event (set), or a :class:`LoopWaiter`,
    handing the loop waiters over to their loop in one call per loop rather than one each. ``first``: run
    on each such loop just before its waiters are woken (the flush's dispatch, when only loops wait)."""
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
    try:
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
