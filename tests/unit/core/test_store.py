"""MessageStore behaviour on real files, in one process: durability, visibility, retention, read-only
mode, topic rules, pull/tail/time lookups."""

from __future__ import annotations

import os
import threading
import types

import pytest

from mqstore import store_offsets, tailing
from mqstore.errors import (FailedPrecondition, InvalidArgument, NotFound, OutOfRange, ResourceExhausted)
from mqstore.format import record_reader
from mqstore.hot_reads import pull_at_once, records_at_once
from mqstore.model import MessageIn, TAIL_AT_OFFSET, TAIL_EARLIEST, TAIL_LATEST
from mqstore.store_parts import build_store
from tests.support.waiting import wait_until


@pytest.fixture
def open_store(small_config):
    stores = []

    def make(clock=None, **overrides):
        store = build_store(small_config(**overrides), clock)
        store.start()
        stores.append(store)
        return store
    yield make
    for store in stores:
        store.stop()


def test_durability_reported_per_mode(open_store, tmp_path):
    sync = open_store(flush_mode="SYNC")
    sync.topic_admin.create("t")
    assert {r.durability for r in sync.append("t", [MessageIn(body=b"a")] * 3)} == {"FLUSHED"}
    assert sync.flusher.flushed_offset >= sync.commitlog.written_offset


def test_async_append_is_written_then_flushed(open_store):
    store = open_store(flush_interval_ms=60_000, flush_thorough_interval_ms=60_000)
    store.topic_admin.create("t")
    result = store.append("t", [MessageIn(body=b"a")])[0]
    assert result.durability == "WRITTEN"
    store.flusher.flush_now()
    assert store.append("t", [MessageIn(body=b"b")])[0].durability == "WRITTEN"


def test_sync_consumers_see_only_flushed(open_store, fake_clock):
    store = open_store(flush_mode="SYNC", flush_interval_ms=60_000)
    store.topic_admin.create("t", 1)
    rec = store.topic_admin.get("t")
    batch = store.encoder.encode_batch(rec, [MessageIn(body=b"unflushed")], fake_clock.now_ms())
    store.commitlog.append(batch)  # written, nobody asked for an fsync yet
    assert store.queue_info("t", 0).max_offset == 0
    assert store.pull("t", 0, 0).messages == []
    store.flusher.flush_now()
    assert [m.record.body for m in store.pull("t", 0, 0).messages] == [b"unflushed"]


def test_batch_is_all_or_nothing(open_store):
    store = open_store()
    store.topic_admin.create("t", 1)
    good = MessageIn(body=b"ok")
    with pytest.raises(InvalidArgument, match=r"messages\[1\]\.body"):
        store.append("t", [good, MessageIn(body=b"x" * ((4 << 20) + 1))])
    with pytest.raises(InvalidArgument, match="reserved"):
        store.append("t", [good, MessageIn(body=b"x", properties={"a": "b\x01"})])
    with pytest.raises(InvalidArgument, match="1000"):
        store.append("t", [good] * 1001)
    assert store.commitlog.written_offset == 0 and store.queue_info("t", 0).max_offset == 0


def test_consecutive_queue_offsets_and_key_routing(open_store):
    store = open_store()
    store.topic_admin.create("t", 4)
    results = store.append("t", [MessageIn(body=b"x", sharding_key="order-7") for _ in range(50)])
    assert len({r.queue_id for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(50))
    store.topic_admin.create("c", 4, kind="COMPACTION")
    a = store.append("c", [MessageIn(body=b"v1", keys=("user-1",))])[0]
    b = store.append("c", [MessageIn(body=b"", keys=("user-1",))])[0]  # tombstone allowed here
    assert a.queue_id == b.queue_id
    with pytest.raises(InvalidArgument, match="needs a key"):
        store.append("c", [MessageIn(body=b"v")])
    with pytest.raises(InvalidArgument, match="empty"):
        store.append("t", [MessageIn(body=b"")])


def test_store_timestamps_never_go_backwards(open_store, fake_clock):
    store = open_store(clock=fake_clock)
    store.topic_admin.create("t", 1)
    first = store.append("t", [MessageIn(body=b"a")])[0]
    fake_clock.advance(-5_000)
    second = store.append("t", [MessageIn(body=b"b")])[0]
    assert second.store_timestamp_ms == first.store_timestamp_ms


def test_pull_ranges_filters_and_long_poll(open_store):
    store = open_store()
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=bytes([i]), tags="even" if i % 2 == 0 else "odd") for i in range(10)])
    got = store.pull("t", 0, 0, max_messages=100, tags=["even"])
    assert [m.record.body[0] for m in got.messages] == [0, 2, 4, 6, 8] and got.next_offset == 10
    with pytest.raises(OutOfRange, match=r"\[0, 10\]"):
        store.pull("t", 0, 11)
    with pytest.raises(InvalidArgument, match="offset is -1"):
        store.pull("t", 0, -1)
    with pytest.raises(NotFound):
        store.pull("t", 1, 0)
    with pytest.raises(NotFound, match="create it first"):
        store.pull("nope", 0, 0)
    assert store.pull("t", 0, 10).messages == []
    holder = {}
    waiter = threading.Thread(target=lambda: holder.update(r=store.pull("t", 0, 10, long_poll_ms=10_000)))
    waiter.start()
    store.append("t", [MessageIn(body=b"late")])
    waiter.join(15)
    assert [m.record.body for m in holder["r"].messages] == [b"late"]
    one = store.pull("t", 0, 0, max_messages=5, max_bytes=1)
    assert len(one.messages) == 1  # the first message is always returned


def test_which_pulls_and_reads_answer_at_once(open_store):
    """mqstore.hot_reads' pull_at_once and records_at_once over a store: what an event loop may run (the CommitLog
    port's Pull and GetMessage(s)): records in the two segments up to the one written now and entries in the
    queue's last two files, no long poll that waits, no filter, not too many messages; a refused pull at once too."""
    store = open_store(segment_size_bytes=4096, cq_entries_per_file=8)
    store.topic_admin.create("t", 1)
    for i in range(40):  # ~300 bytes a record: ~13 a segment, 40 entries in 5 queue files
        store.append("t", [MessageIn(body=bytes([i]) * 200)])
    wait_until(lambda: store.visible_offset() >= store.log_end(), "every record visible")
    end = store.queue_info("t", 0).max_offset
    assert pull_at_once(store, "t", 0, end - 1) and pull_at_once(store, "t", 0, end - 1, long_poll_ms=5000)
    assert not pull_at_once(store, "t", 0, 0)  # the first segment and queue file: cold
    assert not pull_at_once(store, "t", 0, end - 1, filtered=True)
    assert not pull_at_once(store, "t", 0, end - 1, max_messages=257)
    assert pull_at_once(store, "t", 0, end) and not pull_at_once(store, "t", 0, end, long_poll_ms=1)  # it would wait
    assert pull_at_once(store, "t", 0, end + 1) and pull_at_once(store, "nope", 0, 0)  # refused at once
    assert pull_at_once(store, "t", -1, 0) and pull_at_once(store, "t", 1, 0)  # no such queue: refused at once
    assert pull_at_once(store, "a/b", 0, 0)  # a name no topic can have: refused at once (InvalidArgument)
    for queue_id, topic, refused in ((-1, "t", InvalidArgument), (1, "t", NotFound), (0, "a/b", InvalidArgument)):
        with pytest.raises(refused):
            store.pull(topic, queue_id, 0)
    last = store.pull("t", 0, end - 1).messages[0].record.physical_offset
    first = store.pull("t", 0, 0).messages[0].record.physical_offset
    assert records_at_once(store, [last, last]) and not records_at_once(store, [last, first])
    # A segment created ahead of the writer is not one of the two: the one before the writer's still is
    written = store.commitlog.written_offset
    store.segments.ensure(written - written % 4096 + 2 * 4096, 0)
    assert store.commitlog.is_hot(written - written % 4096 - 1) and not store.commitlog.is_hot(
        written - written % 4096 - 4096 - 1)


def test_get_message_and_ids(open_store):
    store = open_store()
    store.topic_admin.create("t", 1)
    res = store.append("t", [MessageIn(body=b"hello", keys=("k",), properties={"p": "v"})])[0]
    msg = store.get_message_by_id(res.msg_id)
    assert msg.record.body == b"hello" and msg.keys == ["k"] and msg.record.properties["p"] == "v"
    assert msg.uniq_key == res.uniq_key and len(res.uniq_key) == 32
    assert store.get_message(res.physical_offset).msg_id == res.msg_id
    with pytest.raises(InvalidArgument):
        store.get_message_by_id("zz")
    with pytest.raises(NotFound):
        store.get_message(res.physical_offset + 1)
    with pytest.raises(OutOfRange):
        store.get_message(10**12)


def test_tail_frames_whole_records_with_filter(open_store):
    store = open_store(segment_size_bytes=8192)
    store.topic_admin.create("a", 1)
    store.topic_admin.create("b", 1)
    for i in range(20):
        store.append("a" if i % 3 else "b", [MessageIn(body=bytes([i]) * 700)])
    end = store.commitlog.written_offset
    frames = tailing.tail(store, TAIL_EARLIEST, 0, ["b"], 4096, 10, is_active=lambda: True)
    seen = []
    for frame in frames:
        if frame.record_count == 0:
            assert frame.next_physical_offset == end
            break
        views = list(record_reader.records(frame.records))
        seen += [view.body[0] for view in views]
        assert sum(view.size for view in views) == len(frame.records)
    assert seen == [i for i in range(20) if i % 3 == 0]
    with pytest.raises(InvalidArgument):
        next(tailing.tail(store, TAIL_AT_OFFSET, 5, [], 0, 10, is_active=lambda: True))
    with pytest.raises(OutOfRange):
        next(tailing.tail(store, TAIL_AT_OFFSET, end + 100, [], 0, 10, is_active=lambda: True))



def test_a_filtered_tail_says_where_it_is_while_other_topics_keep_the_log_growing(open_store, monkeypatch):
    """A Tail of topic b while only topic a is written, without a pause: every frame it reads holds nothing of
    b, and the log's end moves on before the stream reaches it. It still sends an empty frame every heartbeat
    with its position (before, nothing at all until the writer paused: the Transaction service's follower
    learnt nothing for as long as producers wrote, and a standby elected then stayed recovering)."""
    store = open_store()
    store.topic_admin.create("a", 1)
    store.topic_admin.create("b", 1)
    store.append("a", [MessageIn(body=b"x" * 100)])
    real_frame = store.commitlog.frame
    writes = []

    def frame_while_a_writer_runs(*args):  # another append lands before every read: the end never stays put
        if len(writes) < 20_000:
            writes.append(store.append("a", [MessageIn(body=b"x" * 100)]))
        return real_frame(*args)

    monkeypatch.setattr(store.commitlog, "frame", frame_while_a_writer_runs)
    frames = tailing.tail(store, TAIL_EARLIEST, 0, ["b"], 1 << 20, 20, is_active=lambda: True)
    first = next(frames)
    assert len(writes) < 20_000, "no frame while the writer ran"
    assert first.record_count == 0 and first.records == b""
    assert 0 < first.next_physical_offset <= store.visible_offset()
    second = next(frames)
    assert second.next_physical_offset >= first.next_physical_offset


def test_a_caught_up_tail_lingers_so_that_several_appends_share_a_frame(open_store, monkeypatch):
    store = open_store()
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"0")])
    lingered = []

    def linger(seconds):  # stands in for the wait: another append lands meanwhile
        lingered.append(seconds)
        store.append("t", [MessageIn(body=b"2")])

    monkeypatch.setattr(tailing, "time", types.SimpleNamespace(sleep=linger))
    behind = tailing.tail(store, TAIL_EARLIEST, 0, [], 0, 60_000, is_active=lambda: True, linger_ms=50)
    assert [v.body for v in record_reader.records(next(behind).records)] == [b"0"]
    assert lingered == []  # a stream behind the log sends at once
    frames = tailing.tail(store, TAIL_LATEST, 0, [], 0, 60_000, is_active=lambda: True, linger_ms=5000)
    first: list = []
    reader = threading.Thread(target=lambda: first.append(next(frames)))
    reader.start()
    wait_until(lambda: store.dispatcher.visible._waiters, "the tail waiting for new records")
    store.append("t", [MessageIn(body=b"1")])
    reader.join(10)
    assert [v.body for v in record_reader.records(first[0].records)] == [b"1", b"2"]
    assert lingered == [1.0]  # clamped to MAX_TAIL_LINGER_MS

def test_offset_by_time(open_store, fake_clock):
    store = open_store(clock=fake_clock)
    store.topic_admin.create("t", 1)
    times = []
    for _ in range(10):
        times.append(store.append("t", [MessageIn(body=b"x")])[0].store_timestamp_ms)
        fake_clock.advance(1000)
    assert store.offset_by_time("t", 0, times[4]) == 4
    assert store.offset_by_time("t", 0, times[4] + 1) == 5
    assert store.offset_by_time("t", 0, times[4] + 1, "upper") == 4
    assert store.offset_by_time("t", 0, 0) == 0
    assert store.offset_by_time("t", 0, times[-1] + 10_000) == 10


def test_retention_deletes_oldest_segments_and_queues_follow(open_store, fake_clock):
    store = open_store(clock=fake_clock, segment_size_bytes=8192, retention_ms=3_600_000)
    store.topic_admin.create("t", 1)
    for i in range(30):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.flusher.flush_now()
    segs = store.segments.segments
    assert len(segs) >= 3
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in segs[:2]:
        os.utime(seg.path, (old, old))
    deleted = store.retention.delete_expired_segments()
    assert deleted == 2 and store.segments.segments[0].start == segs[2].start
    info = store.queue_info("t", 0)
    assert info.min_offset > 0 and info.max_offset == 30
    first = store.pull("t", 0, info.min_offset).messages[0]
    assert first.record.physical_offset >= segs[2].start
    with pytest.raises(OutOfRange):
        store.pull("t", 0, 0)
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))
    store.retention.delete_expired_segments()
    first = store.segments.segments[0]  # never the active segment (the one being written)
    assert first.start <= store.commitlog.written_offset < first.end


def test_topic_retention_hides_old_messages(open_store, fake_clock):
    store = open_store(clock=fake_clock)
    store.topic_admin.create("t", 1, retention_ms=60_000)
    store.append("t", [MessageIn(body=b"old")] * 3)
    fake_clock.advance(120_000)
    store.append("t", [MessageIn(body=b"new")])
    store.retention.apply_topic_retention()
    assert store.queue_info("t", 0).min_offset == 3


def test_full_disk_makes_store_read_only(open_store):
    store = open_store(disk_max_used_ratio=0.0001)  # the start's disk check finds it "full"
    assert store.store_info().read_only
    with pytest.raises(ResourceExhausted, match="read-only"):
        store.topic_admin.create("t", 1)  # metadata shares the disk: refused before SQLite is tried
    store.disk.set_usage(0.0)
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"before")])
    store.disk.check()
    with pytest.raises(ResourceExhausted, match="read-only"):
        store.append("t", [MessageIn(body=b"x")])
    with pytest.raises(ResourceExhausted, match="read-only"):
        store_offsets.commit_offset(store, "g", "t", 0, 1)
    assert store.pull("t", 0, 0).messages[0].record.body == b"before"
    assert store.store_info().read_only
    store.disk.set_usage(0.0)
    store.append("t", [MessageIn(body=b"after")])


def test_topic_rules(open_store):
    store = open_store()
    store.topic_admin.create("t", 2)
    with pytest.raises(FailedPrecondition):
        store.topic_admin.create("RMQ_SYS_TRANS_HALF_TOPIC")
    with pytest.raises(FailedPrecondition):
        store.topic_admin.delete("RMQ_SYS_TRANS_HALF_TOPIC")
    with pytest.raises(FailedPrecondition, match="only grow"):
        store.topic_admin.update("t", queue_count=1)
    with pytest.raises(InvalidArgument):
        store.topic_admin.create("bad name")
    assert store.topic_admin.update("t", queue_count=3).queue_count == 3
    assert [t.name for t in store.topic_admin.list()] == ["t"]
    assert "RMQ_SYS_TRANS_HALF_TOPIC" in [t.name for t in store.topic_admin.list(include_system=True)]
    store.append("t", [MessageIn(body=b"x", queue_id=2)])
    store.topic_admin.delete("t")
    with pytest.raises(NotFound):
        store.append("t", [MessageIn(body=b"x")])


def test_consumer_offsets(open_store):
    store = open_store()
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x")] * 5)
    store_offsets.commit_offset(store, "g1", "t", 0, 3)
    assert store_offsets.query_offset(store, "g1", "t", 0) == 3
    with pytest.raises(OutOfRange):
        store_offsets.commit_offset(store, "g1", "t", 0, 6)
    with pytest.raises(NotFound):
        store_offsets.query_offset(store, "g2", "t", 0)


def test_long_polls_beyond_the_limit_answer_at_once(open_store):
    store = open_store(max_long_poll_waiters=1)
    store.topic_admin.create("t", 1)
    holder = {}
    waiter = threading.Thread(target=lambda: holder.update(r=store.pull("t", 0, 0, long_poll_ms=10_000)))
    waiter.start()
    deadline = store.clock.monotonic_s() + 10
    while store._long_polls._slots._value != 0 and store.clock.monotonic_s() < deadline:
        threading.Event().wait(0.01)  # until the first long poll holds the only waiter slot
    second = store.pull("t", 0, 0, long_poll_ms=10_000)  # no slot: returns at once, empty
    assert second.messages == [] and waiter.is_alive()
    store.append("t", [MessageIn(body=b"wake")])
    waiter.join(15)
    assert [m.record.body for m in holder["r"].messages] == [b"wake"]


def test_a_follower_hold_keeps_retention_below_its_position_until_it_lapses(open_store, fake_clock):
    # clean_interval_ms past the clock's jumps: the maintenance duty must not delete segments concurrently
    # with the test's own calls (the fake clock drives its monotonic time too).
    store = open_store(clock=fake_clock, segment_size_bytes=8192, retention_ms=3_600_000,
                       retention_hold_max_ms=10 * 3_600_000, clean_interval_ms=100 * 3_600_000)
    store.topic_admin.create("t", 1)
    store.topic_admin.create("kv", 1, kind="COMPACTION")  # the data a hold protects: held from its start, 0
    for i in range(30):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.flusher.flush_now()
    segs = store.segments.segments
    frames = tailing.tail(store, "offset", segs[1].start,  # a compactor resuming at the second segment
                         [], 0, 0, is_active=lambda: True, hold_retention_as="compactor",
                         hold_durable=True)
    next(frames)  # the stream is open: its start is held
    frames.close()
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in segs:
        os.utime(seg.path, (old, old))
    assert store.retention.delete_expired_segments() == 1  # the first only: the second ends above the hold
    assert store.segments.segments[0].start == segs[1].start
    fake_clock.advance(10 * 3_600_000 + 1)  # the follower is gone for longer than retention_hold_max_ms
    assert store.retention.delete_expired_segments() >= 1
    assert store.retention.holds.snapshot() == {}


def test_a_hold_keeps_no_log_below_the_compaction_topics_and_goes_with_them(open_store, fake_clock):
    """The compactor's hold protects compaction data: not below the first compaction topic's start, and not
    at all once the last compaction topic is deleted (its hold goes with it)."""
    store = open_store(clock=fake_clock, segment_size_bytes=8192, retention_ms=3_600_000,
                       retention_hold_max_ms=10 * 3_600_000)
    store.topic_admin.create("t", 1)
    for i in range(20):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.topic_admin.create("kv", 1, kind="COMPACTION")  # starts in the third segment
    for i in range(20):
        store.append("kv", [MessageIn(body=bytes([i]) * 1000, keys=(f"k{i}",))])
    store.flusher.flush_now()
    frames = tailing.tail(store, "offset", 0, [], 0, 0, is_active=lambda: True, hold_retention_as="compactor",
                        hold_durable=True)
    next(frames)  # a compactor holds the whole log
    frames.close()
    start = store.topic_admin.get("kv").start_physical_offset

    def expire_all():
        old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
        for seg in store.segments.segments:
            os.utime(seg.path, (old, old))
        return store.retention.delete_expired_segments()
    assert expire_all() >= 1 and store.commitlog.min_offset <= start  # kept from the segment holding kv's start
    assert store.pull("kv", 0, 0).messages[0].record.body == bytes([0]) * 1000
    store.topic_admin.delete("kv")
    assert expire_all() >= 1 and store.commitlog.min_offset > start  # no compaction topic left: nothing held


def test_another_followers_hold_has_no_floor(open_store, fake_clock):
    """The Transaction service's hold keeps the log below its position whatever the topics' kinds."""
    store = open_store(clock=fake_clock, segment_size_bytes=8192, retention_ms=3_600_000,
                       retention_hold_max_ms=10 * 3_600_000, clean_interval_ms=100 * 3_600_000)
    store.topic_admin.create("t", 1)
    for i in range(20):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.flusher.flush_now()
    frames = tailing.tail(store, "offset", 0, [], 0, 0, is_active=lambda: True, hold_retention_as="txn",
                        hold_durable=True)
    next(frames)
    frames.close()
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))
    assert store.retention.delete_expired_segments() == 0 and store.commitlog.min_offset == 0
