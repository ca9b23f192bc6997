"""OP batching by size and by time (injected clock, the duty not started: the test calls flush_due), a
failed OP write kept and retried; the half-message cache's eviction order, byte budget and hit rules."""

from __future__ import annotations

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import OutcomeUnknown, Unavailable
from mqstore.txn.cache import HalfCache
from mqstore.txn.opbatch import OpBatcher, parse_body


class Log:
    def __init__(self):
        self.bodies: list[bytes] = []
        self.fail_next = 0
        self.unknown = False

    def write(self, body: bytes, offsets) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise (OutcomeUnknown if self.unknown else Unavailable)("commit log away")
        self.bodies.append(body)


def batcher(log: Log, clock: FakeClock, max_bytes: int = 4096, interval_ms: int = 3000) -> OpBatcher:
    return OpBatcher(log.write, clock, max_bytes=max_bytes, interval_ms=interval_ms)


def test_a_batch_is_written_when_its_body_reaches_max_bytes():
    log, clock = Log(), FakeClock()
    ops = batcher(log, clock, max_bytes=40)
    ops.add(range(1000, 1007))  # 7 x "1000," = 35 bytes: not yet
    assert ops.flush_due() == 0 and log.bodies == []
    ops.add([1007, 1008])  # 45 bytes: one full OP (8 entries = 40 bytes), one entry left
    assert ops.flush_due() == 1
    assert log.bodies == [b"1000,1001,1002,1003,1004,1005,1006,1007,"]
    s = ops.stats()
    assert (s.messages_written, s.entries_written, s.flush_by_size, s.flush_by_time, s.pending) == (1, 8, 1, 0, 1)
    assert s.mean_fill == 1.0


def test_a_batch_is_written_when_its_oldest_entry_is_interval_old():
    log, clock = Log(), FakeClock()
    ops = batcher(log, clock)
    ops.add([1])
    clock.advance(2000)
    ops.add([2, 3])
    clock.advance(999)
    assert ops.flush_due() == 0  # the oldest waited 2999 ms
    clock.advance(1)
    assert ops.flush_due() == 1 and parse_body(log.bodies[0]) == [1, 2, 3]
    assert ops.stats().flush_by_time == 1 and ops.stats().pending == 0


def test_a_failed_write_keeps_its_entries_and_the_retry_writes_them():
    log, clock = Log(), FakeClock()
    written = []
    ops = OpBatcher(log.write, clock, max_bytes=4, interval_ms=3000, on_written=written.extend)
    ops.add([7, 8])  # 4 bytes: due by size
    log.fail_next = 1
    with pytest.raises(Unavailable):
        ops.flush_due()
    assert ops.stats().pending == 2 and ops.stats().write_failures == 1 and written == []
    assert ops.flush_due() == 1 and log.bodies == [b"7,8,"]  # the retry: the same entries, none lost
    assert written == [7, 8]


def test_a_write_of_unknown_outcome_is_handed_over_not_written_again():
    log, clock = Log(), FakeClock()
    unknown: list[list[int]] = []
    ops = OpBatcher(log.write, clock, max_bytes=4, interval_ms=3000, on_unknown=unknown.append)
    ops.add([7, 8])
    log.fail_next, log.unknown = 1, True
    with pytest.raises(OutcomeUnknown):
        ops.flush_due()
    assert unknown == [[7, 8]] and ops.stats().pending == 0 and ops.stats().unknown_outcomes == 1
    assert ops.flush_due() == 0 and log.bodies == []  # not blindly again: the resolver decides
    ops.requeue([8])  # the resolver found 7's entry in the log: only 8 is written again, at once
    assert ops.flush_due() == 1 and log.bodies == [b"8,"]


def test_cache_evicts_the_eldest_by_count_and_by_bytes_and_a_hit_removes():
    cache: HalfCache[str] = HalfCache(max_entries=3, max_bytes=100)
    for offset in (10, 20, 30):
        cache.put(offset, f"m{offset}", 10)
    assert cache.take(20) == "m20" and cache.take(20) is None  # a hit removes the entry
    cache.put(40, "m40", 10)
    cache.put(50, "m50", 10)  # 4 entries: the eldest (10) goes
    assert cache.keys() == [30, 40, 50]
    cache.put(60, "m60", 85)  # over the byte budget: eldest first until it fits
    assert cache.keys() == [50, 60] and cache.stats().bytes == 95
    cache.put(70, "huge", 101)  # bigger than the whole budget: not cached, nothing evicted
    assert cache.keys() == [50, 60]
    s = cache.stats()
    assert (s.hits, s.misses, s.evictions, s.entries) == (1, 1, 3, 2)


def test_cache_off_caches_nothing():
    cache: HalfCache[str] = HalfCache(max_entries=0, max_bytes=100)
    cache.put(1, "x", 1)
    assert cache.take(1) is None and cache.stats().misses == 1
