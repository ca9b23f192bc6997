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
wait. Outside such a pool (tests, background duties, other thread pools) ``waiting()`` does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

_local = threading.local()


def set_hooks(begin: Callable[[], None], end: Callable[[], None]) -> None:
    """Called by a pool on each of its threads: ``begin`` before this thread waits, ``end`` after."""
    _local.hooks = (begin, end)


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
    """``items``, each taken under ``waiting()``; called on the thread that will iterate."""
    hooks = getattr(_local, "hooks", None)
    if hooks is None:
        return iter(items)
    return _iterate(iter(items), hooks)


def _iterate(items: Iterator[T], hooks: tuple[Callable[[], None], Callable[[], None]]) -> Iterator[T]:
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
