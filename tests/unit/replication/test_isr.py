"""The in-sync set and the waits of SYNC-replicated appends (mqstore.replication.isr), on a fake clock."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from types import SimpleNamespace

import pytest

from mqstore import waits
from mqstore.errors import NotEnoughReplicas, ReplicationTimeout
from mqstore.replication.config import ReplicationConfig
from mqstore.replication.isr import InSyncSet
from mqstore.replication.leader import ReplicaSession
from mqstore.model import MessageIn
from mqstore.replication.messages import Ack, Hello
from tests.support.waiting import wait_until
from tests.unit.replication.pair import open_node


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
    """A SYNC append's wait (InSyncSet.wait, its one version): run on a parked thread (mqstore.waits.blocking)
    or awaited on an event loop (the CommitLog's Append on its grpc.aio port); the same outcomes either way."""
    if request.param == "thread":
        return lambda isr, end: waits.blocking(isr.wait(end))
    return lambda isr, end: asyncio.run(isr.wait(end))


def test_replica_joins_when_caught_up_and_is_published_after_the_join_mark():
    published = []
    isr, clock, end = make(published=published)
    with pytest.raises(NotEnoughReplicas):
        isr.require_enough()
    b = isr.connected("b", "h:1")
    end[0] = 500
    isr.on_ack("b", 400, 400, b)
    assert isr.members() == {"a"}                 # behind: not yet in sync
    ends = iter([500, 600])  # an append ends at 600 while b joins: it may have been acked without b
    isr.leader_end = lambda: next(ends)
    isr.on_ack("b", 500, 500, b)
    assert isr.members() == {"a", "b"}            # waited for at once...
    isr.leader_end = lambda: 600
    isr.maintain()
    assert published == [] and isr.published() == {"a"}  # ...electable only once it holds the join mark
    with pytest.raises(NotEnoughReplicas, match=r"joining: \['b'\]"):
        isr.require_enough()  # ...and counted toward the minimum only then (KIP-841)
    isr.on_ack("b", 600, 600, b)
    isr.maintain()
    assert published == [frozenset({"a", "b"})] and isr.published() == {"a", "b"}
    isr.require_enough()


def test_an_acknowledged_append_rests_on_published_copies_only(wait):
    """The failover window: the set is published at {a} (b was shrunk), b catches up again, and a SYNC
    append ends. Until b is published, no election could pick b, so the append must not be acknowledged
    on b's copy: a waiter that got in before the shrink fails instead of being acknowledged."""
    published = []
    isr, clock, end = make(published=published)
    b = published_pair(isr)
    end[0] = 1000
    clock.ms += 3001
    isr.maintain()                         # b lags: published {a}
    assert published[-1] == frozenset({"a"})
    isr.on_ack("b", 1000, 1000, b)          # b caught up: waited for, not yet published
    assert isr.members() == {"a", "b"} and isr.published() == {"a"}
    with pytest.raises(ReplicationTimeout, match="shrank"):
        wait(isr, 1000)                      # held by b, yet not acknowledged: b is not electable
    isr.maintain()                          # b holds its join mark: published
    assert isr.published() == {"a", "b"}
    assert wait(isr, 1000) == 2


def published_pair(isr) -> int:
    """b connected, caught up and published: the set an append may count on. b's stream's generation."""
    b = isr.connected("b", "h:1")
    isr.on_ack("b", 0, 0, b)
    isr.maintain()
    assert isr.published() == {"a", "b"}
    return b


def test_sync_wait_returns_once_every_member_holds_the_bytes(wait):
    isr, clock, end = make()
    b = published_pair(isr)
    end[0] = 100
    result = []
    waiter = threading.Thread(target=lambda: result.append(wait(isr, 100)))
    waiter.start()
    isr.on_ack("b", 100, 0, b)
    waiter.join(5)
    assert result == [2]


def test_flush_sync_waits_for_the_replicas_fsync(wait):
    isr, clock, end = make(flush_sync=True)
    b = published_pair(isr)
    end[0] = 100
    isr.on_ack("b", 100, 50, b)  # written, not flushed
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
    b = published_pair(isr)
    end[0] = 1000  # b is now 1000 bytes behind (over the 100 allowed) and does not catch up
    clock.ms += 3001
    isr.on_ack("b", 10, 10, b)
    isr.maintain()
    assert isr.members() == {"a"} and published[-1] == frozenset({"a"})
    with pytest.raises(ReplicationTimeout, match="shrank"):
        wait(isr, 1000)
    isr.on_ack("b", 1000, 1000, b)  # caught up: back in
    assert isr.members() == {"a", "b"}
    isr.disconnected("b", b)
    isr.maintain()
    assert isr.members() == {"a"}


def test_closed_leadership_fails_waiters(wait):
    isr, clock, end = make(min_insync=1)
    b = isr.connected("b", "h:1")
    isr.on_ack("b", 0, 0, b)
    end[0] = 10
    isr.close("this node stopped leading epoch 3")
    with pytest.raises(ReplicationTimeout, match="stopped leading"):
        wait(isr, 10)


def published_trio(isr) -> tuple[int, int]:
    """b and c connected, caught up and published: three copies, min_insync_replicas 2 (issue 34's setup).
    Their streams' generations."""
    generations = []
    for rid in ("b", "c"):
        generations.append(isr.connected(rid, f"h:{rid}"))
        isr.on_ack(rid, 0, 0, generations[-1])
    isr.maintain()
    assert isr.published() == {"a", "b", "c"}
    return generations[0], generations[1]


def test_an_acknowledged_append_reports_the_copies_that_acknowledged_it_after_they_disconnect(wait, monkeypatch):
    """Issue 34: a SYNC ack said replicas=1 with min_insync_replicas 2, ms after both replication streams
    dropped. Both replicas acknowledge past the append's end, which wakes its waiter; both streams drop before
    the waiter runs (the wake is held back here, as a busy machine holds back a woken thread). The waiter
    finds the watermark past its end and the set still published at three (the shrink waits for maintain):
    it is acknowledged, and must say so with the three copies that hold it, not the one still connected."""
    isr, clock, end = make(timeout_ms=60_000)
    b, c = published_trio(isr)
    end[0] = 100
    held = []
    monkeypatch.setattr("mqstore.replication.isr.waits.wake", held.extend)
    result = []
    waiter = threading.Thread(target=lambda: result.append(wait(isr, 100)))
    waiter.start()
    wait_until(lambda: isr._waiters, "the append to wait for its acknowledgements")
    isr.on_ack("b", 100, 100, b)
    isr.on_ack("c", 100, 100, c)     # the watermark passes 100: the waiter is woken...
    assert len(held) == 1
    isr.disconnected("b", b)
    isr.disconnected("c", c)         # ...and both streams drop before it runs
    monkeypatch.undo()
    waits.wake(held)
    waiter.join(10)
    assert result == [3]
    assert isr.copies(100) == 3      # what an ASYNC append ending there would report too


def test_no_append_is_acknowledged_with_fewer_than_min_insync_copies():
    """Whatever the replicas' connections do after they acknowledged, an append is either refused or
    reported with at least min_insync_replicas copies (each member of the set holds what is acknowledged)."""
    for drop in ([], ["b"], ["c"], ["b", "c"]):
        isr, clock, end = make(timeout_ms=60_000)
        b, c = published_trio(isr)
        end[0] = 100
        isr.on_ack("b", 100, 100, b)
        isr.on_ack("c", 60, 60, c)   # c lags: 100 not yet acknowledged
        assert isr.ready(100) is None
        isr.on_ack("c", 100, 100, c)
        for rid in drop:
            isr.disconnected(rid, {"b": b, "c": c}[rid])
        assert isr.ready(100) == 3, drop
        isr.maintain()               # the dropped ones leave the set
        if len(drop) == 2:
            with pytest.raises(ReplicationTimeout, match="shrank"):
                isr.ready(100)
        else:
            assert isr.ready(100) >= 2, drop


def test_a_new_leadership_counts_no_acknowledgement_of_an_earlier_one():
    """This node led epoch 1 and b acknowledged up to 1000 then; another leader's epoch 2 cut the log back
    to 500 and wrote to 800 (both copied it); this node leads epoch 3 from 800. b's acknowledgement of 1000
    was of bytes that are gone: an append ending at 900 must wait for b's acknowledgement in this epoch,
    not be acknowledged on the old one (it was, with 2 copies of which b held none)."""
    isr, clock, end = make(min_insync=2, timeout_ms=60_000)
    b = published_pair(isr)
    end[0] = 1000
    isr.on_ack("b", 1000, 1000, b)
    isr.disconnected("b", b)
    isr.close("this node stopped leading epoch 1")
    end[0] = 900                     # epoch 3: 800 copied from epoch 2's leader, then an append to 900
    isr.reset(frozenset({"a", "b"}))
    assert isr.ready(900) is None and isr.committed() == 0
    b = isr.connected("b", "h:1")
    isr.on_ack("b", 800, 800, b)
    assert isr.ready(900) is None
    isr.on_ack("b", 900, 900, b)
    assert isr.ready(900) == 2


def test_a_replica_that_reconnects_before_its_old_stream_ends_stays_connected():
    """A replica reconnects within its backoff (50 ms) while the leader's handler of its old stream still
    waits for the next heartbeat (200 ms) to see that stream's end. That end must not mark the replica
    disconnected: it was left out of the set and could not rejoin while its new stream ran."""
    isr, clock, end = make()
    old = published_pair(isr)
    new = isr.connected("b", "h:1")  # the new stream...
    isr.disconnected("b", old)       # ...then the old one's end
    assert [v.connected for v in isr.views()] == [True] and isr.written_by("b") == 0
    end[0] = 100
    isr.on_ack("b", 100, 100, new)
    isr.maintain()
    assert isr.members() == {"a", "b"} and isr.ready(100) == 2
    isr.disconnected("b", new)       # its last stream ends: disconnected, and out at the next check
    isr.maintain()
    assert isr.members() == {"a"} and [v.connected for v in isr.views()] == [False]


def test_an_acknowledgement_read_after_its_streams_leadership_ended_counts_for_nothing():
    """A replica's ack of epoch 1's stream, read once this node leads epoch 3 from a log cut back since."""
    isr, clock, end = make(timeout_ms=60_000)
    node = SimpleNamespace(in_sync=isr, is_leader=True, leadership=SimpleNamespace(epoch=3))
    stale = object.__new__(ReplicaSession)  # the handshake is the other tests' business
    stale.node, stale.epoch, stale.hello = node, 1, SimpleNamespace(replica_id="b", address="h:1")
    stale.generation = isr.connected("b", "h:1")  # its stream is still b's newest
    isr.reset(frozenset({"a", "b"}))
    end[0] = 900
    stale.ack(Ack(1000, 1000))
    assert isr.ready(900) is None
    current = object.__new__(ReplicaSession)
    current.node, current.epoch, current.hello = node, 3, stale.hello
    current.generation = isr.connected("b", "h:1")
    current.ack(Ack(900, 900))
    assert isr.ready(900) == 2


def test_waiting_and_peak_counts_the_appends_waiting_now_and_the_most_at_once_this_second_or_the_last():
    """What a replication stream's linger expects (mqstore.replication.leader): how many SYNC appends wait
    now, and the most that waited at once lately."""
    isr, clock, end = make()
    b = published_pair(isr)
    end[0] = 300
    clock.ms = 2_000_000  # each monotonic read lets 100 ms pass: the parks and reads below stay in one second
    for e in (100, 200, 300):
        isr._ready_or_park(e, 1e12, waits.ThreadWaiter())
    assert isr.waiting_and_peak() == (3, 3)
    isr.on_ack("b", 300, 0, b)
    assert isr.waiting_and_peak() == (0, 3)
    clock.ms = 2_001_500  # the next second: the last one's peak still counts
    assert isr.waiting_and_peak() == (0, 3)
    clock.ms = 2_003_000  # two seconds on: forgotten
    assert isr.waiting_and_peak() == (0, 0)


def replica_stream(store, node, replica_id: str, end_offset: int):
    """A session of the leader ``node`` for a replica whose log ends at ``end_offset``, and its data, opened:
    the replica connected and its first data message sent."""
    hello = Hello(replica_id, f"h:{replica_id}", end_offset, store.log_min(), node.history,
                  store.config.segment_size_bytes)
    session = ReplicaSession(store, node, hello)
    data = waits.blocking_iter(session.data_async())
    next(data)
    return session, data


def test_a_replica_that_lost_an_acknowledged_tail_counts_only_what_its_hello_says(small_config, tmp_path):
    """c acknowledged up to E1 (written, not flushed) on its stream, then lost [E0, E1) (a power cut) and
    reconnected with its log ending at E0, before the leader's ISR duty noticed it had gone. Until c
    acknowledges on its new stream, its ack from before must count for nothing: the append ending at E1 must
    wait for c, and report only the copies holding it (a and b). It was acknowledged with 3 copies on c's
    pre-crash ack."""
    store, node = open_node(small_config, tmp_path, "a")
    node.become_leader(1, frozenset({"a", "b", "c"}))
    isr = node.in_sync
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x" * 100)], replication="ASYNC")
    e0 = store.log_end()
    store.append("t", [MessageIn(body=b"y" * 100)], replication="ASYNC")
    e1 = store.log_end()
    c_before, data = replica_stream(store, node, "c", e0)
    c_before.ack(Ack(e1, e1))
    data.close()                     # c's crash: its stream ends
    b, b_data = replica_stream(store, node, "b", e1)
    c_after, c_data = replica_stream(store, node, "c", e0)  # c is back, holding [.., e0): the welcome's truncate_to
    b.ack(Ack(e1, e1))
    assert isr.members() == {"a", "b", "c"}  # no maintain ran since c went
    assert isr.ready(e1) is None and isr.copies(e1) == 2 and isr.committed() == e0
    c_after.ack(Ack(e1, e1))         # c copied it again
    assert isr.ready(e1) == 3
    b_data.close()
    c_data.close()
    store.stop()


@pytest.mark.parametrize("old_stream_ended", [False, True], ids=["old-stream-open", "old-stream-ended"])
def test_an_acknowledgement_of_a_replicas_superseded_stream_counts_for_nothing(small_config, tmp_path,
                                                                               old_stream_ended):
    """c was sent [E0, E1) on its stream and acknowledged it; before the leader read that acknowledgement, c lost
    [E0, E1) (a power cut) and opened a new stream holding [.., E0). The leader reads the old stream's ack only
    now (its reader runs on until that stream's end is seen, or has it buffered still). It must count for
    nothing: a SYNC append ending at E1 waits on, c's progress stays at E0 (what its new hello says), and the
    append is acknowledged once c acknowledges on its new stream. It was acknowledged at the late ack, said
    held by 3 copies while c held only [.., E0)."""
    store, node = open_node(small_config, tmp_path, "a")
    node.become_leader(1, frozenset({"a", "b", "c"}))
    isr = node.in_sync
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x" * 100)], replication="ASYNC")
    e0 = store.log_end()
    results = []

    def append_sync():
        try:
            results.append(store.append("t", [MessageIn(body=b"y" * 100)], replication="SYNC"))
        except ReplicationTimeout as exc:  # the test failed before c acknowledged: its finally closed the set
            results.append(exc)

    appender = threading.Thread(target=append_sync)
    appender.start()
    try:
        wait_until(lambda: isr.waiting() == 1, "the SYNC append to wait for its replicas")
        e1 = store.log_end()              # each stream below is sent [E0, E1) as it opens
        c_old, c_old_data = replica_stream(store, node, "c", e0)
        c_old.ack(Ack(e0, e0))           # read in time: c holds E0...
        # ...and its ack of E1 on this stream is on its way
        c_new, c_new_data = replica_stream(store, node, "c", e0)  # c lost [E0, E1), is back: its hello says E0
        b, b_data = replica_stream(store, node, "b", e0)
        b.ack(Ack(e1, e1))
        if old_stream_ended:
            c_old_data.close()
        c_old.ack(Ack(e1, e1))           # read late: from the superseded stream
        assert isr.waiting() == 1 and not results  # the append still waits for c
        assert isr.ready(e1) is None and isr.copies(e1) == 2 and isr.committed() == e0
        assert [(v.replica_id, v.written_offset, v.connected) for v in isr.views()] == \
            [("b", e1, True), ("c", e0, True)]
        c_old_data.close()               # the old stream's end (again, or now): c's new stream stays connected
        assert [v.connected for v in isr.views()] == [True, True]
        c_new.ack(Ack(e1, e1))           # c copied it again, on its new stream
        appender.join(10)
        assert [r.replicas for r in results[0]] == [3]
        b_data.close()
        c_new_data.close()
    finally:
        isr.close("the test ended")      # a waiting append fails rather than outliving the test
        appender.join(10)
        store.stop()


def test_a_replica_whose_newest_stream_ended_is_disconnected_though_an_older_one_is_not_yet(small_config, tmp_path):
    """b reconnected before the leader saw its old stream end, then its new stream ended too. Only the newest
    stream speaks for b (the old one's acknowledgements are ignored): b is disconnected, and leaves the set at
    the next check, though the old stream's end is not seen yet; that end, seen later, changes nothing. It
    stayed connected on the old stream, a member waited for, until isr_max_lag_ms."""
    store, node = open_node(small_config, tmp_path, "a")
    node.become_leader(1, frozenset({"a", "b"}))
    isr = node.in_sync
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x" * 100)], replication="ASYNC")
    e0 = store.log_end()
    store.append("t", [MessageIn(body=b"y" * 100)], replication="ASYNC")
    e1 = store.log_end()
    old, old_data = replica_stream(store, node, "b", e0)
    new, new_data = replica_stream(store, node, "b", e0)
    new.ack(Ack(e1, e1))
    new_data.close()                 # the newest stream's end is seen first
    assert [(v.written_offset, v.connected) for v in isr.views()] == [(e1, False)] and isr.written_by("b") == -1
    isr.maintain()
    assert isr.members() == {"a"}
    old_data.close()
    isr.maintain()
    assert isr.members() == {"a"} and [v.connected for v in isr.views()] == [False]
    store.stop()


@pytest.mark.parametrize("flush_sync", [False, True])
def test_the_kept_watermark_is_what_the_members_hold_after_every_change(flush_sync):
    """The watermark is kept (computed at each change of a member's offsets or of the members, not at each
    look): after random connections (some cutting a replica back to what its hello holds), acknowledgements
    (some of superseded streams), stream ends, maintains, leaderships and appends, from a printed seed, the
    committed offset is what the members' views say: the least offset every member but the leader holds.
    Rerun a seed with MQSTORE_SEED=<n>."""
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    print(f"MQSTORE_SEED={seed}")
    rng = random.Random(seed)
    isr, clock, end = make(min_insync=1, lag_ms=300, flush_sync=flush_sync)
    generations: dict[str, list[int]] = {"b": [], "c": [], "d": []}
    for step in range(1000):
        rid = rng.choice(sorted(generations))
        op = rng.randrange(7)
        if op == 0:
            acked = max([v.written_offset for v in isr.views() if v.replica_id == rid], default=0)
            holds = rng.choice([None, max(0, acked - rng.randrange(50))])  # often below what it acknowledged
            generations[rid].append(isr.connected(rid, "h:1", holds))
        elif op == 1 and generations[rid]:
            generation = rng.choice(generations[rid][-2:])
            written = rng.choice([end[0], rng.randrange(max(0, end[0] - 150), end[0] + 1)])  # caught up: joins
            isr.on_ack(rid, written, rng.randrange(written + 1), generation)
        elif op == 2 and generations[rid]:
            isr.disconnected(rid, rng.choice(generations[rid][-2:]))
        elif op == 3:
            clock.ms += rng.choice([0, 100, 400])
            isr.maintain()
        elif op == 4 and rng.random() < 0.1:
            isr.reset(frozenset({"a"} | {r for r in generations if rng.random() < 0.5}))
        else:
            end[0] += rng.randrange(200)
        views = {v.replica_id: v for v in isr.views()}
        held = [views[r].flushed_offset if flush_sync else views[r].written_offset for r in isr.members() - {"a"}]
        assert isr.committed() == min([end[0], *held]), (step, op, rid)
