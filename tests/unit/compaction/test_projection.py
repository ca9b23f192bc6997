"""The compactor's projection (mqstore.compaction.projection): compaction topics only, idempotent replays, a
durable checkpoint as the resume point, a gap that stops it (never skipped unless it can hold no record of
a compaction topic), and a deleted topic: its DELETED event drops its logs, and records below a topic's
start are not the topic's. The hold on the commit log's retention: tests/unit/compactor/test_tail.py."""

from __future__ import annotations

import threading

import pytest

from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.projection import CHECKPOINT, CompactionProjection, compactor_follower
from mqstore.compaction.store import CompactionStore
from mqstore.errors import DataLoss, OutOfRange
from mqstore.follow import FollowConfig, GapPolicy
from mqstore.format import record, topic_event
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, TailFrame, TopicRecord
from tests.support import records as rec
from tests.support.compaction import BASE_MS, raw
from tests.support.waiting import wait_until

TOPICS = {"kv": TopicRecord("kv", 1, KIND_COMPACTION, 0, 0), "plain": TopicRecord("plain", 1, KIND_NORMAL, 0, 0)}


def _projection(tmp_path, clock, topics=TOPICS):
    store = CompactionStore(tmp_path / "logs", CompactionConfig(), clock)
    return store, CompactionProjection(store, lambda: dict(topics), tmp_path / "cp", clock,
                                       checkpoint_interval_ms=1000)


def _kv(key: str, value: bytes, queue_offset: int, physical_offset: int) -> bytes:
    return rec.encode(topic=b"kv", body=value, properties=record.encode_properties({"KEYS": key}),
                      queue_offset=queue_offset, physical_offset=physical_offset, store_timestamp_ms=BASE_MS)


def _deleted(name: str, start: int, physical_offset: int) -> bytes:
    body = topic_event.encode(topic_event.TopicEvent(topic_event.DELETED, name, start))
    return rec.encode(topic=topic_event.TOPIC.encode(), body=body, properties=record.encode_properties({"KEYS": name}),
                      physical_offset=physical_offset)


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
        def tail(self, start, *, max_frame_bytes, heartbeat_ms):
            calls.append(start)
            raise OutOfRange("gone", min_value=4096, max_value=9000)

    follower = compactor_follower(projection, GoneLog(), FollowConfig(backoff_initial_ms=5, backoff_max_ms=20))
    assert follower.gap_policy is GapPolicy.STOP
    follower.start()
    try:
        wait_until(lambda: follower.state().gap is not None, "the follower to stop at the gap")
        assert "cannot be rebuilt" in follower.problem()
        assert projection.resume_offset() == 500 and calls[0] == 500
    finally:
        follower.stop()
        store.close()


def test_a_deleted_topic_is_dropped_in_log_order_and_its_old_records_never_come_back(tmp_path):
    clock = FakeClock(BASE_MS)
    topics = dict(TOPICS)
    store, projection = _projection(tmp_path, clock, topics)
    old = _kv("a", b"old-1", 0, 100) + _kv("b", b"old-2", 1, 200)
    projection.apply(TailFrame(old, 2, 300, 300))
    assert store.slot("kv", 0).qlog.next_offset() == 2 and (tmp_path / "logs" / "kv").is_dir()
    # kv is deleted (its event at 300) and created again at 400: the registry now says start 400.
    topics["kv"] = TopicRecord("kv", 1, KIND_COMPACTION, 0, 0, start_physical_offset=400)
    frame = old + _deleted("kv", 0, 300) + _kv("c", b"new", 0, 400)
    for _ in range(2):  # and the same again, as after a crash before the checkpoint
        projection.apply(TailFrame(frame, 4, 500, 500))
        qlog = store.slot("kv", 0).qlog
        assert [s.entry.queue_offset for s in qlog.read(0, 10)] == [0] and set(qlog.latest) == {"c"}
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["kv"]
    store.close()


def test_records_below_a_topics_start_are_skipped_before_its_event_is_met(tmp_path):
    """A compactor that was away: the registry already names the new topic; the old records (below its
    start) are skipped at once, so no old value shows up even for a moment."""
    clock = FakeClock(BASE_MS)
    topics = dict(TOPICS, kv=TopicRecord("kv", 1, KIND_COMPACTION, 0, 0, start_physical_offset=400))
    store, projection = _projection(tmp_path, clock, topics)
    projection.apply(TailFrame(_kv("a", b"old", 0, 100), 1, 300, 300))
    assert store.topics() == []
    projection.apply(TailFrame(_deleted("kv", 0, 300) + _kv("c", b"new", 0, 400), 2, 500, 500))
    assert set(store.slot("kv", 0).qlog.latest) == {"c"}
    store.close()


def test_an_event_that_does_not_decode_stops_the_projection(tmp_path):
    store, projection = _projection(tmp_path, FakeClock(BASE_MS))
    bad = rec.encode(topic=topic_event.TOPIC.encode(), body=b"nonsense", physical_offset=0)
    with pytest.raises(DataLoss, match="does not decode"):
        projection.apply(TailFrame(bad, 1, 100, 100))
    store.close()


def test_a_gap_holding_no_compaction_record_is_skipped_and_the_deleted_topics_dropped(tmp_path):
    """Away while kv was deleted (and created again at 5000): retention kept no log for it, the gap
    [500, 4096) can hold nothing of kv as it is now, so it is skipped and the old kv logs dropped."""
    clock = FakeClock(BASE_MS)
    topics = dict(TOPICS)
    store, projection = _projection(tmp_path, clock, topics)
    projection.apply(TailFrame(_kv("a", b"old", 0, 100), 1, 500, 500))
    clock.advance(1000)
    projection.checkpoint()
    topics["kv"] = TopicRecord("kv", 1, KIND_COMPACTION, 0, 0, start_physical_offset=5000)
    opened = []

    class Stream:  # its frames, then open (quiet) until cancelled
        def __init__(self, frames):
            self.frames, self.cancelled = frames, threading.Event()

        def __iter__(self):
            yield from self.frames
            self.cancelled.wait(10)

        def cancel(self):
            self.cancelled.set()

    class ShortLog:
        def tail(self, start, *, max_frame_bytes, heartbeat_ms):
            opened.append(start)
            if start < 4096:
                raise OutOfRange("gone", min_value=4096, max_value=9000)
            return Stream([TailFrame(_kv("c", b"new", 0, 5000), 1, 5500, 9000)] if start < 5500 else [])

    follower = compactor_follower(projection, ShortLog(), FollowConfig(backoff_initial_ms=5, backoff_max_ms=20))
    follower.start()
    try:
        wait_until(lambda: projection.stats()[1] == 2, "the follower to go on after the gap")
        assert follower.state().gap is None and follower.problem() == "" and opened[:2] == [500, 4096]
        assert set(store.slot("kv", 0).qlog.latest) == {"c"}
    finally:
        follower.stop()
        store.close()


def test_the_first_frame_since_start_drops_the_logs_of_topics_deleted_meanwhile(tmp_path):
    """Back after being away (or a crash inside a drop): the registry no longer has kv as held (deleted and
    created again at 400) nor gone (deleted): their logs go at the first frame, not when the follower meets
    their DELETED events again; a topic held as it is now stays."""
    clock = FakeClock(BASE_MS)
    before = dict(TOPICS, gone=TopicRecord("gone", 1, KIND_COMPACTION, 0, 0),
                  keep=TopicRecord("keep", 1, KIND_COMPACTION, 0, 0))
    store, projection = _projection(tmp_path, clock, before)
    projection.apply(TailFrame(_kv("a", b"old", 0, 100) + raw("b", b"1", 0, BASE_MS, topic="gone")
                               + raw("c", b"2", 0, BASE_MS, topic="keep"), 3, 300, 300))
    store.close()
    back = dict(TOPICS, kv=TopicRecord("kv", 1, KIND_COMPACTION, 0, 0, start_physical_offset=400),
                keep=TopicRecord("keep", 1, KIND_COMPACTION, 0, 0))
    again, restarted = _projection(tmp_path, clock, back)
    assert again.topics() == ["gone", "keep", "kv"]  # as held on disk
    restarted.apply(TailFrame(b"", 0, 300, 9000))  # a heartbeat: the commit log answers
    assert again.topics() == ["keep"] and sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["keep"]
    again.close()
