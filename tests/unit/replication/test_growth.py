"""mqstore.replication.node.LogGrowth: what wakes a leader's replication stream, on a thread and on an event
loop (the Replicate of a grpc.aio port)."""

from __future__ import annotations

import asyncio
import threading

from mqstore.replication.node import LogGrowth

LONG_S = 30.0  # a wait that must end by a wake long before this


def test_a_loop_waiter_is_woken_by_growth_from_another_thread():
    growth = LogGrowth()

    async def main():
        seen = growth.version()
        waiting = asyncio.ensure_future(growth.wait_async(seen, LONG_S))
        await asyncio.sleep(0)  # parked now
        threading.Thread(target=growth.grew).start()
        await asyncio.wait_for(waiting, LONG_S / 2)
        assert growth.version() == seen + 1
        assert not growth._loop_waiters  # the wake took it

    asyncio.run(main())


def test_a_loop_waiter_returns_at_once_after_growth_and_leaves_nothing_behind_on_timeout_or_cancel():
    growth = LogGrowth()

    async def main():
        seen = growth.version()
        growth.grew()
        await asyncio.wait_for(growth.wait_async(seen, LONG_S), 1.0)  # grown since it looked: no wait
        await growth.wait_async(growth.version(), 0.01)  # nothing grows: the timeout ends it
        assert not growth._loop_waiters
        cancelled = asyncio.ensure_future(growth.wait_async(growth.version(), LONG_S))
        await asyncio.sleep(0)
        assert len(growth._loop_waiters) == 1
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not growth._loop_waiters  # a stream that ended while it waited
        growth.grew()  # waking no one is harmless

    asyncio.run(main())
