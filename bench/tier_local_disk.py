"""Local disk held by a topic with a long total retention and a short local retention, against what it holds
with everything local: ``make bench`` runs ``bench/tier_local_disk.py`` (bench/README.md, *The tier local disk
benchmark*).

Issue 36: "Local disk held by a topic with 7 days' retention and 1 hour local retention, at a steady append
rate: <= 1/100 of today's". Time is scaled: an hour is SCALE_MS (``--local-retention-ms``), 7 days 168 of them
(``--retention-ms``), segments are small (SEGMENT bytes), and one producer appends at a steady RATE (batches
on a fixed tick) for RUN scaled hours. The commit log (moto's S3 on loopback, ``--tier-upload-interval-ms``
200) uploads each sealed segment and local retention deletes it once its file is an hour old. From the second
scaled hour on, the bench samples what the data directory holds on disk (allocated blocks) every 250 ms: the
commit log's files, the consume queue files and the rest.

Today's (all local) is computed from the run's own rates, not run for 168 hours: the log bytes appended per
second x the total retention, plus the consume queue's 20 bytes per message for as long. The consume queue's
sealed files are tiered too (issue 36: uploaded once the segments they point into are, deleted locally once
their last record is below the local log), so what the run's queue files hold locally is measured like the log
(files of ``cq_entries`` entries, a whole number of 4 KiB blocks, about half a scaled hour each). The ratio is
held / all-local, for the log, the queue and both (the whole topic); the scaling table extends the measured
overheads (what the local log and queue hold beyond one hour of appends, in segments and in queue files) to real
rates with 1 GiB segments and consume queue files of 300,000 entries.

A full run writes bench/results/tier_local_disk.json and .md; ``--quick`` writes to bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import boto3
import grpc
from procs import BENCH_DIR, GrpcServer, run_meta, stop, write_table
from tier_reads import KEYS, _moto

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
FULL = {"scale_ms": 4000, "hours": 8, "segment_bytes": 1 * MiB, "rate_bytes": 2 * MiB, "body_bytes": 4 * KiB,
        "tick_ms": 50, "cq_entries": 1024}
QUICK = {"scale_ms": 2000, "hours": 4, "segment_bytes": 256 * KiB, "rate_bytes": 1 * MiB, "body_bytes": 4 * KiB,
         "tick_ms": 50, "cq_entries": 512}
TOTAL_HOURS = 7 * 24
TARGET = 1 / 100
CQ_ENTRY = 20
REAL_CQ_ENTRIES = 300_000  # the consume queue's default entries per file (the scaling table)
SCALING_RATES = (1e6, 10e6, 100e6)  # bytes/s of log, real time
SCALING_BODIES = (1 * KiB, 16 * KiB)


def _allocated(path: pathlib.Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass  # deleted meanwhile
    return total


def measure(cfg: dict, work: pathlib.Path) -> tuple[list[dict], dict]:
    moto, endpoint = _moto(work)
    server = None
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="bench")
        data_dir = work / "node"
        server = GrpcServer.commitlog(data_dir, "ASYNC", extra=(
            "--segment-size-bytes", str(cfg["segment_bytes"]), "--warm-ahead-bytes", "0",
            "--cq-entries-per-file", str(cfg["cq_entries"]),
            "--tier-url", "s3://bench/node", "--tier-endpoint", endpoint, "--tier-upload-interval-ms", "200",
            "--local-retention-ms", str(cfg["scale_ms"]), "--retention-ms", str(cfg["scale_ms"] * TOTAL_HOURS)))
        server.env = {**(server.env or {}), **KEYS}
        server.start()
        channel = grpc.insecure_channel(server.target)
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=30)
        per_tick = max(int(cfg["rate_bytes"] * cfg["tick_ms"] / 1000) // cfg["body_bytes"], 1)
        body = bytes(range(256)) * (cfg["body_bytes"] // 256)
        request = pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=body)] * per_tick)
        tick, hour = cfg["tick_ms"] / 1000, cfg["scale_ms"] / 1000
        started = time.monotonic()
        end = started + cfg["hours"] * hour
        samples, messages, late_ticks = [], 0, 0
        next_tick, next_sample = started, started + hour
        start_offset = None
        while (now := time.monotonic()) < end:
            if now >= next_sample:
                log_bytes = _allocated(data_dir / "commitlog")
                cq_bytes = _allocated(data_dir / "consumequeue")
                cq_files = sum(1 for p in (data_dir / "consumequeue" / "t").glob("*/*") if p.name.isdigit())
                samples.append({"t_hours": (now - started) / hour, "log": log_bytes, "cq": cq_bytes,
                                "cq_files": cq_files, "all": _allocated(data_dir)})
                next_sample += 0.25
                if start_offset is None:
                    start_offset = (stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=30).max_physical_offset,
                                    messages, now)
            if now >= next_tick:
                stub.Append(request, timeout=30)
                messages += per_tick
                next_tick += tick
                if time.monotonic() > next_tick:
                    late_ticks += 1
            else:
                time.sleep(min(next_tick, next_sample) - now)
        info = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=30)
        status = stub.GetTierStatus(pb.GetTierStatusRequest(), timeout=30)
        seconds = time.monotonic() - start_offset[2]
        channel.close()
    finally:
        if server is not None:
            server.stop()
        stop(moto)
    log_rate = (info.max_physical_offset - start_offset[0]) / seconds  # bytes of log a second (records)
    msg_rate = (messages - start_offset[1]) / seconds
    total_s = cfg["scale_ms"] * TOTAL_HOURS / 1000
    all_log, all_cq = log_rate * total_s, msg_rate * CQ_ENTRY * total_s
    steady = [s for s in samples if s["t_hours"] >= 2]  # from the second hour: the first deletions are due
    held_log = statistics.mean(s["log"] for s in steady)
    held_cq = statistics.mean(s["cq"] for s in steady)
    max_log = max(s["log"] for s in steady)
    hour_bytes = log_rate * cfg["scale_ms"] / 1000
    overhead_segments = (held_log - hour_bytes) / cfg["segment_bytes"]
    max_all = max(s["log"] + s["cq"] for s in steady)
    hour_files = msg_rate * cfg["scale_ms"] / 1000 / cfg["cq_entries"]  # an hour of entries, in files
    overhead_cq_files = statistics.mean(s["cq_files"] for s in steady) - hour_files
    rows = [{"what": "commit log", "held_bytes": held_log, "max_held_bytes": max_log, "all_local_bytes": all_log,
             "ratio": held_log / all_log},
            {"what": "consume queue", "held_bytes": held_cq, "max_held_bytes": max(s["cq"] for s in steady),
             "all_local_bytes": all_cq, "ratio": held_cq / all_cq},
            {"what": "the whole topic: commit log and consume queue", "held_bytes": held_log + held_cq,
             "max_held_bytes": max_all, "all_local_bytes": all_log + all_cq,
             "ratio": (held_log + held_cq) / (all_log + all_cq)}]
    scaling = []
    record_overhead = log_rate / msg_rate - cfg["body_bytes"]  # bytes a record adds to its body
    for rate in SCALING_RATES:
        for body_bytes in SCALING_BODIES:
            rec = body_bytes + record_overhead
            log_held = rate * 3600 + overhead_segments * GiB
            log_all = rate * 3600 * TOTAL_HOURS
            cq = rate / rec * CQ_ENTRY * 3600 * TOTAL_HOURS
            cq_held = rate / rec * CQ_ENTRY * 3600 + max(overhead_cq_files, 0) * REAL_CQ_ENTRIES * CQ_ENTRY
            scaling.append({"rate_bytes": rate, "body_bytes": body_bytes, "log_ratio": log_held / log_all,
                            "ratio": (log_held + cq_held) / (log_all + cq)})
    raw = {"samples": samples, "cq_held_in_run": held_cq, "log_rate": log_rate, "msg_rate": msg_rate,
           "hour_bytes": hour_bytes,
           "overhead_segments": overhead_segments, "overhead_cq_files": overhead_cq_files,
           "record_overhead": record_overhead, "late_ticks": late_ticks,
           "scaling": scaling, "tiered_segments": status.tiered_segments, "copy_lag_segments": status.copy_lag_segments,
           "local_min": status.local_min, "logical_min": status.logical_min}
    return rows, raw


def markdown(rows: list[dict], meta: dict, raw: dict | None = None) -> str:
    hour_s = meta["scale_ms"] / 1000
    lines = ["# Local disk held with 7 days' retention and 1 hour local retention (bench/tier_local_disk.py)", "",
             f"{meta['when']}, {meta['machine']}, {meta['mode']}, {meta['git']}; time scaled: 1 hour = {hour_s:g} s "
             f"(--local-retention-ms {meta['scale_ms']}, --retention-ms {meta['scale_ms'] * TOTAL_HOURS}), "
             f"{meta['segment_bytes'] // KiB} KiB segments, one producer at {meta['rate_bytes'] / MiB:g} MiB/s of "
             f"{meta['body_bytes'] // KiB} KiB bodies for {meta['hours']} scaled hours, sampled from the second; "
             f"consume queue files of {meta.get('cq_entries', 0)} entries, tiered too; "
             "S3 is moto's server on loopback", "",
             "| held locally | mean bytes | max bytes | all local (7 days at the run's rate) | ratio | target |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        verdict = "met" if r["ratio"] <= TARGET else "**missed**"
        target = "(a part of the topic)" if r["what"] == "consume queue" else f"<= 1/100: {verdict}"
        lines.append(f"| {r['what']} | {r['held_bytes'] / MiB:,.1f} MiB | {r['max_held_bytes'] / MiB:,.1f} MiB | "
                     f"{r['all_local_bytes'] / MiB:,.0f} MiB | 1/{1 / r['ratio']:,.0f} | {target} |")
    if raw is not None:
        lines += ["", f"The log grew {raw['log_rate'] / MiB:.2f} MiB/s ({raw['msg_rate']:,.0f} msgs/s): one scaled "
                  f"hour is {raw['hour_bytes'] / MiB:.1f} MiB; the local log held {raw['overhead_segments']:.1f} "
                  "segments beyond it on average (the active segment, the sealed one waiting for its upload and "
                  f"the hour's granularity), the local queue {raw['overhead_cq_files']:.1f} files beyond its hour "
                  "of entries (the active file, preallocated, and the ones whose last record is still in the local "
                  "log). Scaled to real rates, 1 GiB segments, 300,000-entry queue files and those overheads:", "",
                  "| log MB/s | body | log held / all local | log and queue held / all local |", "|---|---|---|---|"]
        for s in raw["scaling"]:
            lines.append(f"| {s['rate_bytes'] / 1e6:g} | {s['body_bytes'] // KiB} KiB | 1/{1 / s['log_ratio']:,.0f} | "
                         f"1/{1 / s['ratio']:,.0f} |")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (to bench/results/scratch/)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = BENCH_DIR / "results" / ("scratch" if args.quick else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqstore-tier-local-disk-") as work:
        rows, raw = measure(cfg, pathlib.Path(work))
    write_table(out_dir, "tier_local_disk", run_meta("quick" if args.quick else "full", **cfg), rows, raw,
                lambda table, meta: markdown(table, meta, raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
