"""mqstore.replication.node.LogGrowth: what wakes a leader's replication stream, on a thread and on an event
loop (the Replicate of a grpc.aio port)."""

from __future__ import annotations

import asyncio
import threading

from mqstore import waits
from mqstore.clock import SystemClock
from mqstore.replication.node import LogGrowth
from tests.support.waiting import wait_until

LONG_S = 30.0  # a wait that must end by a wake long before this


def test_a_loop_waiter_is_woken_by_growth_from_another_thread():
    growth = LogGrowth()

    async def main():
        seen = growth.version()
        waiting = asyncio.ensure_future(growth.wait(seen, LONG_S))
        await asyncio.sleep(0)  # parked now
        threading.Thread(target=growth.grew).start()
        await asyncio.wait_for(waiting, LONG_S / 2)
        assert growth.version() == seen + 1
        assert not growth._waiters  # the wake took it

    asyncio.run(main())


def test_a_loop_waiter_returns_at_once_after_growth_and_leaves_nothing_behind_on_timeout_or_cancel():
    growth = LogGrowth()

    async def main():
        seen = growth.version()
        growth.grew()
        await asyncio.wait_for(growth.wait(seen, LONG_S), 1.0)  # grown since it looked: no wait
        await growth.wait(growth.version(), 0.01)  # nothing grows: the timeout ends it
        assert not growth._waiters
        cancelled = asyncio.ensure_future(growth.wait(growth.version(), LONG_S))
        await asyncio.sleep(0)
        assert len(growth._waiters) == 1
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not growth._waiters  # a stream that ended while it waited
        growth.grew()  # waking no one is harmless

    asyncio.run(main())


def test_a_replica_far_behind_is_read_on_a_thread_and_one_near_the_end_on_the_loop():
    """data_async: bytes more than CATCH_UP_BYTES behind the log's end may be on the disk only, so they are
    read off the loop; the tail, in the page cache, is read on it."""
    from types import SimpleNamespace

    from mqstore.replication import leader

    end = 3 * leader.CATCH_UP_BYTES
    readers: list[tuple[int, str]] = []

    class Store:
        def log_end(self):
            return end

        def chunk(self, offset, max_bytes):
            readers.append((offset, threading.current_thread().name))
            nxt = min(end, offset + max_bytes)
            return b"x" * (nxt - offset), nxt

    in_sync = SimpleNamespace(connected=lambda *a: None, disconnected=lambda *a: None, committed=lambda: 0)
    node = SimpleNamespace(growth=LogGrowth(), is_leader=True, leadership=SimpleNamespace(epoch=1), in_sync=in_sync,
                           clock=SystemClock(),
                           config=SimpleNamespace(replication_heartbeat_ms=10, replication_chunk_bytes=8 << 20))
    session = object.__new__(leader.ReplicaSession)  # the handshake is the other tests' business
    session.store, session.node, session.position, session.epoch = Store(), node, 0, 1
    session._chunk = lambda: session.store.chunk(session.position, node.config.replication_chunk_bytes)
    session.hello = SimpleNamespace(replica_id="r", address="a")

    async def main():
        loop_thread = threading.current_thread().name
        stream = session.data_async()
        while session.position < end:
            await asyncio.wait_for(anext(stream), LONG_S)
        await stream.aclose()
        return loop_thread

    loop_thread = asyncio.run(main())
    far = [name for offset, name in readers if end - offset > leader.CATCH_UP_BYTES]
    near = [name for offset, name in readers if end - offset <= leader.CATCH_UP_BYTES]
    assert far and near
    assert all(name != loop_thread for name in far)
    assert all(name == loop_thread for name in near)


def test_a_thread_waiter_is_woken_by_growth_and_its_wait_is_the_loops_one_run_by_waits_blocking():
    """LogGrowth.wait is one version (issue 33): a replica's stream on a thread runs it by waits.blocking,
    parked until another thread's growth wakes it, and leaves nothing behind on a timeout."""
    growth = LogGrowth()
    seen = growth.version()
    done = threading.Event()

    def stream():
        waits.blocking(growth.wait(seen, LONG_S))
        done.set()

    thread = threading.Thread(target=stream)
    thread.start()
    wait_until(lambda: growth._waiters, timeout_s=LONG_S, what="the stream's thread parked")
    growth.grew()
    assert done.wait(LONG_S / 2)
    thread.join(LONG_S)
    waits.blocking(growth.wait(growth.version(), 0.01))  # nothing grows: the timeout ends it
    assert not growth._waiters
