"""The compactor's projection: compaction topics only, idempotent replays, a durable checkpoint as the
resume point, a hold on the commit log's retention, and a gap that stops it (never skipped)."""

from __future__ import annotations

import pytest

from compactor_service.projection import CHECKPOINT, CompactionProjection, HoldingSource, compactor_follower
from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.errors import DataLoss, OutOfRange
from mqstore.follow import FollowConfig, GapPolicy
from mqstore.model import TailFrame
from tests.support.compaction import BASE_MS, raw
from tests.support.waiting import wait_until

KINDS = {"kv": "COMPACTION", "plain": "NORMAL"}


def _projection(tmp_path, clock):
    store = CompactionStore(tmp_path / "logs", CompactionConfig(), clock)
    return store, CompactionProjection(store, lambda: KINDS, tmp_path / "cp", clock, checkpoint_interval_ms=1000)


def test_only_compaction_topics_are_applied_and_replays_are_harmless(tmp_path):
    clock = FakeClock(BASE_MS)
    store, projection = _projection(tmp_path, clock)
    records = raw("a", b"1", 0, BASE_MS) + raw("x", b"n", 0, BASE_MS, topic="plain") + raw("a", b"2", 1, BASE_MS)
    for _ in range(2):  # the same frame again after a reconnect
        projection.apply(TailFrame(records, 3, 1000, 1000))
    assert len(store.slot("kv", 0).qlog.entries) == 2 and store.topics() == ["kv"]
    assert projection.resume_offset() is None  # nothing durable yet: the stream re-opens from the start
    clock.advance(1000)
    projection.apply(TailFrame(b"", 0, 1200, 1200))
    assert projection.resume_offset() == 1200 and CHECKPOINT.load(tmp_path / "cp").next_physical_offset == 1200
    damaged = bytearray(records)
    damaged[88] ^= 0xFF  # the first record's body: its CRC fails
    with pytest.raises(DataLoss):
        projection.apply(TailFrame(bytes(damaged), 3, 2000, 2000))
    store.close()


def test_the_follower_stops_at_a_gap_and_holds_retention(tmp_path):
    clock = FakeClock(BASE_MS)
    store, projection = _projection(tmp_path, clock)
    projection.apply(TailFrame(raw("a", b"1", 0, BASE_MS), 1, 500, 500))
    clock.advance(1000)
    projection.checkpoint()
    calls = []

    class GoneLog:  # retention deleted [500, 4096) before the compactor applied it
        def tail(self, start, *, max_frame_bytes, heartbeat_ms, hold_retention_as=""):
            calls.append((start, hold_retention_as))
            raise OutOfRange("gone", min_value=4096, max_value=9000)

    follower = compactor_follower(projection, HoldingSource(GoneLog()), FollowConfig(backoff_initial_ms=5,
                                                                                     backoff_max_ms=20))
    assert follower.gap_policy is GapPolicy.STOP
    follower.start()
    try:
        wait_until(lambda: follower.state().gap is not None, "the follower to stop at the gap")
        assert "cannot be rebuilt" in follower.problem()
        assert projection.resume_offset() == 500 and calls[0] == (500, "compactor")
    finally:
        follower.stop()
        store.close()
