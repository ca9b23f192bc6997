"""The store's background duties on the common base (mqstore.background): a failed fsync is never
retried, the warmer no longer dies silently, maintenance retries store and OS errors but not bugs,
and MessageStore.health_problem names whichever duty a bug ended (None while all is well)."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from mqstore.errors import InvariantViolation, Unavailable
from mqstore.log.segment import Segment
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from tests.support.waiting import wait_until

WAIT_S = 10.0


@pytest.fixture
def store(small_config):
    s = build_store(small_config(warm_ahead_bytes=64 * 1024, flush_min_dirty_pages=1))
    s.start()
    s.topic_admin.create("t", 1)
    yield s
    s.stop()


def _failing(calls: threading.Event, exc: BaseException, *, times: int = 1 << 30, then=None):
    """A stand-in that records its call and raises ``exc`` ``times`` times, then calls ``then``."""
    left = [times]

    def fail(*args, **kwargs):
        calls.set()
        if left[0] > 0:
            left[0] -= 1
            raise exc
        return then(*args, **kwargs) if then else None
    return fail


def test_a_failed_fsync_ends_the_flush_duty_without_a_retry(store, monkeypatch):
    assert store.health_problem() is None
    called = threading.Event()
    monkeypatch.setattr(Segment, "flush", _failing(called, OSError(errno.EIO, "fsync failed")))
    store.append("t", [MessageIn(body=b"x" * 5000)])  # dirty enough for the next ASYNC flush
    store.flusher.wake()
    assert called.wait(WAIT_S)
    store.flusher._thread.join(WAIT_S)
    state = store.flusher.state()
    assert not state.alive and state.retries == 0 and "OSError" in state.died
    assert "commitlog-flush died" in store.health_problem()
    with pytest.raises(Unavailable, match="flush service failed"):
        store.flusher.wait_flushed(store.commitlog.written_offset)
    monkeypatch.undo()


def test_the_warmer_dying_of_a_bug_makes_the_store_unhealthy(store, monkeypatch):
    called = threading.Event()
    segments = store.commitlog.segments
    real_ensure = segments.ensure
    failing = _failing(called, TypeError("a bug in the warmer"))

    def ensure(*args):  # fails on the warmer's thread only: an append that rolls creates its segment
        if threading.current_thread().name == "commitlog-warmer":
            return failing(*args)
        return real_ensure(*args)
    monkeypatch.setattr(segments, "ensure", ensure)
    for _ in range(5):  # into the second segment: the warmer creates a third
        store.append("t", [MessageIn(body=b"x" * 4000)])
    store.warmer.wake()
    assert called.wait(WAIT_S)
    store.warmer._thread.join(WAIT_S)
    assert "commitlog-warmer died: TypeError: a bug in the warmer" in store.health_problem()


def test_maintenance_retries_os_errors_and_dies_of_a_bug(store, monkeypatch):
    recovered = threading.Event()
    flaky = _failing(threading.Event(), OSError(errno.EIO, "checkpoint write failed"), times=2,
                     then=lambda: recovered.set())
    monkeypatch.setattr(store.maintenance, "_write_checkpoint", flaky)
    store.maintenance.wake()
    assert recovered.wait(WAIT_S)
    assert store.maintenance.state().retries >= 2 and store.health_problem() is None
    called = threading.Event()
    monkeypatch.setattr(store.maintenance, "_write_checkpoint",
                        _failing(called, InvariantViolation("checkpoint offsets went backwards")))
    store.maintenance.wake()
    assert called.wait(WAIT_S)
    store.maintenance._thread.join(WAIT_S)
    assert store.maintenance.state().retries >= 2  # the bug itself was not retried
    assert "store-maintenance died: InvariantViolation" in store.health_problem()


@pytest.mark.parametrize("flush_mode", ["ASYNC", "SYNC"])
@pytest.mark.parametrize("warm_ahead_bytes", [0, 64 * 1024])
def test_a_large_write_goes_through_pwrite_and_a_small_one_through_the_mapping(small_config, monkeypatch,
                                                                               warm_ahead_bytes, flush_mode):
    """A write of 4 KiB or more goes through pwrite (it fills the page cache without zeroing it first), a
    smaller one through the mapping, whatever the warmer does ahead; the bytes land either way."""
    s = build_store(small_config(warm_ahead_bytes=warm_ahead_bytes, flush_mode=flush_mode))
    s.start()
    try:
        s.topic_admin.create("t", 1)
        pwrites = []
        real_pwrite = os.pwrite

        def counting(fd, data, position):
            if threading.current_thread().name != "commitlog-warmer":  # its zeros (SYNC) go by pwrite too
                pwrites.append(len(data))
            return real_pwrite(fd, data, position)
        monkeypatch.setattr(os, "pwrite", counting)
        small, large = os.urandom(1000), os.urandom(6000)
        s.append("t", [MessageIn(body=small)])
        assert pwrites == []
        s.append("t", [MessageIn(body=large)])
        assert len(pwrites) == 1 and pwrites[0] > 6000, pwrites
        data = s.commitlog.segments.find(0).path.read_bytes()
        assert small in data and large in data
    finally:
        s.stop()


def test_under_async_the_warmer_creates_the_segments_ahead_and_touches_no_page(small_config, monkeypatch):
    """ASYNC: the warmer creates the next segment before the writer needs it, and neither reads nor writes
    the range ahead (mqstore.log.warmer: reading it cost more than it saved); the roll finds it there."""
    s = build_store(small_config(warm_ahead_bytes=64 * 1024))
    s.start()
    try:
        s.topic_admin.create("t", 1)
        wait_until(lambda: len(s.commitlog.segments.segments) >= 2, "the warmer to create the next segment")
        second = s.commitlog.segments.segments[1]  # at most two segments ahead: the current and next
        assert len(s.commitlog.segments.segments) == 2 and s.commitlog.resident_offset == 0
        assert not second.path.read_bytes().strip(b"\0")  # nothing written into it
        creators = []
        queue_type = type(s.commitlog.segments)
        real_create = queue_type._create_locked

        def create(queue, start):
            if queue is s.commitlog.segments:  # not a consume queue's files
                creators.append(threading.current_thread().name)
            return real_create(queue, start)
        monkeypatch.setattr(queue_type, "_create_locked", create)
        for _ in range(5):  # 20 KB: into the second segment, which the writer does not create
            s.append("t", [MessageIn(body=b"x" * 4000)])
        assert s.commitlog.written_offset > second.start
        assert set(creators) <= {"commitlog-warmer"}, creators
    finally:
        s.stop()
