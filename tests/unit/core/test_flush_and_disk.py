"""SYNC flush that does not confirm in time, a flush service that dies, and a disk that fills up
while a segment is created: each gives its own clear error, loses nothing acknowledged, and reads go on."""

from __future__ import annotations

import errno
import os

import pytest

from mqstore.errors import FlushTimeout, ResourceExhausted, Unavailable
from mqstore.log.flush import Flusher
from mqstore.model import MessageIn
from mqstore.store import MessageStore


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
