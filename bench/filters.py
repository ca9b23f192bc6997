"""Filter benchmark (run by ``make bench``): ``bench/filters.py [--quick]``.

Workload, as a real commit log process on 127.0.0.1 (ASYNC flush): one queue filled with ``messages``
messages of 1 KiB, message i with TAGS ``t{i % 10}`` and properties ``bucket`` = i % 10, ``price`` = i %
1000 and ``region`` = eu or us. One consumer reads the whole queue with Pull (32 messages a call, closed
loop, from offset 0 to the end) under each filter:

* tag: ``tags = ["t3"]``, 10% of the messages (the consume queue's tag codes skip the others without
  reading the log);
* SQL92 simple: ``bucket = '3'``, the same 10% (every record's properties are read and evaluated);
* SQL92 compound: ``bucket = '3' AND price >= 0 AND region IN ('eu', 'us')``, the same 10%;
* SQL92 requiring a tag: ``TAGS = 't3' AND price >= 0``, the same 10% (the expression requires TAGS t3,
  so the read skips the other entries by their tag code as a tag filter does, then evaluates the rest);
* none: every message, for scale.

Measured: queue entries walked per second (the queue's length over the time to read it) and messages
delivered per second. The filters take turns over ``rounds`` rounds; the table gives the medians and the
ratio of each SQL92 filter to the tag filter (no target: the issue asks for the ratio).

A full run writes bench/results/filters.json and filters.md; ``--quick`` writes to bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import diskuse
from procs import BenchError, run_meta, spawn, stop, stop_all, wait_for_event, write_table

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
TOPIC = "filters"
BATCH = 32
BODY = b"x" * 1024
FULL = {"messages": 50_000, "rounds": 3}
QUICK = {"messages": 5_000, "rounds": 1}
SQL = common_pb2.FILTER_TYPE_SQL92
FILTERS = {
    "tag": dict(tags=["t3"]),
    "sql_simple": dict(filter_type=SQL, filter_expression="bucket = '3'"),
    "sql_compound": dict(filter_type=SQL, filter_expression="bucket = '3' AND price >= 0 AND region IN ('eu', 'us')"),
    "sql_tags": dict(filter_type=SQL, filter_expression="TAGS = 't3' AND price >= 0"),
    "none": {},
}
LABELS = {"tag": "Pull, tag filter t3 (10%)", "sql_simple": "Pull, SQL92 bucket = '3' (10%)",
          "sql_compound": "Pull, SQL92 bucket = '3' AND price >= 0 AND region IN (...) (10%)",
          "sql_tags": "Pull, SQL92 TAGS = 't3' AND price >= 0 (10%, skipped by tag code)",
          "none": "Pull, no filter (100%)"}


def start_log(work: pathlib.Path) -> tuple[object, str]:
    log_path = work / "commitlog.err"
    proc = spawn([sys.executable, "-m", "commitlog_service.main", "--port", "0", "--data-dir", str(work / "log")],
                 log_path, env=dict(os.environ))
    event = wait_for_event(proc, log_path, "server.started", 60)
    return proc, f"127.0.0.1:{event['port']}"


def fill(stub, messages: int) -> None:
    stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=10)
    for start in range(0, messages, 1000):
        batch = [common_pb2.MessageInput(body=BODY, tags=f"t{i % 10}", properties={
            "bucket": str(i % 10), "price": str(i % 1000), "region": "eu" if i % 2 else "us"})
            for i in range(start, min(start + 1000, messages))]
        stub.Append(commitlog_pb2.AppendRequest(topic=TOPIC, messages=batch), timeout=30)


def read_all(stub, messages: int, fields: dict) -> dict:
    """Pull from offset 0 to the end of the queue with ``fields``' filter."""
    offset = delivered = calls = 0
    started = time.monotonic()
    while offset < messages:
        page = stub.Pull(commitlog_pb2.PullRequest(topic=TOPIC, offset=offset, max_messages=BATCH, **fields),
                         timeout=30)
        offset, delivered, calls = page.next_offset, delivered + len(page.messages), calls + 1
    elapsed = time.monotonic() - started
    return {"entries_per_s": messages / elapsed, "delivered_per_s": delivered / elapsed, "delivered": delivered,
            "calls": calls, "elapsed_s": elapsed}


def measure(cfg: dict, work: pathlib.Path) -> dict:
    proc, address = start_log(work)
    raw: dict = {name: [] for name in FILTERS}
    try:
        with grpc.insecure_channel(address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            fill(stub, cfg["messages"])
            read_all(stub, cfg["messages"], {})  # warm: the page cache and the server's first calls
            for round_index in range(cfg["rounds"]):
                for name, fields in FILTERS.items():
                    result = read_all(stub, cfg["messages"], fields)
                    raw[name].append(result)
                    print(name, "round", round_index, result, flush=True)
    finally:
        stop(proc)
    return raw


def rows(raw: dict) -> list[dict]:
    medians = {name: statistics.median(r["entries_per_s"] for r in runs) for name, runs in raw.items()}
    delivered = {name: statistics.median(r["delivered_per_s"] for r in runs) for name, runs in raw.items()}
    out = []
    for name in FILTERS:
        comparison = "none" if name == "tag" else "tag"
        out.append({"workload": f"{LABELS[name]}: queue entries walked/s", "figure": medians[name],
                    "comparison": LABELS[comparison], "comparison_figure": medians[comparison],
                    "ratio": round(medians[name] / medians[comparison], 3), "delivered_per_s": delivered[name]})
    return out


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# Filter benchmark: SQL92 against tags", "",
             f"{meta['when']} at {meta['git']} on {meta['machine']}; {meta['mode']} run: {meta['messages']} "
             f"messages of 1 KiB in one queue, read whole by one Pull consumer ({BATCH} a call) per filter; medians "
             f"of {meta['rounds']} alternating round(s). Workload: bench/filters.py. " + diskuse.describe(meta), "",
             "| workload | figure | comparison point | comparison | ratio | delivered msgs/s |",
             "|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['workload']} | {_fmt(r['figure'])} | {r['comparison']} | {_fmt(r['comparison_figure'])} | "
                     f"{_fmt(r['ratio'])} | {_fmt(r['delivered_per_s'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args, _ = parser.parse_known_args(argv)  # `make bench` passes run.py's options to every script
    cfg = QUICK if args.quick else FULL
    out_dir = RESULTS / "scratch" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-filters-bench-"))
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            raw = measure(cfg, work)
    except BenchError as exc:
        print(f"filters bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta("quick" if args.quick else "full", **cfg, **watch.report())
    write_table(out_dir, "filters", meta, rows(raw), raw, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
