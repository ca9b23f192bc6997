"""Pull of messages only in the object storage tier vs the same Pull from local disk: ``make bench`` runs
``bench/tier_reads.py`` (bench/README.md).

Issue 36: with ``--local-retention-bytes`` the commit log deletes uploaded segments locally and Pull reads them
back from the tier (mqstore.tier.reads: aligned range GETs of ``--tier-read-ahead-bytes``, a cache of
``--tier-cache-bytes``). Two commit log processes get the same messages (one queue, BODY-byte bodies, FILL bytes
in all, SEGMENT-byte segments):

  tier    --tier-url s3://... on moto's server (its own process, on 127.0.0.1), --local-retention-bytes of two
          segments: once every sealed segment is uploaded and deleted locally, the range measured is only in
          the tier
  local   no tier: the same range is in the local files (read from the disk where drop-behind gave their pages
          back: --page-cache-keep-bytes keeps the last 1 GiB)

The figure is MB/s of message bodies one consumer pulls (Pull, max_bytes 8 MiB) over the range the tier
process holds only in the tier, best of ROUNDS passes; each tier pass starts with a cold cache (a pass reads
more than ``--tier-cache-bytes``). Issue 36's target: tier >= 0.5x local.

A full run (1 GiB only in the tier, 8 MiB segments; about 3 minutes) writes bench/results/tier_reads.json and .md;
``--quick`` (16 MiB) writes to bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

import boto3
import grpc
from procs import BENCH_DIR, PYTHON, GrpcServer, free_port, run_meta, spawn, stop, write_table

from mqstore.tier.config import TierConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2

MiB = 1 << 20
_DEFAULTS = TierConfig()
# full: the 1 GiB only in the tier (the fill's last three segments stay local or sealing), the read-ahead and
# cache at their defaults (mqstore.tier.config). Segments of 8 MiB, not the 64 MiB or 1 GiB a deployment would use:
# moto copies the whole object for each range GET (a 4 MiB range of a 64 MiB object 51 ms, of an 8 MiB one 9.5 ms,
# 2026-12-07), where S3's cost of a range does not grow with its object; larger segments measure moto, not the store.
FULL = {"fill_bytes": 1024 * MiB + 3 * 8 * MiB, "segment_bytes": 8 * MiB, "body_bytes": 16 << 10, "rounds": 3,
        "read_ahead_bytes": _DEFAULTS.tier_read_ahead_bytes, "cache_bytes": _DEFAULTS.tier_cache_bytes}
QUICK = {"fill_bytes": 16 * MiB, "segment_bytes": 2 * MiB, "body_bytes": 16 << 10, "rounds": 1,
         "read_ahead_bytes": 1 * MiB, "cache_bytes": 4 * MiB}
TARGET = 0.5
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}


def _moto(work: pathlib.Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = spawn([str(pathlib.Path(PYTHON).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                 work / "moto.log")
    deadline = time.monotonic() + 60
    while not _answers(endpoint := f"http://127.0.0.1:{port}"):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"moto_server did not start; see {work / 'moto.log'}")
        time.sleep(0.05)
    return proc, endpoint


def _answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
        return True
    except OSError:
        return False


def _fill(stub, cfg: dict) -> int:
    stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=30)
    per_batch = max(MiB // cfg["body_bytes"], 1)
    count = 0
    for batch in range(cfg["fill_bytes"] // (per_batch * cfg["body_bytes"])):
        stub.Append(pb.AppendRequest(topic="t", messages=[
            common_pb2.MessageInput(body=bytes([(batch + i) % 251]) * cfg["body_bytes"]) for i in range(per_batch)]),
            timeout=60)
        count += per_batch
    return count


def _pull(stub, first: int, end: int) -> tuple[float, int]:
    """(seconds, body bytes) of pulling queue offsets [first, end)."""
    offset, got = first, 0
    started = time.perf_counter()
    while offset < end:
        response = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=offset, max_messages=10_000,
                                            max_bytes=8 * MiB), timeout=120)
        taken = [m for m in response.messages if m.queue_offset < end]
        if not taken:
            raise RuntimeError(f"Pull at {offset} returned nothing before {end}")
        got += sum(len(m.body) for m in taken)
        offset = taken[-1].queue_offset + 1
    return time.perf_counter() - started, got


def _tiered_end(stub, data_dir: pathlib.Path, count: int, cfg: dict) -> int:
    """Waits until the local log starts at least two segments past 0; the queue offset of its first message."""
    deadline = time.monotonic() + 300
    while True:
        files = sorted(int(p.name) for p in (data_dir / "commitlog").iterdir() if p.name.isdigit())
        if files and files[0] >= cfg["fill_bytes"] - 3 * cfg["segment_bytes"]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"local retention did not delete the uploaded segments: local files {files}")
        time.sleep(0.2)
    local_min = files[0]
    low, high = 0, count  # the first queue offset whose record lies in the local log
    while low < high:
        mid = (low + high) // 2
        message = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=mid, max_messages=1), timeout=60).messages[0]
        if message.physical_offset < local_min:
            low = mid + 1
        else:
            high = mid
    return low


def measure(cfg: dict, work: pathlib.Path) -> tuple[list[dict], dict]:
    moto, endpoint = _moto(work)
    servers = []
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="bench")
        common = ("--segment-size-bytes", str(cfg["segment_bytes"]))
        tier = GrpcServer.commitlog(work / "tier", "ASYNC", extra=(
            *common, "--tier-url", "s3://bench/node", "--tier-endpoint", endpoint, "--tier-upload-interval-ms", "200",
            "--local-retention-bytes", str(2 * cfg["segment_bytes"]),
            "--tier-read-ahead-bytes", str(cfg["read_ahead_bytes"]), "--tier-cache-bytes", str(cfg["cache_bytes"])))
        tier.env = {**(tier.env or {}), **KEYS}
        local = GrpcServer.commitlog(work / "local", "ASYNC", extra=common)
        raw: dict[str, list[float]] = {"tier": [], "local": []}
        stubs = {}
        for name, server in (("tier", tier), ("local", local)):
            servers.append(server.start())
            channel = grpc.insecure_channel(server.target, options=[("grpc.max_receive_message_length", 16 * MiB)])
            stubs[name] = commitlog_pb2_grpc.CommitLogStub(channel)
            count = _fill(stubs[name], cfg)
        end = _tiered_end(stubs["tier"], tier.data_dir, count, cfg)
        pulled = 0
        for round_ in range(cfg["rounds"]):
            for name in ("tier", "local"):
                seconds, pulled = _pull(stubs[name], 0, end)
                raw[name].append(pulled / seconds / 1e6)
                print(f"round {round_} {name:5} {pulled / seconds / 1e6:,.1f} MB/s ({pulled / MiB:.0f} MiB)",
                      flush=True)
    finally:
        for server in servers:
            server.stop()
        stop(moto)
    best = {name: max(rates) for name, rates in raw.items()}
    rows = [{"source": "tier (moto on loopback)", "mb_per_s": best["tier"], "ratio": best["tier"] / best["local"],
             "target": TARGET},
            {"source": "local disk", "mb_per_s": best["local"], "ratio": 1.0, "target": None}]
    raw["range_bytes"] = [pulled]
    return rows, raw


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Pull from the object storage tier vs local disk (bench/tier_reads.py)", "",
             f"{meta['when']}, {meta['machine']}, {meta['mode']}, {meta['git']}; {meta['fill_bytes'] // MiB} MiB "
             f"appended in {meta['segment_bytes'] // MiB} MiB segments, bodies of {meta['body_bytes']} bytes, "
             f"read-ahead {meta['read_ahead_bytes'] // MiB} MiB, cache {meta['cache_bytes'] // MiB} MiB; one "
             f"consumer pulls the range only in the tier, best of {meta['rounds']}", "",
             "| source | MB/s of bodies | vs local | target |", "|---|---|---|---|"]
    for r in rows:
        target = "" if r["target"] is None else (f">= {r['target']}x: " + ("met" if r["ratio"] >= r["target"]
                                                                          else "**missed**"))
        lines.append(f"| {r['source']} | {r['mb_per_s']:,.1f} | {r['ratio']:.2f}x | {target} |")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (to bench/results/scratch/)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = BENCH_DIR / "results" / ("scratch" if args.quick else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqstore-tier-reads-") as work:
        rows, raw = measure(cfg, pathlib.Path(work))
    write_table(out_dir, "tier_reads", run_meta("quick" if args.quick else "full", **cfg), rows, raw, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
