"""The timer's retention floor (mqstore.timer.leadership.TimerDuty.retention_floor, Retention.add_floor): the store's
retention deletes no segment holding a timer record not delivered or rolled yet (before: it did, and the timer
logged timer.record_missing and dropped the message)."""

from __future__ import annotations

import os

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.clock import FakeClock
from mqstore.metrics import Registry
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer import scheduling
from mqstore.format.timer_unit import KIND_DELIVER, KIND_ROLL
from mqstore.timer.config import TimerConfig
from mqstore.timer.files import TimerFiles
from mqstore.timer.leadership import TimerDuty

CONFIG = TimerConfig(timer_precision_ms=100, timer_wheel_slots=64)  # a span of 6.4 s
HOUR = 3_600_000


def _age_segments(store, clock) -> None:
    old = (clock.now_ms() - 2 * HOUR) / 1000
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))


def _fill(store, count: int) -> None:
    for i in range(count):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])


def test_retention_keeps_the_undelivered_timer_record_and_deletes_below_it(small_config, tmp_path):
    clock = FakeClock()
    store = build_store(small_config(segment_size_bytes=8192, retention_ms=HOUR, clean_interval_ms=100 * HOUR), clock)
    store.start()
    registry = Registry()
    duty = TimerDuty(store, CONFIG, tmp_path / "timer", leading=lambda: True, registry=registry)
    try:
        store.topic_admin.create("t", 1)
        _fill(store, 20)
        scheduling.append(store, CONFIG, "t", [MessageIn(b"later", properties={tm.DELAY_MS: "5000"})])
        _fill(store, 20)
        store.flusher.flush_now()
        duty.step()  # opens the timer, enqueues the record
        record_at = store.queues.get(tm.TIMER_TOPIC, 0).entry(0)[0]
        assert duty.retention_floor() == record_at
        assert registry.get("mqstore_timer_retained_bytes").value == store.log_end() - record_at
        _age_segments(store, clock)
        assert store.retention.delete_expired_segments() >= 1  # the segments below the floor go
        assert 0 < store.log_min() <= record_at  # the one holding the timer record stays
        duty.close()  # a restart: until the timer is open again its whole topic is kept, then its floor again
        assert duty.retention_floor() == record_at
        duty.step()
        assert duty.timer is not None and duty.retention_floor() == record_at
        clock.advance(5_100)
        for _ in range(10):
            duty.step()
        assert duty.timer.stats.dropped == 0 and duty.timer.stats.delivered == 1
        delivered = store.pull("t", 0, 40, 10).messages
        assert [m.record.body for m in delivered] == [b"later"]
        duty.timer.checkpoint(force=True)  # delivered: the floor moves past the record
        assert duty.retention_floor() > record_at
        _age_segments(store, clock)
        assert store.retention.delete_expired_segments() >= 1 and store.log_min() > record_at
    finally:
        duty.close()
        store.stop()


def test_a_long_delay_pins_the_log_only_until_it_is_rolled(small_config, tmp_path):
    """A delay past the wheel's span is re-appended when the wheel reaches it (a roll): the floor follows the new
    record, so the log is kept about one span, not the whole delay."""
    clock = FakeClock()
    store = build_store(small_config(), clock)
    store.start()
    duty = TimerDuty(store, CONFIG, tmp_path / "timer", leading=lambda: True)
    try:
        store.topic_admin.create("t", 1)
        scheduling.append(store, CONFIG, "t", [MessageIn(b"far", properties={tm.DELAY_MS: "20000"})])
        duty.step()
        first_at = store.queues.get(tm.TIMER_TOPIC, 0).entry(0)[0]
        assert duty.retention_floor() == first_at
        for _ in range(80):  # 8 s: past the span, the record was rolled
            clock.advance(100)
            duty.step()
        assert duty.timer.stats.rolled >= 1
        duty.timer.checkpoint(force=True)
        assert duty.retention_floor() > first_at
    finally:
        duty.close()
        store.stop()


def test_a_replica_keeps_the_timer_records_of_the_last_span(small_config, tmp_path):
    clock = FakeClock()
    store = build_store(small_config(), clock)
    store.start()
    duty = TimerDuty(store, CONFIG, tmp_path / "timer", leading=lambda: False)
    try:
        store.topic_admin.create("t", 1)
        assert duty.retention_floor() is None  # no timer record: nothing kept
        scheduling.append(store, CONFIG, "t", [MessageIn(b"x", properties={tm.DELAY_MS: "1000"})])
        assert duty.retention_floor() == store.queues.get(tm.TIMER_TOPIC, 0).entry(0)[0]
        clock.advance(CONFIG.span_ms + CONFIG.timer_precision_ms + 1)  # the leader's timer has delivered it by now
        assert duty.retention_floor() is None
    finally:
        duty.close()
        store.stop()


def test_the_first_pending_unit_is_the_first_of_a_slot_not_read(tmp_path):
    files = TimerFiles(tmp_path, 100, 64)
    assert files.open() is None
    try:
        files.add(1_000, 1_050, 0, 100, KIND_DELIVER)
        files.add_cancel(0, 1_050, 1)
        files.add(1_500, 1_550, 2, 300, KIND_DELIVER)
        files.add(1_200, 9_000, 3, 400, KIND_ROLL)
        assert files.first_pending(0, 1_000) == (0, files.units(1_000)[0])
        position, unit = files.first_pending(0, 1_100)  # slot 1000 read: the cancel is in no slot
        assert (position, unit.physical_offset) == (96, 300)
        assert files.first_pending(position, 1_300)[1].physical_offset == 300
        assert files.first_pending(0, 1_600) == (files.log_end, None)
    finally:
        files.close()
