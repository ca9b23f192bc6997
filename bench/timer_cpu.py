"""CPU per message of the timer's paths in one thread (bench/README.md's timer section; not in make bench): plain
Append, delayed Append (due in an hour) and the timer's enqueue of it, delivery of due copies, each timed with
time.process_time around 30,000 messages in batches of 100 (the timer stepped here, no duty thread: no GIL hand-offs
in the figure).
The ratio plain / (delayed + enqueue) is what bench/timer.py's sustained ratio reaches on an idle machine.
*wire_plain* and *wire_delayed* are the same appends as the CommitLog servicer's Append takes them: from the
AppendRequest bytes (mqstore_rpc.append_wire: the compiled parser, or protobuf where it declines) to the
AppendResponse bytes; *wire_ratio* = wire_plain / (wire_delayed + enqueue), the gRPC path's. *internal_plain* and
*internal_delayed* are the gateway's sends as CommitLogInternal.AppendBatches takes them (commitlog_service.internal:
one batch of 100 with born hosts, writer "gateway", the delayed ones with TIMER_DELIVER_MS as the gateway writes a
DELAY send), from the InternalAppendBatchesRequest bytes to the response bytes; *internal_ratio* likewise.

  .venv/bin/python bench/timer_cpu.py [--rounds 3] [--json PATH --label NAME]

``--json PATH`` appends this run (its label, the time, the load average, each round and the medians) to the JSON
list in PATH (bench/results/timer_cpu.json holds the alternating before/after series bench/README cites); run with
another tree's PYTHONPATH, the same script measures that tree's code.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.clock import FakeClock
from mqstore.config import StoreConfig
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig
from mqstore.timer.scheduling import Scheduler
from mqstore.timer.timer import Timer
from mqstore_rpc import append_wire
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

BATCHES, BATCH, BODY = 300, 100, b"x" * 100
PEER = "ipv4:10.1.2.3:4567"


def _request(**fields) -> bytes:
    return commitlog_pb2.AppendRequest(topic="due", messages=[common_pb2.MessageInput(body=BODY, **fields)] * BATCH
                                       ).SerializeToString()


def _wire_appends(scheduler: Scheduler, raw: bytes) -> float:
    """CPU seconds of BATCHES Appends of ``raw`` as the servicer's Append runs them (request bytes to response)."""
    started = time.process_time()
    for _ in range(BATCHES):
        request = append_wire.parse_request(raw)
        results = scheduler.append(request.topic, append_wire.messages(request, PEER))
        append_wire.append_response((results,))
    return time.process_time() - started


def _internal_request(**properties) -> bytes:
    message = commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=BODY, properties=properties),
                                            born_host="10.0.0.9:4711")
    return commitlog_pb2.InternalAppendBatchesRequest(writer="gateway", batches=[
        commitlog_pb2.InternalAppendBatch(topic="due", messages=[message] * BATCH)]).SerializeToString()


def _internal_appends(scheduler: Scheduler, raw: bytes) -> float:
    """CPU seconds of BATCHES AppendBatches of ``raw`` as the CommitLogInternal servicer runs a gateway's."""
    started = time.process_time()
    for _ in range(BATCHES):
        request = append_wire.parse_internal_batches(raw)
        outcomes = [scheduler.append(batch.topic, append_wire.internal_messages(batch, PEER), writer=request.writer)
                    for batch in request.batches]
        append_wire.batches_response(outcomes)
    return time.process_time() - started


def _round(root: pathlib.Path) -> dict:
    clock = FakeClock(int(time.time() * 1000))
    store = build_store(StoreConfig(data_dir=root, segment_size_bytes=256 << 20), clock)
    store.start()
    try:
        store.topic_admin.create("due", 4)
        timer = Timer(store, TimerConfig(), root / "timer")
        timer.open()
        scheduler = Scheduler(store, TimerConfig(), lambda: None, timer.note)
        count = BATCHES * BATCH
        started = time.process_time()
        for _ in range(BATCHES):
            store.append("due", [MessageIn(BODY)] * BATCH)
        plain = time.process_time() - started
        started = time.process_time()
        for _ in range(BATCHES):  # due in an hour, as bench/timer.py's append rounds
            scheduler.append("due", [MessageIn(BODY, properties={tm.DELAY_MS: "3600000"})] * BATCH)
        delayed = time.process_time() - started
        started = time.process_time()
        while timer.enqueue_offset < store.queue_info(tm.TIMER_TOPIC, 0).max_offset:
            timer.step()
        enqueue = time.process_time() - started
        due = str(clock.now_ms() + 500)
        for _ in range(BATCHES):
            scheduler.append("due", [MessageIn(BODY, properties={tm.DELIVER_MS: due})] * BATCH)
        while timer.enqueue_offset < store.queue_info(tm.TIMER_TOPIC, 0).max_offset:
            timer.step()
        clock.advance(1000)
        started = time.process_time()
        while timer.stats.delivered < count:
            timer.step()
        delivery = time.process_time() - started
        wire_plain = _wire_appends(scheduler, _request())
        wire_delayed = _wire_appends(scheduler, _request(delay_ms=3_600_000))
        while timer.enqueue_offset < store.queue_info(tm.TIMER_TOPIC, 0).max_offset:
            timer.step()
        internal_plain = _internal_appends(scheduler, _internal_request())
        internal_delayed = _internal_appends(scheduler, _internal_request(
            **{tm.DELIVER_MS: str(clock.now_ms() + 3_600_000)}))
        while timer.enqueue_offset < store.queue_info(tm.TIMER_TOPIC, 0).max_offset:
            timer.step()
        timer.close()
        us = 1e6 / count
        return {"plain_us": plain * us, "delayed_us": delayed * us, "enqueue_us": enqueue * us,
                "delivery_us": delivery * us, "wire_plain_us": wire_plain * us, "wire_delayed_us": wire_delayed * us,
                "internal_plain_us": internal_plain * us, "internal_delayed_us": internal_delayed * us}
    finally:
        store.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path, help="append this run to the JSON list in this file")
    parser.add_argument("--label", default="", help="what code this run measured (with --json), e.g. its commit")
    args = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="mqstore-timer-cpu-") as work:
        for n in range(args.rounds):
            rounds.append(_round(pathlib.Path(work) / str(n)))
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratio = med["plain_us"] / (med["delayed_us"] + med["enqueue_us"])
    wire_ratio = med["wire_plain_us"] / (med["wire_delayed_us"] + med["enqueue_us"])
    internal_ratio = med["internal_plain_us"] / (med["internal_delayed_us"] + med["enqueue_us"])
    print(" ".join(f"{k}={v:.2f}" for k, v in med.items()), f"ratio={ratio:.2f} wire_ratio={wire_ratio:.2f} "
          f"internal_ratio={internal_ratio:.2f}", flush=True)
    if args.json is not None:
        runs = json.loads(args.json.read_text()) if args.json.exists() else []
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        runs.append({"label": args.label, "when": when,
                     "load_average": os.getloadavg()[0], "rounds": rounds, "median": med,
                     "ratio": ratio, "wire_ratio": wire_ratio, "internal_ratio": internal_ratio})
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
