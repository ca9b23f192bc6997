"""SYNC group commit with each flush delay, against Redis ``appendfsync always``, in one run.

``.venv/bin/python bench/sync_delay.py [--rounds 3] [--delays-us 0,1000,2000] [--producers 1,2,8,32]``
measures Append 100 x 1 KiB under ``--flush-mode SYNC`` with each
``--sync-flush-delay-us`` (0: the fsync starts as soon as an append asks; otherwise the longest it waits for
as many appends as the last fsync acknowledged, 2000 by default: mqstore.log.flush), in alternating rounds
with Redis Streams under ``appendfsync always`` (pipeline 100, the same number of connections as producers).
Prints each round and the medians with their ratio to Redis, and writes bench/results/scratch/sync_delay.json.
Each round runs on an empty store, deleted after it. Not part of ``make bench`` (bench/README.md, *Append on
the event loop*, has its figures).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile

import append
import redis_peer
from procs import BENCH_DIR, GrpcServer, stop_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays-us", default="0,1000,2000")
    parser.add_argument("--producers", default="1,2,8,32")
    parser.add_argument("--duration-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    delays = [int(d) for d in args.delays_us.split(",")]
    timing = {"warmup_s": 1.0, "duration_s": args.duration_s, "channels": 1}
    redis_peer.ensure_installed()
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-sync-delay-"))
    results: dict[str, list[dict]] = {}
    redis = None
    try:
        redis = redis_peer.RedisServer(work, "always").start()
        for producers in (int(p) for p in args.producers.split(",")):
            for round_ in range(args.rounds):
                for delay in delays:
                    data = work / f"sync-{delay}-{producers}-{round_}"
                    server = GrpcServer.commitlog(data, "SYNC", extra=("--sync-flush-delay-us", str(delay)))
                    server.start().check_codec()
                    append.create_topic(server.target)
                    try:
                        r = append.measure(server, "unary-100", producers, timing, 1)
                    finally:
                        server.stop()
                        shutil.rmtree(data, ignore_errors=True)
                    results.setdefault(f"delay-{delay}us {producers}p", []).append(r)
                    print(f"{producers:2}p round {round_ + 1}/{args.rounds} delay {delay:5} us  msgs/s="
                          f"{r['msgs_per_s']:9,.0f} p50_ms={r['p50_ms']:.2f} p99_ms={r['p99_ms']:.2f}", flush=True)
                r = redis.measure(producers, args.duration_s, 20_000)
                results.setdefault(f"redis-always {producers}p", []).append(r)
                print(f"{producers:2}p round {round_ + 1}/{args.rounds} redis always     msgs/s="
                      f"{r['msgs_per_s']:9,.0f} p50_ms={r['p50_ms']:.2f}", flush=True)
    finally:
        if redis is not None:
            redis.stop()
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    medians = {key: statistics.median(r["msgs_per_s"] for r in rounds) for key, rounds in results.items()}
    for key, median in medians.items():
        producers = key.split()[-1]
        ratio = median / medians[f"redis-always {producers}"]
        p50 = statistics.median(r["p50_ms"] for r in results[key])
        print(f"{key:22} median {median:9,.0f} msgs/s  p50 {p50:.2f} ms  {ratio:.2f}x Redis always")
    out = BENCH_DIR / "results" / "scratch"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sync_delay.json").write_text(json.dumps({"loadavg": os.getloadavg(), "medians": medians,
                                                     "rounds": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
