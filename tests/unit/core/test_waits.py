"""mqstore.waits' one version of a waiting operation (issue 33): a coroutine that parks waits.waiter(),
awaited on an event loop or run on a thread by waits.blocking (where its waits block and never suspend)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mqstore import waits

LONG_S = 30.0


async def _parked(box: list) -> str:
    waiter = waits.waiter()
    box.append(waiter)
    await waiter.wait(LONG_S)
    return type(waiter).__name__


def test_blocking_runs_the_coroutine_on_this_thread_and_another_thread_wakes_its_waiter():
    box: list = []
    waker = threading.Thread(target=lambda: (_wait_for(box), waits.wake(box)))
    waker.start()
    assert waits.blocking(_parked(box)) == "ThreadWaiter"
    waker.join(LONG_S)


def _wait_for(box: list) -> None:
    from tests.support.waiting import wait_until
    wait_until(lambda: box, timeout_s=LONG_S, what="the coroutine parked its waiter")


def test_the_same_coroutine_awaited_on_a_loop_parks_a_loop_waiter_even_after_a_blocking_call_there():
    async def main():
        assert waits.blocking(_ready()) == 7  # a thread's call made on the loop's thread: the flag is restored
        box: list = []
        task = asyncio.ensure_future(_parked(box))
        await asyncio.sleep(0)
        threading.Thread(target=waits.wake, args=(box,)).start()
        return await asyncio.wait_for(task, LONG_S)
    assert asyncio.run(main()) == "LoopWaiter"


async def _ready() -> int:
    return 7


def test_a_coroutine_that_would_suspend_under_blocking_is_a_bug_not_a_hang():
    async def sleeps():
        await asyncio.sleep(0)
    with pytest.raises(AssertionError, match="suspended"):
        waits.blocking(sleeps())


def test_a_thread_waiter_woken_twice_returns_at_once_ever_after_and_its_wait_tells_the_pool():
    told, saved = [], dict(waits._local.__dict__)
    waits.set_hooks(lambda: told.append("begin"), lambda: told.append("end"))
    try:
        waiter = waits.ThreadWaiter()
        waits.blocking(waiter.wait(0.001))  # not woken: the timeout ends it
        waiter.release()
        waiter.release()  # a second wake is harmless
        waits.blocking(waiter.wait(LONG_S))
        waits.blocking(waiter.wait(LONG_S))
    finally:
        waits._local.__dict__.clear()
        waits._local.__dict__.update(saved)
    assert told == ["begin", "end"] * 3


def test_blocking_version_is_made_from_the_one_version_and_holds_nothing_else():
    class Store:
        async def append_async(self, x: int) -> int:
            """The one version."""
            return x + 1
        append = waits.blocking_version(append_async)

    assert Store().append(1) == 2
    assert Store.append.__name__ == "append" and Store.append.__qualname__.endswith("Store.append")
    assert "append_async" in Store.append.__doc__


def test_an_async_generator_run_on_a_thread_by_blocking_iter_reads_here_and_is_closed_with_its_iterator():
    """A stream's one version (ReplicaSession.data_async) served on a synchronous port's thread: off_loop's
    read and sleep run on the taking thread, and closing the iterator runs the generator's finally."""
    ran: list[str] = []

    async def stream():
        try:
            for i in range(10):
                ran.append(await waits.off_loop(lambda: threading.current_thread().name))
                await waits.sleep(0)
                yield i
        finally:
            ran.append("closed")

    items = waits.blocking_iter(stream())
    assert [next(items), next(items)] == [0, 1]
    items.close()
    assert ran == [threading.current_thread().name] * 2 + ["closed"]
    assert list(waits.blocking_iter(stream())) == list(range(10))


def test_a_wake_from_the_loops_own_thread_skips_the_self_pipe_and_one_from_another_thread_uses_it():
    """A replica's acknowledgement read on the loop wakes the appends waiting there (and an append wakes the
    replication streams): call_soon, not call_soon_threadsafe's self-pipe write and the extra turn of the
    loop that reads it (bench/README.md, *The replication benchmark*); from another thread (the flusher) the
    self-pipe still wakes the loop."""
    async def main():
        loop = asyncio.get_running_loop()
        writes: list[int] = []
        write_to_self = loop._write_to_self
        loop._write_to_self = lambda: (writes.append(1), write_to_self())
        mine: list = []
        task = asyncio.ensure_future(_parked(mine))
        await asyncio.sleep(0)
        waits.wake(mine)  # on the loop's thread
        assert await asyncio.wait_for(task, LONG_S) == "LoopWaiter"
        assert writes == []
        theirs: list = []
        task = asyncio.ensure_future(_parked(theirs))
        await asyncio.sleep(0)
        waker = threading.Thread(target=waits.wake, args=(theirs,))
        waker.start()
        assert await asyncio.wait_for(task, LONG_S) == "LoopWaiter"
        waker.join(LONG_S)
        assert writes  # the other thread's wake went through the self-pipe
    asyncio.run(main())
