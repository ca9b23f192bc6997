"""The timer (mqstore.timer) against a trivially correct model: a dict of scheduled messages by due time, on a
real store under a fake clock. Random schedules (past, near, and far past the wheel's span, so they roll),
recalls, clock moves, restarts with and without a checkpoint, a torn timer log, lost timer files and downtimes
longer than the wheel; after every step: nothing delivered early, nothing twice, everything due (and not
recalled) delivered. The seed is printed; rerun with MQSTORE_SEED=<n>; MQSTORE_TIMER_MODEL_OPS for a longer run."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer import scheduling
from mqstore.timer.config import TimerConfig
from mqstore.timer.timer import Timer

TOPICS = ("delayA", "delayB")
PRECISION, SLOTS = 100, 16  # a wheel of 1.6 s: delays of up to 8 s roll several times
CONFIG = TimerConfig(timer_max_delay_ms=60_000, timer_precision_ms=PRECISION, timer_wheel_slots=SLOTS,
                     timer_checkpoint_interval_ms=300)


def _delivered(store) -> list[dict]:
    out = []
    for topic in TOPICS:
        for queue_id in range(2):
            offset = 0
            while True:
                got = store.pull(topic, queue_id, offset, 1000).messages
                if not got:
                    break
                out.extend(m.record.properties | {"_topic": topic} for m in got)
                offset = got[-1].record.queue_offset + 1
    return out


def _run_until_idle(timer: Timer) -> None:
    for _ in range(10_000):
        if timer.step() > 0:
            return
    raise AssertionError("the timer never came to a wait")


def _check(store, scheduled: dict, recalled: set, now: int) -> None:
    seen: dict[str, dict] = {}
    for props in _delivered(store):
        key = props["UNIQ_KEY"]
        assert key not in seen, f"{key} delivered twice"
        seen[key] = props
        due = scheduled[key][1]
        assert key not in recalled, f"{key} was recalled but delivered"
        assert int(props[tm.DELIVER_MS]) == due
        assert int(props[tm.DEQUEUE_MS]) >= due, f"{key} delivered early"
        assert props["_topic"] == scheduled[key][0]
    for key, (_topic, due) in scheduled.items():
        if due <= now and key not in recalled:
            assert key in seen, f"{key} due at {due} (now {now}) not delivered"


@pytest.mark.parametrize("restarts,recalls", [(True, True)], ids=["restarts-and-recalls"])
def test_the_timer_delivers_like_a_sorted_list(small_config, tmp_path, restarts, recalls):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    ops = int(os.environ.get("MQSTORE_TIMER_MODEL_OPS", "200"))
    print(f"seed {seed}")
    rnd = random.Random(seed)
    clock = FakeClock()
    store = build_store(small_config(segment_size_bytes=1 << 20), clock)
    store.start()
    for topic in TOPICS:
        store.topic_admin.create(topic, 2)
    directory = tmp_path / "timer"
    timer = Timer(store, CONFIG, directory)
    timer.open()
    scheduled: dict[str, tuple[str, int]] = {}  # uniq key -> (topic, due)
    ids: dict[str, str] = {}  # uniq key -> the timer record's msg id
    recalled: set[str] = set()
    try:
        for op in range(ops):
            choice = rnd.random()
            now = clock.now_ms()
            if choice < 0.45:
                topic = rnd.choice(TOPICS)
                delays = [rnd.randint(-3_000, 8_000) for _ in range(rnd.randint(1, 4))]
                batch = [MessageIn(body=f"{op}-{i}".encode(), properties={tm.DELAY_MS: str(max(d, 0))}
                                   if d >= 0 else {tm.DELIVER_MS: str(now + d)}, queue_id=rnd.randint(0, 1))
                         for i, d in enumerate(delays)]
                results = scheduling.append(store, CONFIG, topic, batch)
                for result, delay in zip(results, delays, strict=True):
                    scheduled[result.uniq_key] = (topic, now + max(delay, 0) if delay >= 0 else now)
                    ids[result.uniq_key] = result.msg_id
            elif choice < 0.52 and scheduled and recalls:
                key = rnd.choice(sorted(scheduled))
                try:
                    scheduling.recall(store, scheduled[key][0], ids[key])
                    recalled.add(key)
                except FailedPrecondition:
                    assert scheduled[key][1] <= now
            elif choice < (0.9 if restarts else 1.1):
                clock.advance(rnd.randint(0, 400))
            else:
                crash = rnd.random() < 0.5
                if crash:
                    timer.files.close()  # no last checkpoint: what a kill -9 leaves
                    log_file = directory / "timerlog"
                    if rnd.random() < 0.2 and log_file.stat().st_size > 7:
                        os.truncate(log_file, log_file.stat().st_size - 7)  # a torn last unit
                else:
                    timer.close()
                if rnd.random() < 0.15:
                    shutil.rmtree(directory)  # files lost: rebuilt from the timer topic
                if rnd.random() < 0.2:
                    clock.advance(SLOTS * PRECISION * rnd.randint(2, 6))  # downtime longer than the wheel
                timer = Timer(store, CONFIG, directory)
                timer.open()
            _run_until_idle(timer)
            _check(store, scheduled, recalled, clock.now_ms())
        clock.advance(20_000)
        _run_until_idle(timer)
        _check(store, scheduled, recalled, clock.now_ms())
        delivered = {p["UNIQ_KEY"] for p in _delivered(store)}
        assert delivered == set(scheduled) - recalled
        assert timer.stats.lag_ms < 2 * PRECISION
    finally:
        timer.close()
        store.stop()


def test_a_delay_above_the_limit_names_it(small_config, tmp_path):
    store = build_store(small_config(), FakeClock())
    store.start()
    try:
        store.topic_admin.create("t", 1)
        from mqstore.errors import InvalidArgument
        with pytest.raises(InvalidArgument, match="--timer-max-delay-ms"):
            scheduling.append(store, CONFIG, "t", [MessageIn(b"x", properties={tm.DELAY_SEC: "61"})])
        with pytest.raises(InvalidArgument, match="batches of their own"):
            scheduling.append(store, CONFIG, "t", [MessageIn(b"x", properties={tm.DELAY_SEC: "1"}), MessageIn(b"y")])
        with pytest.raises(InvalidArgument, match="set by the store's timer"):
            scheduling.append(store, CONFIG, "t", [MessageIn(b"x", properties={tm.UNIT: "1"})])
    finally:
        store.stop()
