"""SYNC flush that does not confirm in time, a flush service that dies, and a disk that fills up
while a segment is created: each gives its own clear error, loses nothing acknowledged, and reads go on."""

from __future__ import annotations

import errno
import os
import random
import threading

import pytest

from mqstore.errors import FlushTimeout, ResourceExhausted, Unavailable
from mqstore.log.flush import Flusher
from mqstore.log.segment import Segment
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from tests.support.waiting import WAIT_S


@pytest.fixture
def store(small_config):
    stores = []

    def make(**overrides):
        s = MessageStore(small_config(**overrides))
        s.start()
        s.create_topic("t", 1)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.stop()


def test_sync_wait_times_out_with_a_clear_status(store):
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=50)
    batch = s.encoder.encode_batch(s.topic("t"), [MessageIn(body=b"x")], s.clock.now_ms())
    written = s.commitlog.append(batch)
    idle = Flusher(s.commitlog, s.config, s.clock, on_flushed=lambda offset: None)  # never started
    idle.flushed_offset = 0
    with pytest.raises(FlushTimeout, match="50 ms") as info:
        idle.wait_flushed(written.end)
    assert "retry may duplicate" in str(info.value) and isinstance(info.value, Unavailable)


def test_a_sync_append_returns_only_once_an_fdatasync_covers_it(store, monkeypatch):
    # Every fsync of the flush service is held until an append has written past what it covers, so each
    # one finishes while appends it does not cover wait: the flush must release only those it covers
    # (each waits on a lock of its own), and each of those only once the fsync is done.
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=20_000)
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    durable = [0]  # the log's end as far as a finished fdatasync covers it
    moved = threading.Condition()
    real_flush = Segment.flush

    def held_flush(seg, from_position, to_position):
        if threading.current_thread().name == "commitlog-flush":
            with moved:  # until an append wrote past this flush (it then waits for the next one)
                moved.wait_for(lambda: s.commitlog.written_offset > seg.start + to_position, 0.2)
        real_flush(seg, from_position, to_position)
        durable[0] = max(durable[0], seg.start + to_position)

    monkeypatch.setattr(Segment, "flush", held_flush)
    early: list[tuple[int, int]] = []

    def producer(rng: random.Random) -> None:
        for _ in range(40):
            results = s.append("t", [MessageIn(body=b"x" * rng.randrange(1, 600)) for _ in range(rng.randrange(1, 4))])
            end = results[-1].physical_offset + results[-1].size_bytes
            if durable[0] < end:
                early.append((end, durable[0]))
            with moved:
                moved.notify_all()

    threads = [threading.Thread(target=producer, args=(random.Random(seed + i),)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3 * WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    assert early == [], f"appends acknowledged before an fdatasync covered them (end, durable): {early[:5]}"
    assert s.flusher.flushed_offset == s.commitlog.written_offset


def test_dead_flush_service_fails_sync_appends_and_reports_unhealthy(store, failpoint):
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=5_000)
    s.append("t", [MessageIn(body=b"before")])
    with failpoint.armed("log.after_flush"):
        with pytest.raises(Unavailable, match="flush service failed"):
            s.append("t", [MessageIn(body=b"after")])
        assert "commitlog-flush died: FailpointHit: log.after_flush" in s.health_problem()
    assert [m.record.body for m in s.pull("t", 0, 0).messages] == [b"before"]


def test_full_disk_while_creating_a_segment_rejects_the_batch_whole(store, monkeypatch):
    s = store(segment_size_bytes=8192, warm_ahead_bytes=0)
    s.append("t", [MessageIn(body=b"a" * 3000)])

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "posix_fallocate", no_space)  # a full disk cannot be caused for real here
    end = s.commitlog.written_offset
    with pytest.raises(ResourceExhausted, match="disk full"):
        s.append("t", [MessageIn(body=b"b" * 3000), MessageIn(body=b"c" * 3000)])
    assert s.commitlog.written_offset == end and s.queue_info("t", 0).max_offset == 1
    with pytest.raises(ResourceExhausted, match="read-only"):
        s.append("t", [MessageIn(body=b"d")])
    assert s.store_info().read_only
    assert s.pull("t", 0, 0).messages[0].record.body == b"a" * 3000
    monkeypatch.undo()
    s.disk.set_usage(0.10)  # the maintenance thread's disk check: space is back
    assert s.append("t", [MessageIn(body=b"e" * 3000)])[0].queue_offset == 1
