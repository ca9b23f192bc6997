"""The timer (mqstore.timer, issue 35) in one process on a real store and clock: ``make bench`` runs
``bench/timer.py`` (bench/README.md).

  burst        BURST messages all due in the same second (appended ahead of it, the timer's duty running): the
               seconds from that second until the last is in its topic (issue 35's target: 100,000 within 5 s;
               RocketMQ delivered about 20,000 of 500,000 on time, #6566), and the lateness p99
  append       delayed appends (batches of 100, due in an hour) vs plain appends of the same messages, in 3
               rounds of ``seconds`` / 2 each, the timer's enqueue caught up before each plain window: messages/s
               with the enqueue's catch-up counted (sustained) and the ratio to plain (target >= 0.5x), medians
  wire append  the same rounds with the appends as the CommitLog servicer's Append runs them: from the AppendRequest
               bytes (mqstore_rpc.append_wire: the compiled codec's parser, timer_batch and AppendEncoder) to the
               AppendResponse bytes, gRPC itself left out
  check        the Scheduler's per-message check of a plain batch (every Append passes it) against the two
               passes it replaced: ns/message
  steady       RATE delayed messages a second, each due 1 s after its append, for ``seconds``: the lateness p99
               (target <= one precision, 1 s)

A full run writes bench/results/timer.json and .md; ``--quick`` (10,000 in the burst, 1 s windows) writes to
bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
import timeit

from procs import BENCH_DIR, run_meta, write_table

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.config import StoreConfig
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer import scheduling
from mqstore.timer.config import TimerConfig
from mqstore.timer.leadership import TimerDuty
from mqstore.timer.scheduling import Scheduler
from mqstore_rpc import append_wire
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

FULL = {"burst": 100_000, "seconds": 5.0, "rate": 1_000}
QUICK = {"burst": 10_000, "seconds": 1.0, "rate": 1_000}
BATCH = 100
ROUNDS = 3
BODY = b"x" * 100


def _store(root: pathlib.Path) -> tuple[MessageStore, TimerDuty, Scheduler]:
    store = build_store(StoreConfig(data_dir=root, segment_size_bytes=256 << 20))
    store.start()
    store.topic_admin.create("due", 1)
    duty = TimerDuty(store, TimerConfig(), root / "timer", leading=lambda: True)
    duty.start()
    return store, duty, Scheduler(store, TimerConfig(), duty.wake, duty.note)


def _close(store: MessageStore, duty: TimerDuty) -> None:
    duty.stop()
    duty.close()
    store.stop()


def _delivered(store: MessageStore) -> int:
    return store.queue_info("due", 0).max_offset


def _lateness_p99_ms(store: MessageStore) -> float:
    late, offset = [], 0
    while True:
        got = store.pull("due", 0, offset, 1000, 8 << 20).messages
        if not got:
            break
        late += [int(m.record.properties[tm.DEQUEUE_MS]) - int(m.record.properties[tm.DELIVER_MS]) for m in got]
        offset = got[-1].record.queue_offset + 1
    late.sort()
    return float(late[int(0.99 * (len(late) - 1))]) if late else 0.0


def burst(cfg: dict, root: pathlib.Path) -> dict:
    store, duty, scheduler = _store(root)
    try:
        # A whole second after the appends (about 10,000 delayed appends a second on a loaded machine): a run whose
        # appends end after it is marked so (its figure then counts appending).
        due_ms = (int(time.time()) + 2 + cfg["burst"] // 10_000) * 1000
        for _ in range(0, cfg["burst"], 1000):
            scheduler.append("due", [MessageIn(BODY, properties={tm.DELIVER_MS: str(due_ms + i % 1000)})
                                     for i in range(1000)])
        appended_ms = int(time.time() * 1000)
        while _delivered(store) < cfg["burst"] and time.time() * 1000 < due_ms + 120_000:
            time.sleep(0.01)  # the bench's measuring, not a synchronisation
        done_s = time.time() - due_ms / 1000
        return {"messages": cfg["burst"], "appended_before_due_s": (due_ms - appended_ms) / 1000,
                "all_delivered_s": done_s, "delivered": _delivered(store), "lateness_p99_ms": _lateness_p99_ms(store)}
    finally:
        _close(store, duty)


def _rate(append, seconds: float) -> tuple[int, float]:
    started, count = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        append()
        count += BATCH
    return count, time.monotonic() - started


def _caught_up_s(store: MessageStore, duty: TimerDuty) -> float:
    """The seconds until the timer has enqueued every record of its topic (its share of a delayed append)."""
    started, high = time.monotonic(), store.queue_info(tm.TIMER_TOPIC, 0).max_offset
    while (duty.timer is None or duty.timer.enqueue_offset < high) and time.monotonic() - started < 120:
        time.sleep(0.005)  # the bench's measuring, not a synchronisation
    return time.monotonic() - started


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _wire_append(scheduler: Scheduler, raw: bytes) -> None:
    """One Append as the CommitLog servicer runs it, from the request bytes to the response bytes."""
    request = append_wire.parse_request(raw)
    append_wire.append_response((scheduler.append(request.topic, append_wire.messages(request,
                                                                                      "ipv4:10.1.2.3:4567")),))


def append_ratio(cfg: dict, root: pathlib.Path, wire: bool = False) -> dict:
    """ROUNDS rounds of a delayed window then a plain one (``seconds`` / 2 each), the timer's enqueue caught up
    between (so the plain window does not pay for it): the medians. *sustained* counts the catch-up in the delayed
    window's time (the rate the timer keeps up with), the ratio is on it. ``wire``: the appends from request bytes
    (:func:`_wire_append`)."""
    store, duty, scheduler = _store(root)
    try:
        hour = str(3_600_000)
        if wire:
            delayed_raw = commitlog_pb2.AppendRequest(topic="due", messages=[common_pb2.MessageInput(
                body=BODY, delay_ms=3_600_000)] * BATCH).SerializeToString()
            plain_raw = commitlog_pb2.AppendRequest(topic="due", messages=[common_pb2.MessageInput(body=BODY)] * BATCH
                                                    ).SerializeToString()
            append_delayed = lambda: _wire_append(scheduler, delayed_raw)  # noqa: E731
            append_plain = lambda: _wire_append(scheduler, plain_raw)  # noqa: E731
        else:
            append_delayed = lambda: scheduler.append(  # noqa: E731
                "due", [MessageIn(BODY, properties={tm.DELAY_MS: hour})] * BATCH)
            append_plain = lambda: store.append("due", [MessageIn(BODY)] * BATCH)  # noqa: E731
        delayed, sustained, plain, ratios = [], [], [], []
        for _ in range(ROUNDS):
            count, took = _rate(append_delayed, cfg["seconds"] / 2)
            delayed.append(count / took)
            sustained.append(count / (took + _caught_up_s(store, duty)))
            count, took = _rate(append_plain, cfg["seconds"] / 2)
            plain.append(count / took)
            ratios.append(sustained[-1] / plain[-1])
        return {"delayed_per_s": _median(delayed), "sustained_per_s": _median(sustained),
                "plain_per_s": _median(plain), "ratio": _median(ratios), "rounds": ROUNDS, "ratios": ratios,
                "appended_ratio": _median([d / p for d, p in zip(delayed, plain, strict=True)])}
    finally:
        _close(store, duty)


def plain_check() -> dict:
    """ns per message of the Scheduler's check on a plain batch (every Append through the CommitLog servicer that
    the compiled codec does not take), against the two passes it replaced (check_reserved, then asks_timer)."""
    def before(messages):
        tm.check_reserved(messages)
        timed = [tm.asks_timer(m) for m in messages]
        return bool(timed) and timed[0]

    out = {}
    for name, props in (("none", None), ("two", {"a": "1", "bb": "2"})):
        batch = [MessageIn(BODY, properties=props)] * BATCH
        for label, check in (("before", before), ("after", scheduling._checked_timed)):
            best = min(timeit.repeat(lambda: check(batch), number=100, repeat=25))  # noqa: B023 (run here)
            out[f"{label}_{name}_ns"] = best / 100 / BATCH * 1e9
    return out


def steady(cfg: dict, root: pathlib.Path) -> dict:
    store, duty, scheduler = _store(root)
    try:
        per_tick, ticks = cfg["rate"] // 10, int(cfg["seconds"] * 10)
        started = time.monotonic()
        for tick in range(ticks):
            scheduler.append("due", [MessageIn(BODY, properties={tm.DELAY_MS: "1000"})] * per_tick)
            time.sleep(max(0.0, started + (tick + 1) / 10 - time.monotonic()))  # the offered rate
        total = per_tick * ticks
        deadline = time.monotonic() + 30
        while _delivered(store) < total and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"rate_per_s": cfg["rate"], "messages": total, "delivered": _delivered(store),
                "lateness_p99_ms": _lateness_p99_ms(store)}
    finally:
        _close(store, duty)


def markdown(rows: list[dict], meta: dict) -> str:
    b, a, s, c, w = rows
    lines = ["# The timer: delayed delivery (bench/timer.py)", "",
             f"{meta['when']}, {meta['machine']}, {meta['mode']}, {meta['git']}; in one process, real store and "
             f"clock",
             "", "| workload | figure | comparison | ratio / target |", "|---|---|---|---|",
             f"| {b['messages']:,} due in one second | all delivered {b['all_delivered_s']:.2f} s after it "
             f"(p99 {b['lateness_p99_ms']:.0f} ms late; appended {b['appended_before_due_s']:.1f} s before it) | "
             f"target 5 s | "
             f"{'met' if b['all_delivered_s'] <= 5 and b['delivered'] == b['messages'] else '**missed**'}"
             f"{'' if b['appended_before_due_s'] > 0 else ' (the appends ran past the due second)'} |",
             f"| delayed Append, batches of {BATCH} (median of {a['rounds']} rounds) | {a['sustained_per_s']:,.0f} "
             f"msg/s with the timer's enqueue ({a['delayed_per_s']:,.0f} appended, {a['appended_ratio']:.2f}x) | "
             f"plain Append {a['plain_per_s']:,.0f} msg/s | {a['ratio']:.2f}x (rounds: "
             f"{', '.join(f'{r:.2f}' for r in a['ratios'])}) "
             f"(>= 0.5x: {'met' if a['ratio'] >= 0.5 else '**missed**'}) |",
             f"| the same from the request bytes (the servicer's Append: compiled parser, timer_batch, AppendEncoder) "
             f"| {w['sustained_per_s']:,.0f} msg/s with the timer's enqueue ({w['delayed_per_s']:,.0f} appended, "
             f"{w['appended_ratio']:.2f}x) | plain Append {w['plain_per_s']:,.0f} msg/s | {w['ratio']:.2f}x (rounds: "
             f"{', '.join(f'{r:.2f}' for r in w['ratios'])}) "
             f"(>= 0.5x: {'met' if w['ratio'] >= 0.5 else '**missed**'}) |",
             f"| steady {s['rate_per_s']:,}/s due in 1 s | lateness p99 {s['lateness_p99_ms']:.0f} ms | one precision "
             f"1000 ms | {'met' if s['lateness_p99_ms'] <= 1000 and s['delivered'] == s['messages'] else '**missed**'}"
             f" |",
             f"| the Scheduler's check of a plain batch (no properties; two) | {c['after_none_ns']:.0f}; "
             f"{c['after_two_ns']:.0f} ns/message | the two passes before: {c['before_none_ns']:.0f}; "
             f"{c['before_two_ns']:.0f} ns/message | (no target: not slower) |"]
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (to bench/results/scratch/)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = BENCH_DIR / "results" / ("scratch" if args.quick else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqstore-timer-") as work:
        rows = [burst(cfg, pathlib.Path(work) / "burst"), append_ratio(cfg, pathlib.Path(work) / "append"),
                steady(cfg, pathlib.Path(work) / "steady"), plain_check(),
                append_ratio(cfg, pathlib.Path(work) / "wire", wire=True)]
    for row in rows:
        print(row, flush=True)
    write_table(out_dir, "timer", run_meta("quick" if args.quick else "full", **cfg), rows, {}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
