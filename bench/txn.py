"""Transaction service benchmark (run by ``make bench`` after the commit log's): ``bench/txn.py [--quick]``.

Workload, all as real processes on 127.0.0.1 (a commit log, ASYNC flush, and a txn service): N
producers (1, 8, 32; closed loop, grpc.aio in this process) each run Prepare (one 256-byte message)
then Commit of the returned id, as fast as they can, for ``duration_s`` after ``warmup_s``. Measured:
transactions/s, p50/p99 of Prepare+Commit, the half:OP message ratio, the cache hit rate (the txn
service's Stats, differences over the window). Comparison points in the same run, with the same
producers: plain unary Append of one such message to the commit log; two sequential Appends (the
latency a producer would pay without the service); the txn service with batching off (one OP message
per half: --op-batch-max-bytes 1, and no merging of producers' appends: --append-max-messages 1); and
with the cache off (--cache-max-entries 0). Targets (issue 8): Prepare+Commit >= 0.4x plain Append;
half:OP >= 100:1; batched >= 2x unbatched; p50 <= 1.5x two sequential Appends.

A full run writes bench/results/txn.json and txn.md; ``--quick`` writes to bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import diskuse
from procs import BenchError, spawn, stop, stop_all, wait_for_event

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
TOKEN = "bench-token"
BODY = b"x" * 256
PRODUCERS = (1, 8, 32)
FULL = {"warmup_s": 1.0, "duration_s": 4.0}
QUICK = {"warmup_s": 0.3, "duration_s": 1.0}
VARIANTS = {"batched": [], "unbatched": ["--op-batch-max-bytes", "1", "--append-max-messages", "1"],
            "cache off": ["--cache-max-entries", "0"]}


def start(module: str, args: list[str], log_path: pathlib.Path):
    proc = spawn([sys.executable, "-m", module, "--port", "0", *args], log_path,
                 env={**os.environ, "MQSTORE_INTERNAL_TOKEN": TOKEN})
    event = wait_for_event(proc, log_path, "server.started", 60)
    return proc, f"127.0.0.1:{event['port']}"


async def closed_loop(producers: int, op, warmup_s: float, duration_s: float) -> dict:
    """``op()`` in a loop per producer; counts and latencies inside the measuring window."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    begin = time.monotonic() + warmup_s
    end = begin + duration_s

    async def producer():
        while (now := time.monotonic()) < end:
            try:
                await op()
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                continue
            done = time.monotonic()
            if now >= begin:
                latencies.append(done - now)

    await asyncio.gather(*(producer() for _ in range(producers)))
    latencies.sort()
    return {"ops_per_s": len(latencies) / duration_s, "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies
            else None, "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else None,
            "count": len(latencies), "errors": errors}


async def run_append(address: str, producers: int, sequential: int, cfg: dict) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        request = commitlog_pb2.AppendRequest(topic="bench", messages=[common_pb2.MessageInput(body=BODY)])

        async def op():
            for _ in range(sequential):
                await stub.Append(request, timeout=10)
        return await closed_loop(producers, op, cfg["warmup_s"], cfg["duration_s"])


async def run_txn(address: str, producers: int, cfg: dict) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = txn_pb2_grpc.TransactionStub(channel)
        request = txn_pb2.PrepareRequest(topic="bench", messages=[common_pb2.MessageInput(body=BODY)],
                                         producer_group="bench")

        async def op():
            prepared = await stub.Prepare(request, timeout=10)
            await stub.Commit(txn_pb2.EndRequest(transaction_id=prepared.transaction_id), timeout=10)
        while (before := await stub.Stats(txn_pb2.TxnStatsRequest(), timeout=10)).recovering:
            await asyncio.sleep(0.05)  # not measured: the service reads the log up to its end first
        result = await closed_loop(producers, op, cfg["warmup_s"], cfg["duration_s"])
        await asyncio.sleep(3.2)  # let the last OP batch (3 s interval) be written before reading the counters
        after = await stub.Stats(txn_pb2.TxnStatsRequest(), timeout=10)
    halves = after.halves_written - before.halves_written
    ops = after.op_messages_written - before.op_messages_written
    hits, misses = after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses
    appends = after.appends - before.appends
    result.update(half_to_op=halves / ops if ops else None, op_messages=ops, halves=halves,
                  cache_hit_rate=hits / (hits + misses) if hits + misses else None,
                  messages_per_append=(after.appended_messages - before.appended_messages) / appends
                  if appends else None)
    return result


def measure(cfg: dict, work: pathlib.Path) -> dict:
    log_proc, log_address = start("commitlog_service.main", ["--data-dir", str(work / "log")], work / "log.err")
    results: dict = {"append": {}, "two_appends": {}, "txn": {name: {} for name in VARIANTS}}
    try:
        with grpc.insecure_channel(log_address) as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
                commitlog_pb2.CreateTopicRequest(name="bench", queue_count=8), timeout=10)
        for n in PRODUCERS:
            results["append"][n] = asyncio.run(run_append(log_address, n, 1, cfg))
            print("append", n, results["append"][n], flush=True)
        results["two_appends"][1] = asyncio.run(run_append(log_address, 1, 2, cfg))
        for name, extra in VARIANTS.items():
            for n in PRODUCERS:
                data = work / f"txn-{name.replace(' ', '-')}-{n}"
                proc, address = start("txn_service.main", ["--data-dir", str(data), "--commitlog", log_address,
                                                           *extra], work / f"{data.name}.err")
                try:
                    results["txn"][name][n] = asyncio.run(run_txn(address, n, cfg))
                finally:
                    stop(proc)
                    diskuse.remove(data)
                print("txn", name, n, results["txn"][name][n], flush=True)
    finally:
        stop(log_proc)
    return results


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


def rows(r: dict) -> list[dict]:
    out = []
    two = r["two_appends"][1]["p50_ms"]
    for n in PRODUCERS:
        batched, plain = r["txn"]["batched"][n], r["append"][n]
        unbatched, nocache = r["txn"]["unbatched"][n], r["txn"]["cache off"][n]
        out += [
            {"workload": f"Prepare+Commit, {n} producers (txn/s)", "figure": batched["ops_per_s"],
             "comparison": "plain unary Append, same producers", "comparison_figure": plain["ops_per_s"],
             "ratio": _ratio(batched["ops_per_s"], plain["ops_per_s"]), "target": ">= 0.4"},
            {"workload": f"batched vs unbatched, {n} producers (txn/s)", "figure": batched["ops_per_s"],
             "comparison": "OP batching and append merging off", "comparison_figure": unbatched["ops_per_s"],
             "ratio": _ratio(batched["ops_per_s"], unbatched["ops_per_s"]), "target": ">= 2"},
            {"workload": f"half:OP ratio, {n} producers", "figure": batched["half_to_op"],
             "comparison": "unbatched", "comparison_figure": unbatched["half_to_op"], "ratio": None,
             "target": ">= 100"},
            {"workload": f"cache hit rate, {n} producers", "figure": batched["cache_hit_rate"],
             "comparison": "cache off (txn/s ratio)", "comparison_figure": nocache["ops_per_s"],
             "ratio": _ratio(batched["ops_per_s"], nocache["ops_per_s"]), "target": None},
            {"workload": f"Prepare+Commit p50 ms, {n} producers", "figure": batched["p50_ms"],
             "comparison": "two sequential Appends p50 (1 producer)", "comparison_figure": two,
             "ratio": _ratio(batched["p50_ms"], two), "target": "<= 1.5" if n == 1 else None},
        ]
    return out


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# Transaction service benchmark", "", f"{meta['when']} on {meta['machine']}; {meta['mode']} run, "
             f"{meta['duration_s']} s windows after {meta['warmup_s']} s warm-up. Workload and variants: bench/txn.py. "
             + diskuse.describe(meta),
             "", "| workload | figure | comparison point | comparison | ratio | target |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {_fmt(r['figure'])} | {r['comparison']} | {_fmt(r['comparison_figure'])} | "
              f"{_fmt(r['ratio'])} | {r['target'] or ''} |" for r in table]
    return "\n".join(lines + ["", *NOTES]) + "\n"


NOTES = [
    "Where the time goes (py-spy on both servers during the 8-producer run, with --gil and without; CPU time",
    "from /proc; vmstat): neither server is busy on its own (the txn server holds the GIL ~25% of the time, the",
    "commit log ~30%), the machine is: both cores ~98% busy during the run, ~30k context switches/s for ~350",
    "txn/s. A transaction is 2 RPCs from the producer to the txn service and ~1.1 (8 producers) to 2 (1",
    "producer) Appends from it to the commit log (`messages_per_append` in txn.json), each a hand-off from",
    "the sync gRPC server's polling thread to a pool thread (Condition.notify, ThreadPoolExecutor.submit and",
    "grpc `_serve` are the top self frames); it costs ~2.1 ms of CPU over the three processes against ~1 ms",
    "for a plain Append, so throughput stops growing past ~8 producers and p50 is about producers /",
    "throughput (closed loop). Removed: one Tail frame per append to the txn follower (~15% of the txn",
    "server's GIL samples; the follower now lingers 20 ms per frame) and a notify_all that woke every",
    "waiting caller of every topic at the end of each append round. Not the cause: the one-round-per-topic",
    "group commit (4 rounds in flight per topic cut the batch to 1.0 message per Append and throughput did",
    "not rise), the 64 handler threads, the OP batch (off the path). Left: the sync gRPC hand-offs (4 hops",
    "per transaction against 1 per Append) and the 1 s checkpoint (JSON, ~6% of the txn server's GIL).",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = RESULTS / "scratch" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-txn-bench-"))
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            results = measure(cfg, work)
    except BenchError as exc:
        print(f"txn bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.node()} "
            f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)",
            "mode": "quick" if args.quick else "full", **cfg, **watch.report()}
    table = rows(results)
    (out_dir / "txn.json").write_text(json.dumps({"meta": meta, "rows": table, "raw": results}, indent=1) + "\n")
    (out_dir / "txn.md").write_text(markdown(table, meta))
    print(markdown(table, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
