"""The timer's duty and delivery batches (mqstore.timer.leadership, mqstore.timer.timer) on a real store: it runs
only while its node leads, counts what it does in metrics, and cuts its appends to the store's batch limits."""

from __future__ import annotations

import threading

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.clock import FakeClock
from mqstore.metrics import Registry
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer import scheduling
from mqstore.timer.config import TimerConfig
from mqstore.timer.leadership import TimerDuty
from mqstore.timer.timer import Timer
from tests.support.waiting import wait_until

CONFIG = TimerConfig(timer_precision_ms=100, timer_wheel_slots=64)


def _delivered(store, topic: str = "t") -> int:
    return store.queue_info(topic, 0).max_offset


def test_deliveries_are_cut_to_the_stores_batch_limits(small_config, tmp_path):
    # Before: one append of every copy due at once, refused past max_batch_messages (its copies dropped).
    clock = FakeClock()
    store = build_store(small_config(max_batch_messages=3, max_batch_body_bytes=2_000), clock)
    store.start()
    try:
        store.topic_admin.create("t", 1)
        due = clock.now_ms() + 500
        for _ in range(4):
            scheduling.append(store, CONFIG, "t", [MessageIn(b"x" * 600, properties={tm.DELIVER_MS: str(due)})] * 3)
        timer = Timer(store, CONFIG, tmp_path / "timer")
        timer.open()
        timer.step()
        clock.advance(600)
        for _ in range(20):
            timer.step()
        assert _delivered(store) == 12 and timer.stats.dropped == 0
        timer.close()
    finally:
        store.stop()


def test_the_duty_delivers_only_while_its_node_leads_and_counts_it(small_config, tmp_path):
    store = build_store(small_config())  # the real clock: the duty sleeps on it
    store.start()
    leading = threading.Event()
    registry = Registry()
    duty = TimerDuty(store, CONFIG, tmp_path / "timer", leading=leading.is_set, registry=registry)
    duty.start()
    try:
        store.topic_admin.create("t", 1)
        scheduling.append(store, CONFIG, "t", [MessageIn(b"x", properties={tm.DELAY_MS: "100"})] * 5, wake=duty.wake)
        wait_until(lambda: duty.state().steps >= 5, "the duty stepping as a replica")
        assert _delivered(store) == 0 and duty.timer is None  # a replica opens no timer
        leading.set()
        wait_until(lambda: _delivered(store) == 5, "the deliveries once leading")
        # The duty counts a batch after its append returns: the copies can be read before the counters show them.
        wait_until(lambda: registry.get("mqstore_timer_late_seconds").value.count == 5, "the deliveries counted")
        assert registry.get("mqstore_timer_delivered_total").value == 5
        assert registry.get("mqstore_timer_scheduled_total").value == 5
        assert registry.get("mqstore_timer_late_seconds").value.count == 5
        leading.clear()  # deposed: the timer is closed (its checkpoint written)
        wait_until(lambda: duty.timer is None, "the timer closed on losing leadership")
        assert (tmp_path / "timer" / "timercheck").exists() and duty.problem() == ""
    finally:
        duty.stop()
        duty.close()
        store.stop()
