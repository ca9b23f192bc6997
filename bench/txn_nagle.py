"""Lone Rollback vs lone Commit (issue 37, Nagle-style OP batching): ``bench/txn_nagle.py [--quick]``.

A Rollback is answered once its OP record is durable; a Commit once its real messages are appended (its OP
entry waits, nobody waits for it). Before Nagle's rule a lone Rollback waited for the OP batch interval
(3,006 ms against a Commit's 4 ms); now an OP write goes at once when an answer waits and no OP write is in
flight (mqstore.txn.opbatch). Workload, as real processes on 127.0.0.1 (a commit log, ASYNC flush, and the
Transaction service as its own process, Cluster mode, default settings: op_batch_interval_ms 3000,
op_batch_max_bytes 4096), producers are grpc.aio in this process, unary calls:

  low load     one producer, ``trials`` pairs in turn: Prepare, Commit (timed); Prepare, Rollback (timed)
  8 producers  a closed loop for ``duration_s`` after ``warmup_s``: Prepare then Commit or Rollback, each
               producer alternating; the End calls timed by kind; half:OP over the window (mixed)
  8 producers  Prepare+Commit only (as bench/txn.py's unary mode): half:OP over the window

half:OP = halves written / OP messages written (Stats), read ``OP_WAIT_S`` after the window so the last
batch (its interval) is counted. Rounds alternate; figures are medians over the rounds' samples.
Targets: a Rollback's latency <= 2x a Commit's (medians, at low load and at 8 producers); half:OP >= 100
with Commits. A full run writes bench/results/txn_nagle.{json,md}; ``--quick`` writes to results/scratch/.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import diskuse
from procs import BenchError, run_meta, stop, stop_all, write_table
from txn import BODY, create_topic, start

from mqstore_rpc.gen.mqstore.v1 import common_pb2, txn_pb2, txn_pb2_grpc

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
FULL = {"trials": 200, "warmup_s": 1.0, "duration_s": 4.0, "rounds": 3, "producers": 8}
QUICK = {"trials": 40, "warmup_s": 0.3, "duration_s": 1.0, "rounds": 1, "producers": 8}
OP_WAIT_S = 3.2  # the last OP batch (3 s interval) is written before half:OP is read

PREPARE = txn_pb2.PrepareRequest(topic="bench", messages=[common_pb2.MessageInput(body=BODY)],
                                 producer_group="bench")


async def _stats(stub) -> txn_pb2.TxnStats:
    return await stub.Stats(txn_pb2.TxnStatsRequest(), timeout=10)


async def _end(stub, kind: str) -> float:
    """Prepare, then the End call of ``kind`` ("commit", "rollback"); the End's seconds."""
    txn_id = (await stub.Prepare(PREPARE, timeout=10)).transaction_id
    call = stub.Commit if kind == "commit" else stub.Rollback
    start_s = time.monotonic()
    await call(txn_pb2.EndRequest(transaction_id=txn_id), timeout=10)
    return time.monotonic() - start_s


async def low_load(stub, trials: int) -> dict:
    out: dict = {"commit": [], "rollback": []}
    for _ in range(trials):
        for kind in ("commit", "rollback"):
            out[kind].append(await _end(stub, kind))
    return out


async def _half_to_op(stub, first: txn_pb2.TxnStats) -> dict:
    await asyncio.sleep(OP_WAIT_S)
    last = await _stats(stub)
    halves = last.halves_written - first.halves_written
    ops = last.op_messages_written - first.op_messages_written
    return {"half_to_op": halves / ops if ops else None, "op_messages": ops,
            "by_waiter": last.op_flush_by_waiter - first.op_flush_by_waiter,
            "by_size": last.op_flush_by_size - first.op_flush_by_size,
            "by_time": last.op_flush_by_time - first.op_flush_by_time}


async def at_load(stub, producers: int, cfg: dict, kinds: tuple[str, ...]) -> dict:
    """``producers`` closed loops, each alternating through ``kinds``; End latencies by kind (inside the
    window), transactions/s and half:OP over the run."""
    first = await _stats(stub)
    begin = time.monotonic() + cfg["warmup_s"]
    end = begin + cfg["duration_s"]
    out: dict = {kind: [] for kind in kinds}
    errors: dict[str, int] = {}

    async def producer(index: int):
        turn = index
        while (now := time.monotonic()) < end:
            kind = kinds[turn % len(kinds)]
            turn += 1
            try:
                took = await _end(stub, kind)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                continue
            if now >= begin:
                out[kind].append(took)
    await asyncio.gather(*(producer(i) for i in range(producers)))
    count = sum(len(v) for v in out.values())
    return {**out, "txn_per_s": count / cfg["duration_s"], "errors": errors, **await _half_to_op(stub, first)}


async def one_round(address: str, cfg: dict) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = txn_pb2_grpc.TransactionStub(channel)
        while (await _stats(stub)).recovering:
            await asyncio.sleep(0.05)  # not measured: the service reads the log up to its end first
        return {"low": await low_load(stub, cfg["trials"]),
                "mixed": await at_load(stub, cfg["producers"], cfg, ("commit", "rollback")),
                "commits": await at_load(stub, cfg["producers"], cfg, ("commit",))}


def measure(cfg: dict, work: pathlib.Path) -> list[dict]:
    log_proc, log_address = start("commitlog_service.main", ["--data-dir", str(work / "log")], work / "log.err")
    rounds = []
    try:
        create_topic(log_address)
        for round_ in range(cfg["rounds"]):
            data = work / f"txn-{round_}"
            proc, address = start("txn_service.main", ["--data-dir", str(data), "--commitlog", log_address],
                                  work / f"txn-{round_}.err")
            try:
                got = asyncio.run(one_round(address, cfg))
            finally:
                stop(proc)
                diskuse.remove(data)
            print(f"round {round_ + 1}: " + _short(got), flush=True)
            rounds.append(got)
    finally:
        stop(log_proc)
    return rounds


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(len(values) * q))] if values else None


def _short(got: dict) -> str:
    low, mixed = got["low"], got["mixed"]
    return (f"low load p50 commit {_pct(low['commit'], 0.5):.2f} ms, rollback {_pct(low['rollback'], 0.5):.2f} ms; "
            f"8 producers p50 commit {_pct(mixed['commit'], 0.5) or 0:.2f} ms, rollback "
            f"{_pct(mixed['rollback'], 0.5) or 0:.2f} ms, half:OP mixed {mixed['half_to_op']}, "
            f"commits {got['commits']['half_to_op']} ({got['commits']['txn_per_s']:,.0f} txn/s)")


def rows(rounds: list[dict], producers: int) -> list[dict]:
    def pooled(part: str, kind: str) -> list[float]:
        return [v for r in rounds for v in r[part][kind]]

    out = []
    for part, label in (("low", "low load (one producer, in turn)"), ("mixed", f"{producers} producers")):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            rb, cm = _pct(pooled(part, "rollback"), q), _pct(pooled(part, "commit"), q)
            out.append({"workload": f"Rollback {name} ms, {label}", "figure": rb,
                        "comparison": f"Commit {name} ms, same run", "comparison_figure": cm,
                        "ratio": round(rb / cm, 3) if rb and cm else None,
                        "target": "<= 2" if q == 0.5 else None})
    for part, label in (("commits", "Prepare+Commit"), ("mixed", "half Commit, half Rollback")):
        figures = [r[part]["half_to_op"] for r in rounds if r[part]["half_to_op"] is not None]
        flushes = {k: sum(r[part][k] for r in rounds) for k in ("by_size", "by_time", "by_waiter")}
        out.append({"workload": f"half:OP, {producers} producers, {label}",
                    "figure": statistics.median(figures) if figures else None,
                    "comparison": "OP messages by size / time / waiter",
                    "comparison_figure": "/".join(str(flushes[k]) for k in ("by_size", "by_time", "by_waiter")),
                    "ratio": None, "target": ">= 100" if part == "commits" else None})
        out.append({"workload": f"transactions/s, {producers} producers, {label}",
                    "figure": statistics.median(r[part]["txn_per_s"] for r in rounds), "comparison": "",
                    "comparison_figure": None, "ratio": None, "target": None})
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


NOTES = ["A Rollback's End waits for its OP record (one OP write, at once: Nagle's rule), a Commit's for its real",
         "message's Append; both are one write to the commit log. Under load a Rollback's OP write may wait for",
         "the one in flight, and then carries every entry gathered meanwhile. With Commits only nobody waits for",
         "an OP entry: OP messages fill to op_batch_max_bytes or go at the interval, as before. With half the",
         "transactions rolled back the OP messages are as many as the writes the waiting Rollbacks cause: the",
         "half:OP of that row is the price of answering each Rollback once it is durable."]


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# Lone Rollback vs lone Commit, and half:OP (Nagle-style OP batching)", "",
             f"{meta['when']} on {meta['machine']}; {meta['mode']} run of {meta['git']}, {meta['rounds']} round(s): "
             f"{meta['trials']} low-load pairs, {meta['duration_s']} s windows at {meta['producers']} producers. "
             f"Workload: bench/txn_nagle.py. " + diskuse.describe(meta), "",
             "| workload | figure | comparison point | comparison | ratio | target |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {_fmt(r['figure'])} | {r['comparison']} | {_fmt(r['comparison_figure'])} | "
              f"{_fmt(r['ratio'])} | {r['target'] or ''} |" for r in table]
    return "\n".join(lines + ["", *NOTES]) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    out_dir = RESULTS / "scratch" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-txn-nagle-"))
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            rounds = measure(cfg, work)
    except BenchError as exc:
        print(f"txn_nagle bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta("quick" if args.quick else "full", **cfg, **watch.report())
    raw = [{part: {k: (v if not isinstance(v, list) else [round(1000 * x, 3) for x in v]) for k, v in r[part].items()}
            for part in r} for r in rounds]
    write_table(out_dir, "txn_nagle", meta, rows(rounds, cfg["producers"]), raw, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
