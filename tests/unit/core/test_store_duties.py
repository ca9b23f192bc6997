"""The store's background duties on the common base (mqstore.background): a failed fsync is never
retried, the warmer no longer dies silently, maintenance retries store and OS errors but not bugs,
and MessageStore.health_problem names whichever duty a bug ended (None while all is well)."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from mqstore.errors import InvariantViolation, Unavailable
from mqstore.log.segment import Segment
from mqstore.model import MessageIn
from mqstore.store import MessageStore

WAIT_S = 10.0


@pytest.fixture
def store(small_config):
    s = MessageStore(small_config(warm_ahead_bytes=64 * 1024, flush_min_dirty_pages=1))
    s.start()
    s.create_topic("t", 1)
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
    monkeypatch.setattr(Segment, "prefetch", _failing(called, TypeError("a bug in the warmer")))
    for _ in range(5):  # into the second segment: the warmer reads ahead into a third
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


@pytest.mark.parametrize("warm_ahead_bytes", [0, 64 * 1024])
def test_a_large_write_copies_into_the_mapping_only_where_the_warmer_has_read(small_config, monkeypatch,
                                                                                warm_ahead_bytes):
    """Below commitlog.resident_offset (the warmer publishes how far it has read) a write of 4 KiB or
    more is copied into the mapping; with no warmer it goes through pwrite. The bytes land either way."""
    s = MessageStore(small_config(warm_ahead_bytes=warm_ahead_bytes))
    s.start()
    try:
        s.create_topic("t", 1)
        deadline = time.monotonic() + WAIT_S
        while warm_ahead_bytes and s.commitlog.resident_offset < 32 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.commitlog.resident_offset == (32 * 1024 if warm_ahead_bytes else 0)  # at most two segments ahead
        pwrites = []
        real_pwrite = os.pwrite

        def counting(fd, data, position):
            pwrites.append(len(data))
            return real_pwrite(fd, data, position)
        monkeypatch.setattr(os, "pwrite", counting)
        body = os.urandom(6000)
        s.append("t", [MessageIn(body=body)])
        assert bool(pwrites) == (warm_ahead_bytes == 0), pwrites
        assert body in s.commitlog.segments.find(0).path.read_bytes()
    finally:
        s.stop()
