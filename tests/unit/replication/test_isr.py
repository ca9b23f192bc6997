"""The in-sync set and the waits of SYNC-replicated appends (mqstore.replication.isr), on a fake clock."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mqstore.errors import NotEnoughReplicas, ReplicationTimeout
from mqstore.replication.config import ReplicationConfig
from mqstore.replication.isr import InSyncSet


class FakeClock:
    """Moves only when told, except that each monotonic read lets 100 ms pass: a wait that no
    acknowledgement ends reaches its deadline after a few loops, without sleeping."""

    def __init__(self):
        self.ms = 1_000_000

    def now_ms(self):
        return self.ms

    def monotonic_s(self):
        self.ms += 100
        return self.ms / 1000


def make(min_insync=2, timeout_ms=1000, lag_ms=3000, published=None, flush_sync=False):
    clock = FakeClock()
    end = [0]
    config = ReplicationConfig(node_id="a", min_insync_replicas=min_insync, sync_replication_timeout_ms=timeout_ms,
                               isr_max_lag_ms=lag_ms, isr_max_lag_bytes=100)
    isr = InSyncSet(config,
                    clock, lambda: end[0], flush_sync, publish=published.append if published is not None else None)
    return isr, clock, end


@pytest.fixture(params=["thread", "loop"])
def wait(request):
    """A SYNC append's wait: a parked thread (InSyncSet.wait) or a coroutine on an event loop (wait_async,
    the CommitLog's Append on its grpc.aio port); the same outcomes either way."""
    if request.param == "thread":
        return lambda isr, end: isr.wait(end)
    return lambda isr, end: asyncio.run(isr.wait_async(end))


def test_replica_joins_when_caught_up_and_is_published_after_the_join_mark():
    published = []
    isr, clock, end = make(published=published)
    with pytest.raises(NotEnoughReplicas):
        isr.require_enough()
    isr.connected("b", "h:1")
    end[0] = 500
    isr.on_ack("b", 400, 400)
    assert isr.members() == {"a"}                 # behind: not yet in sync
    ends = iter([500, 600])  # an append ends at 600 while b joins: it may have been acked without b
    isr.leader_end = lambda: next(ends)
    isr.on_ack("b", 500, 500)
    assert isr.members() == {"a", "b"}            # waited for at once...
    isr.leader_end = lambda: 600
    isr.maintain()
    assert published == [] and isr.published() == {"a"}  # ...electable only once it holds the join mark
    with pytest.raises(NotEnoughReplicas, match=r"joining: \['b'\]"):
        isr.require_enough()  # ...and counted toward the minimum only then (KIP-841)
    isr.on_ack("b", 600, 600)
    isr.maintain()
    assert published == [frozenset({"a", "b"})] and isr.published() == {"a", "b"}
    isr.require_enough()


def test_an_acknowledged_append_rests_on_published_copies_only(wait):
    """The failover window: the set is published at {a} (b was shrunk), b catches up again, and a SYNC
    append ends. Until b is published, no election could pick b, so the append must not be acknowledged
    on b's copy: a waiter that got in before the shrink fails instead of being acknowledged."""
    published = []
    isr, clock, end = make(published=published)
    published_pair(isr)
    end[0] = 1000
    clock.ms += 3001
    isr.maintain()                         # b lags: published {a}
    assert published[-1] == frozenset({"a"})
    isr.on_ack("b", 1000, 1000)             # b caught up: waited for, not yet published
    assert isr.members() == {"a", "b"} and isr.published() == {"a"}
    with pytest.raises(ReplicationTimeout, match="shrank"):
        wait(isr, 1000)                      # held by b, yet not acknowledged: b is not electable
    isr.maintain()                          # b holds its join mark: published
    assert isr.published() == {"a", "b"}
    assert wait(isr, 1000) == 2


def published_pair(isr):
    """b connected, caught up and published: the set an append may count on."""
    isr.connected("b", "h:1")
    isr.on_ack("b", 0, 0)
    isr.maintain()
    assert isr.published() == {"a", "b"}


def test_sync_wait_returns_once_every_member_holds_the_bytes(wait):
    isr, clock, end = make()
    published_pair(isr)
    end[0] = 100
    result = []
    waiter = threading.Thread(target=lambda: result.append(wait(isr, 100)))
    waiter.start()
    isr.on_ack("b", 100, 0)
    waiter.join(5)
    assert result == [2]


def test_flush_sync_waits_for_the_replicas_fsync(wait):
    isr, clock, end = make(flush_sync=True)
    published_pair(isr)
    end[0] = 100
    isr.on_ack("b", 100, 50)  # written, not flushed
    clock.ms += 2000
    with pytest.raises(ReplicationTimeout):
        wait(isr, 100)


def test_connected_replica_that_does_not_confirm_times_the_append_out(wait):
    isr, clock, end = make(timeout_ms=500)
    published_pair(isr)
    end[0] = 100
    clock.ms += 501  # the deadline passes before the replica acknowledges
    with pytest.raises(ReplicationTimeout, match="not acknowledged"):
        wait(isr, 100)


def test_lagging_or_disconnected_replica_leaves_after_publishing_the_smaller_set(wait):
    published = []
    isr, clock, end = make(published=published)
    published_pair(isr)
    end[0] = 1000  # b is now 1000 bytes behind (over the 100 allowed) and does not catch up
    clock.ms += 3001
    isr.on_ack("b", 10, 10)
    isr.maintain()
    assert isr.members() == {"a"} and published[-1] == frozenset({"a"})
    with pytest.raises(ReplicationTimeout, match="shrank"):
        wait(isr, 1000)
    isr.on_ack("b", 1000, 1000)  # caught up: back in
    assert isr.members() == {"a", "b"}
    isr.disconnected("b")
    isr.maintain()
    assert isr.members() == {"a"}


def test_closed_leadership_fails_waiters(wait):
    isr, clock, end = make(min_insync=1)
    isr.connected("b", "h:1")
    isr.on_ack("b", 0, 0)
    end[0] = 10
    isr.close("this node stopped leading epoch 3")
    with pytest.raises(ReplicationTimeout, match="stopped leading"):
        wait(isr, 10)
