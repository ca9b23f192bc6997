"""RetentionHolds (mqstore.retention_holds): a hold lives while its stream is open, then for a grace period
(a user's) or retention_hold_max_ms (the internal identity's, durable); an open stream that stops
refreshing lapses after retention_hold_max_ms; the listing says when each lapses. Times are given, as
the store's clock would give them."""

from __future__ import annotations

import os

import pytest

from mqstore import retention_holds, tailing
from mqstore.model import MessageIn
from mqstore.retention_holds import COMPACTOR, RetentionHolds
from mqstore.store_parts import build_store

MAX, GRACE = 10_000, 1_000


def test_a_users_hold_ends_a_grace_period_after_its_stream_closes():
    holds = RetentionHolds(MAX, GRACE)
    holds.open("backup", 500, 0, durable=False)
    holds.refresh("backup", 5_000)
    assert holds.low(9_000) == 500  # open: held, however long ago it opened
    holds.close("backup", 9_000)
    assert holds.low(9_000 + GRACE) == 500  # within the grace
    assert holds.low(9_000 + GRACE + 1) is None and holds.listing(20_000) == []


def test_a_durable_hold_outlives_its_stream_for_retention_hold_max_ms():
    holds = RetentionHolds(MAX, GRACE)
    holds.open(COMPACTOR, 700, 0, durable=True)
    holds.close(COMPACTOR, 100)
    assert holds.low(100 + GRACE + 1) == 700  # a compactor restarting keeps its hold past any grace
    assert holds.low(100 + MAX) == 700
    assert holds.low(100 + MAX + 1) is None


def test_an_open_stream_that_stops_refreshing_lapses_after_retention_hold_max_ms():
    holds = RetentionHolds(MAX, GRACE)
    holds.open("stuck", 10, 0, durable=True)
    holds.refresh("stuck", 2_000)
    assert holds.low(2_000 + MAX) == 10
    assert holds.low(2_000 + MAX + 1) is None
    holds.refresh("stuck", 2_000 + MAX + 2)  # a lapsed hold stays lapsed until a stream opens it again
    assert holds.low(2_000 + MAX + 3) is None


def test_the_grace_is_never_longer_than_retention_hold_max_ms():
    holds = RetentionHolds(MAX, grace_ms=10 * MAX)
    holds.open("x", 1, 0, durable=False)
    holds.close("x", 0)
    assert holds.low(MAX + 1) is None


def test_two_streams_of_one_name_hold_from_the_lower_start_until_both_close():
    holds = RetentionHolds(MAX, GRACE)
    holds.open("f", 900, 0, durable=False)
    holds.open("f", 300, 0, durable=False)
    holds.close("f", 10)
    [info] = holds.listing(10)
    assert (info.physical_offset, info.open_streams, info.closed_ms) == (300, 1, 0)
    assert holds.low(10 + 5 * GRACE) == 300  # one is still open: no grace runs
    holds.close("f", 20)
    holds.close("f", 30)  # an extra close changes nothing
    [info] = holds.listing(20)
    assert (info.open_streams, info.closed_ms, info.lapses_at_ms) == (0, 20, 20 + GRACE)
    holds.open("f", 800, 40, durable=False)  # reopened in its grace: held from the new stream's start
    assert holds.low(40 + 5 * GRACE) == 800


def test_the_listing_says_whether_open_and_when_each_hold_lapses():
    holds = RetentionHolds(MAX, GRACE)
    holds.open("a-user", 5, 100, durable=False)
    holds.open(COMPACTOR, 7, 100, durable=True)
    holds.refresh(COMPACTOR, 300)
    holds.close("a-user", 200)
    listed = {h.name: h for h in holds.listing(400)}
    assert (listed["a-user"].open_streams, listed["a-user"].durable, listed["a-user"].lapses_at_ms) == \
        (0, False, 200 + GRACE)
    assert (listed[COMPACTOR].open_streams, listed[COMPACTOR].refreshed_ms, listed[COMPACTOR].lapses_at_ms) == \
        (1, 300, 300 + MAX)


@pytest.fixture
def open_store(small_config):
    stores = []

    def make(clock=None, **overrides):
        stores.append(build_store(small_config(**overrides), clock))
        stores[-1].start()
        return stores[-1]
    yield make
    for store in stores:
        store.stop()


def test_the_store_ends_a_users_hold_after_the_grace_and_deletes_what_it_held(open_store, fake_clock):
    store = open_store(clock=fake_clock, segment_size_bytes=8192, retention_ms=3_600_000,
                       retention_hold_max_ms=10 * 3_600_000, retention_hold_grace_ms=60_000,
                       clean_interval_ms=100 * 3_600_000)
    store.topic_admin.create("t", 1)
    for i in range(20):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.flusher.flush_now()
    frames = tailing.tail(store, "offset", 0, [], 0, 0, is_active=lambda: True, hold_retention_as="backup")
    next(frames)
    assert [(h.name, h.open_streams) for h in store.retention.list_holds()] == [("backup", 1)]
    frames.close()  # the stream ends: the grace starts
    assert [(h.name, h.open_streams, h.durable) for h in store.retention.list_holds()] == [("backup", 0, False)]
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))
    assert store.retention.delete_expired_segments() == 0  # within the grace: still held
    fake_clock.advance(60_001)
    assert store.retention.delete_expired_segments() >= 1 and store.retention.list_holds() == []


def test_an_open_durable_hold_stays_durable_when_a_users_stream_of_its_name_joins():
    holds = RetentionHolds(MAX, GRACE)
    holds.open(COMPACTOR, 100, 0, durable=True)
    holds.open(COMPACTOR, 50, 0, durable=False)
    holds.close(COMPACTOR, 10)
    holds.close(COMPACTOR, 20)
    assert holds.low(20 + GRACE + 1) == 50
    holds.open(COMPACTOR, 70, 30, durable=False)  # reopened by a user alone: a user's hold
    holds.close(COMPACTOR, 40)
    assert holds.low(40 + GRACE + 1) is None


def test_each_of_several_compactors_holds_under_its_own_name_with_the_compactors_floor():
    assert retention_holds.instance_hold("a") == "compactor-a"
    assert retention_holds.is_compactor("compactor") and retention_holds.is_compactor("compactor-a")
    assert not retention_holds.is_compactor("txn") and not retention_holds.is_compactor("compactorx")
    holds = RetentionHolds(max_hold_ms=10_000)
    holds.open("compactor-a", 100, 0, durable=True)
    holds.open("compactor-b", 500, 0, durable=True)
    assert sorted(holds.names()) == ["compactor-a", "compactor-b"]
    assert holds.low(1, {name: 300 for name in holds.names()}) == 300  # a's hold lifted to the floor


def test_a_compactor_instances_hold_keeps_nothing_while_there_is_no_compaction_topic(open_store, fake_clock):
    """``compactor-<id>`` (several compactors, --etcd-endpoints) has the compactor's floor: with no COMPACTION
    topic it keeps no segment (before, only the name ``compactor`` had it, and an instance's hold kept all)."""
    store = open_store(clock=fake_clock, segment_size_bytes=8192, retention_ms=3_600_000,
                       retention_hold_max_ms=10 * 3_600_000, clean_interval_ms=100 * 3_600_000)
    store.topic_admin.create("t", 1)
    for i in range(20):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.flusher.flush_now()
    frames = tailing.tail(store, "offset", 0, [], 0, 0, is_active=lambda: True,
                          hold_retention_as=retention_holds.instance_hold("a"))
    next(frames)
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))
    try:
        assert store.retention.delete_expired_segments() >= 1
    finally:
        frames.close()
