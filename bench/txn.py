"""Transaction service benchmark (run by ``make bench`` after the commit log's): ``bench/txn.py [--quick]``.

Workload, all as real processes on 127.0.0.1 (a commit log, ASYNC flush, and a txn service): N producers
(1, 8, 32; closed loop, grpc.aio in this process) each run Prepare (one 256-byte message) then Commit of
the returned id, as fast as they can, for ``duration_s`` after ``warmup_s``. How a producer makes its
two calls is the mode (MODES): "unary", two unary calls; "stream", two frames of the producer's own
Transact stream, each answered; "one-way", the same with the Commit frame one-way (not answered: the
producer's next Prepare is answered once the service has handled it, frames being handled in order; a
failed one-way commit would count in Stats one_way_failures); "carried", the one-way Commit carried by
the producer's next Prepare frame (txn.proto, carried ends): one frame each way. Measured:
transactions/s, p50/p99 of Prepare+Commit, CPU time per transaction of each process (this client, the
txn service, the commit log: /proc, over the window; steadier than rates on a shared machine), the
half:OP message ratio, the cache hit rate and the messages per Append to the commit log (the txn
service's Stats, differences over the window). Comparison points in the same run, with the same
producers: plain unary Append of one such message to the commit log; two sequential Appends (the latency
a producer would pay without the service); the txn service with batching off (one OP message per half:
--op-batch-max-bytes 1, and no merging of producers' appends: --append-max-messages 1); and with the
cache off (--cache-max-entries 0). Targets (issue 20): Prepare+Commit >= 0.5x plain Append at 8 and 32
producers; batched >= 2x unbatched; p50 at 1 producer <= 1.5x two sequential Appends; half:OP >= 100:1.

Rounds: every figure is measured ``rounds`` times, alternating: for each producer count and round, each
variant's block is a plain Append window followed by that variant's windows (one txn service started
for the block), so that the noise of the moment falls on a transaction and its comparison point alike.
A ratio is taken within its block, and the table gives the median over the rounds with the spread
(lowest-highest) of the per-round ratios; figures are medians too. One round's ratio moved by more
than 10% between runs on this shared machine.

Hosts (``--hosts cluster,local``, default both): "cluster" is the Transaction service as its own process
(txn_service) on the shared commit log; "local" is the Transaction service in the commit log's process
(mqstore-commitlog --txn-port, README *Transaction service: Cluster mode and Local mode*): each local block
starts its own commit log with the service (the variant's flags as --txn-<flag>), runs the plain Append
window against that commit log, then the txn windows against its --txn-port; the CPU per transaction is
then the client's and that one process's.

A full run writes bench/results/txn.json and txn.md; ``--quick`` writes to bench/results/scratch/.
``--producers 8 --modes unary --variants batched`` measures a part (also to scratch/).
"""

from __future__ import annotations

import argparse
import asyncio
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
from procs import BenchError, cpu_seconds, run_meta, spawn, stop, stop_all, wait_for_event, write_table

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
TOKEN = "bench-token"
BODY = b"x" * 256
PRODUCERS = (1, 8, 32)
FULL = {"warmup_s": 1.0, "duration_s": 4.0, "rounds": 3}
QUICK = {"warmup_s": 0.3, "duration_s": 1.0, "rounds": 1}
VARIANTS = {"batched": [], "unbatched": ["--op-batch-max-bytes", "1", "--append-max-messages", "1"],
            "cache off": ["--cache-max-entries", "0"]}
HOSTS = ("cluster", "local")
OP_WAIT_S = 3.2  # the last OP batch (3 s interval) is written before the half:OP counters are read


# ---- how a producer runs one transaction ----------------------------------------------------------------

def _prepare_request() -> txn_pb2.PrepareRequest:
    return txn_pb2.PrepareRequest(topic="bench", messages=[common_pb2.MessageInput(body=BODY)],
                                  producer_group="bench")


def unary_producer(stub: txn_pb2_grpc.TransactionStub):
    """Prepare and Commit as two unary calls."""
    request = _prepare_request()

    async def transaction():
        prepared = await stub.Prepare(request, timeout=10)
        await stub.Commit(txn_pb2.EndRequest(transaction_id=prepared.transaction_id), timeout=10)
    return transaction, None


def stream_producer(stub: txn_pb2_grpc.TransactionStub, commit: str = "two-way"):
    """Prepare and Commit as frames of the producer's own Transact stream. ``commit``: "two-way", an answered
    Commit frame; "one-way", a Commit frame not answered (the transaction counts once it is sent);
    "carried", the Commit carried by the producer's next Prepare frame (txn.proto Transact, carried ends:
    one frame each way per transaction). A producer with no next Prepare would send the end alone after
    its linger; in this closed loop the next Prepare follows at once, so a carried transaction counts when
    its Commit is handed to the stream, as a one-way one does; ``close`` sends the last end alone."""
    call = stub.Transact()
    prepare = txn_pb2.TransactRequest(prepare=_prepare_request())
    ids = iter(range(1, 1 << 62))

    async def answered(what: str) -> txn_pb2.TransactResponse:
        answer = await call.read()
        if answer.HasField("error"):
            raise BenchError(f"{what} frame failed: {answer.error}")
        return answer

    async def transaction():
        prepare.request_id = next(ids)
        await call.write(prepare)
        del prepare.ends[:]
        txn_id = (await answered("Prepare")).prepared.transaction_id
        if commit == "carried":
            prepare.ends.add(transaction_id=txn_id, decision=txn_pb2.DECISION_COMMIT)
            return
        await call.write(txn_pb2.TransactRequest(request_id=next(ids), one_way=commit == "one-way",
                                                 commit=txn_pb2.EndRequest(transaction_id=txn_id)))
        if commit == "two-way":
            await answered("Commit")

    async def close():
        if prepare.ends:  # a frame of ends only: never answered
            await call.write(txn_pb2.TransactRequest(request_id=next(ids), ends=prepare.ends))
        await call.done_writing()
        while (answer := await call.read()) is not grpc.aio.EOF:  # the answers still on their way
            if answer.HasField("error"):
                raise BenchError(f"a frame failed: {answer.error}")
    return transaction, close


MODES = {"unary": unary_producer, "stream": stream_producer,
         "one-way": lambda stub: stream_producer(stub, "one-way"),
         "carried": lambda stub: stream_producer(stub, "carried")}
DEFAULT_MODE = "unary"  # the mode of the unbatched and cache-off comparison windows


# ---- measuring ------------------------------------------------------------------------------------------

def start(module: str, args: list[str], log_path: pathlib.Path):
    proc = spawn([sys.executable, "-m", module, "--port", "0", *args], log_path,
                 env={**os.environ, "MQSTORE_INTERNAL_TOKEN": TOKEN})
    event = wait_for_event(proc, log_path, "server.started", 60)
    return proc, f"127.0.0.1:{event['port']}"


def start_local(data: pathlib.Path, variant_flags: list[str], log_path: pathlib.Path):
    """A commit log serving the Transaction service itself (Local mode), with the bench topic: the process,
    the commit log's address and the Transaction port's."""
    txn_flags = [f"--txn-{flag[2:]}" if flag.startswith("--") else flag for flag in variant_flags]
    proc, address = start("mqstore_launcher.node", ["--data-dir", str(data), "--txn-port", "0", *txn_flags],
                          log_path)
    # server.started names its pid (the log file is an earlier round's too); ports: the second ports by name
    txn_port = wait_for_event(proc, log_path, "server.started", 10)["ports"]["txn"]
    create_topic(address)
    return proc, address, f"127.0.0.1:{txn_port}"


def create_topic(log_address: str) -> None:
    with grpc.insecure_channel(log_address) as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
            commitlog_pb2.CreateTopicRequest(name="bench", queue_count=8), timeout=10)


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def closed_loop(producers: list, warmup_s: float, duration_s: float, pids: dict[str, int]) -> dict:
    """Each producer's ``op()`` in a loop; counts and latencies inside the measuring window, and the CPU
    seconds per operation of this process ("client") and of each process in ``pids`` over it."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    begin = time.monotonic() + warmup_s
    end = begin + duration_s
    cpu: dict[str, list[float]] = {}

    async def sample_cpu():
        for moment in (begin, end):
            await asyncio.sleep(max(0.0, moment - time.monotonic()))
            for name, value in [("client", _self_cpu_s())] + [(n, cpu_seconds(p)) for n, p in pids.items()]:
                cpu.setdefault(name, []).append(value)

    async def producer(op):
        while (now := time.monotonic()) < end:
            try:
                await op()
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                continue
            done = time.monotonic()
            if now >= begin:
                latencies.append(done - now)

    await asyncio.gather(sample_cpu(), *(producer(op) for op in producers))
    latencies.sort()
    count = len(latencies)
    return {"ops_per_s": count / duration_s, "p50_ms": 1000 * latencies[count // 2] if count else None,
            "p99_ms": 1000 * latencies[int(count * 0.99)] if count else None, "count": count, "errors": errors,
            "cpu_ms_per_op": {name: round(1000 * (v[1] - v[0]) / count, 4) if count else None
                              for name, v in cpu.items()}}


async def run_append(address: str, producers: int, sequential: int, cfg: dict, pids: dict[str, int]) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        request = commitlog_pb2.AppendRequest(topic="bench", messages=[common_pb2.MessageInput(body=BODY)])

        async def op():
            for _ in range(sequential):
                await stub.Append(request, timeout=10)
        return await closed_loop([op] * producers, cfg["warmup_s"], cfg["duration_s"], pids)


async def _stats(stub) -> txn_pb2.TxnStats:
    return await stub.Stats(txn_pb2.TxnStatsRequest(), timeout=10)


async def run_txn_block(address: str, producers: int, modes: list[str], cfg: dict, pids: dict[str, int],
                        op_wait: bool) -> dict:
    """Each mode's window on one txn service; then (``op_wait``) the half:OP ratio over the whole block."""
    out: dict = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = txn_pb2_grpc.TransactionStub(channel)
        while (first := await _stats(stub)).recovering:
            await asyncio.sleep(0.05)  # not measured: the service reads the log up to its end first
        for mode in modes:
            made = [MODES[mode](stub) for _ in range(producers)]
            before = await _stats(stub)
            result = await closed_loop([op for op, _ in made], cfg["warmup_s"], cfg["duration_s"], pids)
            after = await _stats(stub)
            for _, close in made:
                if close is not None:
                    await close()
            hits, misses = after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses
            appends = after.appends - before.appends
            result.update(cache_hit_rate=hits / (hits + misses) if hits + misses else None,
                          messages_per_append=(after.appended_messages - before.appended_messages) / appends
                          if appends else None)
            out[mode] = result
        if op_wait:
            await asyncio.sleep(OP_WAIT_S)
            last = await _stats(stub)
            halves = last.halves_written - first.halves_written
            ops = last.op_messages_written - first.op_messages_written
            out["half_to_op"] = halves / ops if ops else None
    return out


def plan(modes: list[str], variants: list[str]) -> list[tuple[str, list[str]]]:
    """(variant, the modes measured on it): every mode batched; the comparison variants in each mode
    whose 'batched vs unbatched' row is shown (all), cache off in the default mode only."""
    out = []
    for variant in variants:
        on = modes if variant != "cache off" else [m for m in modes if m == DEFAULT_MODE] or modes[:1]
        out.append((variant, on))
    return out


def block_key(host: str, variant: str, n: int) -> str:
    return f"{variant}|{n}" if host == "cluster" else f"{host}|{variant}|{n}"


def measure(cfg: dict, work: pathlib.Path, producer_counts: list[int], modes: list[str],
            variants: list[str], hosts: list[str]) -> dict:
    log_proc, log_address = start("commitlog_service.main", ["--data-dir", str(work / "log")], work / "log.err")
    rounds: list[dict] = []
    try:
        create_topic(log_address)
        for round_ in range(cfg["rounds"]):
            got: dict = {"two_appends": {}, "blocks": {}}
            for n in producer_counts:
                if n == 1:
                    got["two_appends"][1] = asyncio.run(run_append(log_address, 1, 2, cfg, {"log": log_proc.pid}))
                    print(f"round {round_ + 1}: two appends 1", _short(got["two_appends"][1]), flush=True)
                for variant, on in plan(modes, variants):
                    for host in hosts:
                        key = block_key(host, variant, n)
                        data = work / f"txn-{key.replace(' ', '-').replace('|', '-')}"
                        if host == "cluster":
                            block = cluster_block(cfg, work, data, variant, n, on, log_proc, log_address,
                                                  op_wait=round_ == 0)
                        else:
                            block = local_block(cfg, work, data, variant, n, on, op_wait=round_ == 0)
                        got["blocks"][key] = block
                        print(f"round {round_ + 1}: {host} append {n}", _short(block["append"]), flush=True)
                        for mode in on:
                            print(f"round {round_ + 1}: {host} txn {variant} {mode} {n}", _short(block[mode]),
                                  f"half:OP={block.get('half_to_op')}", flush=True)
            rounds.append(got)
    finally:
        stop(log_proc)
    return {"rounds": rounds}


def cluster_block(cfg: dict, work: pathlib.Path, data: pathlib.Path, variant: str, n: int, on: list[str], log_proc,
                  log_address: str, op_wait: bool) -> dict:
    """The plain Append window on the shared commit log, then a txn service process's windows."""
    append = asyncio.run(run_append(log_address, n, 1, cfg, {"log": log_proc.pid}))
    proc, address = start("txn_service.main", ["--data-dir", str(data), "--commitlog", log_address,
                                               *VARIANTS[variant]], work / f"{data.name}.err")
    try:
        block = asyncio.run(run_txn_block(address, n, on, cfg, {"txn": proc.pid, "log": log_proc.pid},
                                          op_wait=op_wait))
    finally:
        stop(proc)
        diskuse.remove(data)
    block["append"] = append
    return block


def local_block(cfg: dict, work: pathlib.Path, data: pathlib.Path, variant: str, n: int, on: list[str],
                op_wait: bool) -> dict:
    """A commit log with the Transaction service in its process: the plain Append window on it, then the
    txn windows on its Transaction port."""
    proc, log_address, txn_address = start_local(data, VARIANTS[variant], work / f"{data.name}.err")
    try:
        append = asyncio.run(run_append(log_address, n, 1, cfg, {"log": proc.pid}))
        block = asyncio.run(run_txn_block(txn_address, n, on, cfg, {"log": proc.pid}, op_wait=op_wait))
    finally:
        stop(proc)
        diskuse.remove(data)
    block["append"] = append
    return block


def _short(r: dict) -> str:
    cpu = " ".join(f"{k}={v:.3f}" for k, v in r["cpu_ms_per_op"].items() if v is not None)
    extra = f" msgs/append={r['messages_per_append']:.2f}" if r.get("messages_per_append") else ""
    return (f"ops/s={r['ops_per_s']:,.0f} p50={r['p50_ms'] or 0:.2f}ms cpu_ms/op: {cpu}{extra} "
            f"errors={r['errors'] or '-'}")


# ---- the table ------------------------------------------------------------------------------------------

def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio_row(workload: str, comparison: str, pairs: list[tuple], target: str | None) -> dict:
    """A row from (figure, comparison figure[, ratio]) of each round: medians, and the median and spread
    of the per-round ratios (figure / comparison unless given: two blocks' figures are compared through
    their own blocks' plain Append)."""
    ratios = [p[2] if len(p) > 2 else p[0] / p[1] for p in pairs if p[0] and p[1]]
    return {"workload": workload, "figure": _median([p[0] for p in pairs]), "comparison": comparison,
            "comparison_figure": _median([p[1] for p in pairs]),
            "ratio": round(statistics.median(ratios), 3) if ratios else None,
            "spread": [round(min(ratios), 3), round(max(ratios), 3)] if len(ratios) > 1 else None, "target": target}


def _cpu(r: dict) -> float | None:
    values = r["cpu_ms_per_op"].values()
    return None if None in values else sum(values)


def rows(results: dict, producer_counts: list[int], modes: list[str], variants: list[str],
         hosts: list[str] = ("cluster",)) -> list[dict]:
    out = []
    for host in hosts:
        out += host_rows(results, producer_counts, modes, variants, host)
    return out


def host_rows(results: dict, producer_counts: list[int], modes: list[str], variants: list[str],
              host: str) -> list[dict]:
    rounds = results["rounds"]
    out = []
    where = "" if host == "cluster" else f"{host}, "
    for n in producer_counts:
        blocks = [r["blocks"] for r in rounds]
        for mode in modes:
            label = f"{where}{mode}, {n} producers"
            batched = [b[block_key(host, "batched", n)] for b in blocks]
            at = {"host": host, "mode": mode, "producers": n}
            out.append(_ratio_row(f"Prepare+Commit ({label}) txn/s", "plain unary Append, same producers",
                                  [(b[mode]["ops_per_s"], b["append"]["ops_per_s"]) for b in batched],
                                  ">= 0.5" if n in (8, 32) else None) | at | {"kind": "rate"})
            out.append(_ratio_row(f"CPU ms per txn, all processes ({label})", "per plain Append (client + log)",
                                  [(_cpu(b[mode]), _cpu(b["append"])) for b in batched], None))
            if "unbatched" in variants:
                unbatched = [b[block_key(host, "unbatched", n)] for b in blocks]
                out.append(_ratio_row(f"batched vs unbatched ({label}) txn/s", "OP batching and append merging off",
                                      [(b[mode]["ops_per_s"], u[mode]["ops_per_s"],
                                        (b[mode]["ops_per_s"] / b["append"]["ops_per_s"])
                                        / (u[mode]["ops_per_s"] / u["append"]["ops_per_s"]))
                                       for b, u in zip(batched, unbatched, strict=True)], ">= 2")
                           | at | {"kind": "batched"})
            out.append(_ratio_row(f"Prepare+Commit p50 ms ({label})", "two sequential Appends p50 (1 producer)",
                                  [(b[mode]["p50_ms"], r["two_appends"].get(1, {}).get("p50_ms"))
                                   for b, r in zip(batched, rounds, strict=True)], "<= 1.5" if n == 1 else None)
                       | at | {"kind": "p50"})
            out.append({"workload": f"messages per Append to the commit log ({label})",
                        "figure": _median([b[mode]["messages_per_append"] for b in batched]),
                        "comparison": "", "comparison_figure": None, "ratio": None, "spread": None, "target": None})
        batched = [b[block_key(host, "batched", n)] for b in blocks]
        half_op = [b["half_to_op"] for b in batched if b.get("half_to_op") is not None]
        unbatched = block_key(host, "unbatched", n)
        unbatched_op = [b[unbatched].get("half_to_op") for b in blocks if unbatched in b]
        out.append({"workload": f"half:OP ratio, {where}{n} producers", "figure": _median(half_op),
                    "comparison": "unbatched",
                    "comparison_figure": _median(unbatched_op), "ratio": None, "spread": None, "target": ">= 100"})
        if "cache off" in variants:
            mode = next(m for v, on in plan(modes, variants) if v == "cache off" for m in on)
            off = [b[block_key(host, "cache off", n)] for b in blocks]
            out.append(_ratio_row(f"cache on vs off ({where}{mode}, {n} producers) txn/s",
                                  f"cache off; hit rate {_median([b[mode]['cache_hit_rate'] for b in batched])}",
                                  [(b[mode]["ops_per_s"], o[mode]["ops_per_s"],
                                    (b[mode]["ops_per_s"] / b["append"]["ops_per_s"])
                                    / (o[mode]["ops_per_s"] / o["append"]["ops_per_s"]))
                                   for b, o in zip(batched, off, strict=True)], None))
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "-".join(_fmt(x) for x in v)
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


SUMMARY = (("rate", 8, ">= 0.5", "Prepare+Commit / plain Append, 8 producers (>= 0.5)"),
           ("rate", 32, ">= 0.5", "the same, 32 producers (>= 0.5)"),
           ("batched", 8, ">= 2", "batched / unbatched, 8 producers (>= 2)"),
           ("batched", 32, ">= 2", "the same, 32 producers (>= 2)"),
           ("p50", 1, "<= 1.5", "p50 / two sequential Appends, 1 producer (<= 1.5)"))


def _met(ratio: float | None, target: str) -> str:
    if ratio is None:
        return "-"
    op, bound = target.split()
    ok = ratio >= float(bound) if op == ">=" else ratio <= float(bound)
    return f"{ratio:.2f} " + ("met" if ok else "**missed**")


def summary(table: list[dict]) -> list[str]:
    """The issue's targets per place and mode, one row each: which modes meet which target."""
    by = {(r["host"], r["mode"], r["kind"], r["producers"]): r for r in table if "kind" in r}
    places = list(dict.fromkeys((r["host"], r["mode"]) for r in table if "kind" in r))
    if not places:
        return []
    lines = ["## Targets by mode", "", "| host, mode | " + " | ".join(t[3] for t in SUMMARY) + " |",
             "|---|" + "---|" * len(SUMMARY)]
    for host, mode in places:
        cells = [_met(by[host, mode, kind, n]["ratio"], target) if (host, mode, kind, n) in by else "-"
                 for kind, n, target, _ in SUMMARY]
        lines.append(f"| {host}, {mode} | " + " | ".join(cells) + " |")
    return lines + ["", "## Every figure", ""]


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# Transaction service benchmark", "",
             f"{meta['when']} on {meta['machine']}; {meta['mode']} run of {meta['git']}, {meta['rounds']} "
             f"alternating round(s) of {meta['duration_s']} s windows after {meta['warmup_s']} s warm-up. Workload, "
             f"modes and variants: bench/txn.py. Ratios are medians of the per-round ratios (spread: lowest-"
             f"highest). " + diskuse.describe(meta),
             "", *summary(table), "| workload | figure | comparison point | comparison | ratio | spread | target |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {_fmt(r['figure'])} | {r['comparison']} | {_fmt(r['comparison_figure'])} | "
              f"{_fmt(r['ratio'])} | {_fmt(r['spread'])} | {r['target'] or ''} |" for r in table]
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
    "",
    "The Transact stream (modes stream and one-way; 2026-11-25, load average 20-28 on 2 cores, so rates",
    "moved by 2x between rounds and CPU time per transaction is the steadier figure): one stream per producer",
    "removes the per-call hand-off. CPU over the three processes per transaction, 32 producers: stream 2.4 ms,",
    "one-way 2.3, unary 3.3 (a plain Append 0.8); 8 producers: 4.6, 3.9, 6.0 (1.0); the txn service's own",
    "share falls from 1.9-3.0 ms to 1.4 at 32 producers, and the frames reaching the appender together raise",
    "the messages per Append to the commit log from 3.8 to 6.3. Still short of 0.5x: py-spy on the txn",
    "service (32 stream producers, 15 s) finds its handler threads mostly waiting, about a third of their",
    "samples in AppendBatcher._await_turn (one round in flight per topic: the halves' topic, then the real",
    "topic, each round one CommitLogInternal.Append) and a third in gRPC receiving and sending frames; the",
    "coordinator's own work is small. So a transaction waits for two group-commit rounds in sequence, and the",
    "rate is rounds per second x messages per round, set by the commit log's round trip on a loaded machine.",
    "One-way frames are now applied by workers (txn-one-way) while the stream takes the next frame, so the",
    "next Prepare's halves share a round with earlier Commits' real messages. Run of 226645f (load average",
    "28-37): 8 producers one-way 0.27x plain Append (stream 0.22, unary 0.19), CPU per transaction 2.8 ms",
    "(3.4, 4.4; plain Append 0.9), 3.1 messages per Append (2.1, 1.8); 32 producers stream 0.33x (unary",
    "0.22), one-way 0.18x with a spread of 0.16-0.36 while its CPU per transaction is the lowest (2.0 ms",
    "against 2.1 and 3.3; plain Append 0.6): under that load the rates of one round moved 2x. Next: let a",
    "producer keep several transactions in flight on its stream (answers by request_id), so a stream is not",
    "one closed loop; write a batch's COMMIT records and OP record in one Append (issue item d); let the",
    "appender keep a second round in flight per topic once the first is large (the 4-rounds experiment",
    "above split small batches).",
    "",
    "Where the rest goes (2026-11-26, quiet machine, one-way mode, 8 producers: 3.1 ms of CPU per transaction",
    "over the three processes against 1.0 ms per plain Append; client 0.47, txn service 1.8, commit log 0.8):",
    "bench/txn_floor.py serves the same frames from a no-op Transaction server on the service skeleton: 0.34 ms",
    "of server CPU per Prepare frame + one-way Commit frame, the same as one no-op Append (0.335), so the",
    "frames are not the limit; the coordinator's own Python work is ~0.14 ms per transaction (in process, fake",
    "appender); garbage collection is negligible (0.13 s of 5.8 s CPU, gc.callbacks). Per-thread CPU of the",
    "txn service (/proc/PID/task): the stream handler threads 46%, the one-way workers 23%, the gRPC poller",
    "10%, grpc's event engine 12%, the follower 4%. What remains is the second process: two CommitLogInternal",
    "Appends per transaction (batched ~3 messages each), the Tail stream back to the follower, and a thread",
    "hand-off around each. Next: the Transaction service in the commit log's own process (Local mode, as",
    "the gateway has and as RocketMQ's broker writes half and OP messages itself).",
    "",
    "Local mode (--hosts local: the Transaction service in the commit log process, mqstore-commitlog --txn-port;",
    "2026-11-26, run of 84f5f52 with --producers 8,32 --modes one-way,stream --variants batched --rounds 3",
    "--hosts cluster,local, load average ~8): 8 producers one-way 0.47x plain Append (rounds 0.47-0.51), stream",
    "0.47x (0.47-0.52); 32 producers one-way 0.53x (0.45-0.63), stream 0.52x (0.30-0.55). CPU per transaction",
    "over the client and the one process 2.3 ms at 8 producers, 1.8-1.9 at 32 (plain Append 1.1-1.2); Cluster",
    "mode in the same run 0.35x / 0.26x (8) and 0.42x / 0.33x (32) at 3.6-4.4 and 2.6-3.2 ms. The appender",
    "merges nothing in Local mode (1.0 message per store append: an append takes no round trip, so callers",
    "rarely meet), so the rate is the store's appends per second shared by halves, COMMIT records and the",
    "plain Appends of the comparison; the gRPC frames of the producers are most of what is left.",
    "",
    "With the CommitLog's handler pool capped at 4 running calls (2026-11-28, a faster and quiet machine, run",
    "of 065580c, --modes one-way --variants batched,unbatched --producers 8,32 --rounds 3): the plain Append",
    "of the comparison costs 0.25-0.29 ms of CPU (client + log) and runs at 5,700-7,200/s, so the ratios",
    "fall although a transaction got cheaper too: Cluster 0.25x (8 producers) and 0.26x (32) at 0.98 and",
    "0.88 ms per transaction (client 0.14, txn service 0.59, commit log 0.17-0.25); Local 0.34x and 0.30x at",
    "0.65 and 0.74 ms (client 0.15, the one process 0.47-0.56). Batched vs unbatched: Cluster 2.06x and",
    "2.47x (met), Local 1.06x and 1.11x (an in-process append costs little unbatched too). The Transaction",
    "service with the same cap (its waits say so) measured the same: 0.59 ms per transaction in Cluster",
    "mode, Local 0.39x and 0.31x. In process (no gRPC, Local mode's coordinator on a store, 3,000",
    "transactions) a Prepare + Commit costs 132 us of CPU against 16 us for one store append: the rest of",
    "the 0.47-0.59 ms is the Transaction port's gRPC frames and the threads around them, as for Append.",
    "",
    "Four changes, each measured in alternating runs against the code before it (2026-11-28, quiet machine,",
    "Local mode; bench/txn.py's own functions driving one commit log with --txn-port): (1) transaction and",
    "attempt ids from keyed BLAKE2b over a counter instead of uuid4, whose os.urandom lets go of the GIL and",
    "waited ~16 us for it each time (in process a Prepare + Commit went from 162 to 140 us); (2) carried ends",
    "(mode \"carried\": the Commit rides on the next Prepare, one frame each way; a frame of the sync gRPC",
    "server costs ~75 us of server CPU): +18% at 8 producers; (3) Local mode appends on each caller's thread",
    "(DirectAppender): +8-25% (8 producers) and +14% (32); (4) the Local Transaction port under the commit",
    "log's cap, a stream's every frame waiting for a place (mqstore_rpc.executor): +10-30% at 32 producers,",
    "nothing at 8. Run of 454f1c7 (--modes one-way,carried --variants batched,unbatched --producers 1,8,32",
    "--rounds 3, both hosts): Local carried 0.49x plain Append at 8 producers (0.48-0.49) and 0.45x at 32",
    "(0.42-0.51), at 0.48 and 0.54 ms of CPU per transaction (a plain Append 0.29); Local one-way 0.40x and",
    "0.36x; Cluster carried 0.26x and 0.25x (0.97 ms: the txn service 0.5-0.6 ms, its CommitLogClient calls",
    "and Tail included), one-way 0.24x. p50 at 1 producer: Local 0.42x two sequential Appends (carried),",
    "Cluster 1.43x (carried, met) and 1.56x (one-way). Batched vs unbatched: Cluster 2.2x (met), Local",
    "1.1-1.2x. What is left in Local mode at 8 producers, per transaction (threads' CPU from /proc/PID/task):",
    "handler threads ~310 us (of which ~140 the servicer, coordinator and two store appends, the rest gRPC",
    "frame handling and the GIL hand-offs between threads), the gRPC poller and core ~50, the txn follower",
    "~18 and the checkpointer ~14. The no-op Transact floor (bench/txn_floor.py, 8 producers) is 0.18 ms of",
    "server CPU on the sync server and 0.084 ms on grpc.aio: an aio Transaction port (each frame handled on",
    "the loop while the store's append does not wait) is what would bring Local mode past 0.5x at 32",
    "producers, and Cluster mode needs its txn service's CommitLogClient calls and Tail off the sync path too.",
    "",
    "The Local Transaction port on grpc.aio (2026-11-29, mqstore_rpc.aio; bench/README.md *Transactions on the",
    "event loop*): Prepare, Commit and each Transact frame answered on the port's event loop while the store's",
    "appends do not wait, the rest in its handler pool. Run with --hosts local --modes unary,stream,one-way,",
    "carried --variants batched,unbatched --producers 1,8,32 --rounds 3, quiet machine: carried 0.78x plain",
    "Append at 8 producers (0.76-0.83) and 0.79x at 32 (0.69-1.11), 0.35 ms of CPU per transaction (a plain",
    "Append 0.29-0.30); one-way 0.66x and 0.69x; two-way frames (stream) 0.57x and 0.54x; two unary calls",
    "0.37x and 0.32x (each call pays its own frames). p50 at 1 producer: carried 0.43x two sequential",
    "Appends, unary 1.30x. Batched vs unbatched in Local mode 1.1-1.3x (an in-process append costs little",
    "unbatched too). Cluster mode is unchanged: its frames need the CommitLogClient's answers, so they would",
    "go to the pool and back; the txn service's appends and Tail on grpc.aio's client are what is next there.",
    "Measured: txn_service on grpc.aio with every frame in its pool (--modes stream,carried --producers 8,32",
    "--rounds 2, alternating with the sync server): carried 1,433 against 1,490 txn/s (8) and 1,398 against",
    "1,591 (32), stream 924 against 959 and 1,510 against 1,376: no gain, not kept. A second run of the",
    "Local figures at 2e45a3c (the checkpointer's full records no longer walk the table): carried 0.86x (8",
    "producers) and 0.65x (32: the plain Append of this run 6,665/s against 5,787), one-way 0.72x and 0.56x,",
    "stream 0.61x and 0.47x, unary 0.39x and 0.29x; a transaction's rate the same in both runs.",
    "",
    "Cluster mode on grpc.aio (2026-11-29, d0bbe65): the frames are handled on the txn service's event loop and",
    "their appends awaited there, through a group commit of the loop's own (LoopAppendBatcher) over the",
    "CommitLog client's grpc.aio Append: no thread hand-off on a transaction's path; a stream's carried and",
    "one-way ends are started at once, overlapping the next Prepare's append, and waited for before its answer.",
    "A prototype first (no table: frames -> batched aio Appends to a real commit log): 0.52-0.54x plain Append",
    "at 8 producers and 1.13-1.27x at 32 with the ends overlapped, 0.40-0.53x and 0.99-1.02x without. Two",
    "runs of --hosts cluster --modes unary,stream,one-way,carried --producers 1,8,32 --rounds 3 (the second",
    "with --variants batched,unbatched), quiet machine: carried 0.36x / 0.42x at 8 producers (rounds",
    "0.32-0.61) and 0.60x / 0.55x at 32 (0.52-0.77), was 0.26x and 0.25x; one-way 0.34x / 0.38x and 0.56x /",
    "0.52x; two-way frames 0.24x / 0.28x and 0.43x / 0.46x; two unary calls 0.17x / 0.20x and 0.23x / 0.22x.",
    "CPU per carried transaction over the three processes 0.71 ms at 8 producers (0.38 at 32), a plain",
    "Append 0.28. p50 at 1 producer: carried 1.46-1.51x two sequential Appends, one-way 1.40-1.45x (target",
    "1.5), unary 2.75-2.81x. Batched vs unbatched (Cluster): carried 3.2x (8) and 4.7x (32), one-way 2.7x",
    "and 4.6x, two-way frames 2.0x and 4.5x, unary 1.75x and 2.2x. Where the rest goes at 8 producers",
    "(threads' CPU from /proc, py-spy on the loop): the txn process 0.34-0.39 ms per transaction, its loop",
    "thread ~70% of that (grpc.aio's own call and stream machinery about 60% of the loop's samples, the",
    "client Append calls a fifth; the coordinator, batcher and interceptors the rest), grpc's event-engine",
    "threads ~17%, the follower's Tail ~10%; the commit log 0.21-0.27 ms for ~0.6 Append calls per",
    "transaction (3.2 messages each). Two rounds in flight per topic instead of one: smaller rounds (2.3",
    "messages), more CPU, no gain (2,152-2,252 against 2,322-2,575 txn/s), not kept. Next for 8 producers: one",
    "internal Append carrying several topics' batches (a transaction's half and the previous one's real",
    "messages in one call), halving the calls on both sides.",
    "",
    "One call per round for every topic (2026-11-29, 70c2203): the loop batcher sends a round's batches for all",
    "topics in one CommitLogInternal.AppendBatches (each batch all or nothing with its own outcome): 7.3",
    "messages per call at 8 producers (was 3.2). Two runs, 3 rounds: carried 0.46x / 0.39x plain Append at 8",
    "producers (2,628-2,630 txn/s, was 2,322-2,575) and 0.66x / 0.57x at 32; one-way 0.42x / 0.35x and 0.63x /",
    "0.55x; two-way frames 0.29x / 0.24x and 0.50x / 0.39x; unary 0.18x and 0.26x. CPU per carried",
    "transaction 0.53-0.54 ms at 8 producers (was 0.71). p50 at 1 producer: carried 1.28x two sequential",
    "Appends, one-way 1.90x (its end and the next Prepare no longer overlap in two topics' calls), unary",
    "2.88x. Batched vs unbatched: carried 4.1x (8) and 6.0x (32). Two calls in flight: no gain (2,543 and",
    "3,758 txn/s), not kept. At 8 producers the loop is busy 57% of the time: latency bound (a frame waits",
    "for the call in flight, then its own: ~1.4 ms each at ~715 calls/s). The commit log spends ~0.5 ms of",
    "CPU per call, half of it in gRPC's sync server; that per-call cost is what is next.",
    "",
    "Over a stream (2026-11-29, be74f7a): the loop's requests go over an AppendBatchesStream kept open to the",
    "commit log (a stream message costs a sync server 66-74 us of CPU against 131-173 us per unary call).",
    "Two runs, 3 rounds: carried 0.59x / 0.62x plain Append at 8 producers (3,113-3,260 txn/s) and 0.65x /",
    "0.63x at 32; one-way 0.50x / 0.47x and 0.59x / 0.54x; two-way frames 0.37x / 0.34x and 0.51x / 0.50x;",
    "unary 0.22x and 0.27x. CPU per carried transaction 0.46-0.47 ms at 8 producers. p50 at 1 producer:",
    "carried 0.99-1.02x two sequential Appends, one-way 1.24x, two-way 1.77-1.81x, unary 2.27x. Batched",
    "vs unbatched: carried 5.0x, one-way 3.8-3.9x, two-way 2.8-3.9x, unary 2.2-2.7x.",
    "",
    "The full run of 186d966 (make bench, 2026-11-29; the table above, its summary first): carried and one-way",
    "ends meet every target in Cluster mode (carried 0.62x / 0.65x plain Append at 8 / 32 producers, p50 1.04x",
    "two sequential Appends, batched 4.5x / 5.5x unbatched, 1.6x at 1 producer, whose appends there are no",
    "others to merge with; one-way 0.56x / 0.64x, p50 1.24x) and the rate and",
    "p50 targets in Local mode (carried 0.82x / 0.72x, p50 0.46x), where batching gains 1.0-1.3x (an unbatched",
    "in-process append costs little too). Missed, where a producer waits for its Commit's answer: two-way",
    "frames in Cluster mode 0.41x at 8 producers and p50 1.72x, two unary calls 0.27x / 0.29x and p50 2.34x",
    "(Local 0.36x / 0.32x). Where the time goes at 1 producer, two-way: two sequential Appends take 0.92 ms",
    "(p50), the transaction 1.59 ms. If its two frames' round trips to the service cost what an Append's does",
    "(~0.46 ms each), the other ~0.67 ms is, behind each frame, a round trip from the service to the commit",
    "log and the coordinator's work: the hop Local mode removes (two-way p50 0.76x there). At 8 producers each",
    "producer waits for the two in sequence, so the rate is latency-bound (the carried end instead overlaps",
    "the next Prepare's append). Next for them: nothing short of that hop; a producer that needs Cluster mode",
    "and the answer pays it.",
    "",
    "Answered transactions (issue 37, 2026-12-06; bench/results/txn-answered.md): still missed in Cluster mode at",
    "8 producers, unary 0.26-0.28x plain Append and stream 0.35-0.43x in five of six sets of alternating runs on a",
    "machine busy with other work (the sixth 0.39x / 0.61x, against plain Appends costing 1.12 ms of CPU, not",
    "0.75-0.88). Taken out: the task and shield around each Prepare and Commit on the loop, and",
    "wait_for over a shield around each answer of the log's stream (asyncio callbacks per Commit on the txn",
    "service's loop 11.4 -> 6.7, tasks 1.1 -> 0.1); the rate moved within the noise. Two or four calls to the",
    "log in flight: smaller calls, more CPU, not kept. The rate ratio follows the CPU ratio (0.43 stream, 0.27",
    "unary): per stream transaction 1.74-1.96 ms of CPU over the three processes against 0.75-0.88 for a plain",
    "Append; the producer's two frames 0.42-0.54, the log 0.38-0.49, the txn service 0.89-1.10 of which ~0.385",
    "is the no-op floor of two answered frames (bench/txn_floor.py --mode stream) and most of the rest grpc.aio's",
    "machinery on its loop. Next: answering the Commit on the frame of the next Prepare (one frame each way).",
    "",
    "Hops counted (issue 37, second session; bench/README.md, *Hops per answered transaction*): an answered",
    "Commit has none left but its frame and its append (no pool thread, no wait for another thread or for an",
    "OP record; the half from the cache; 0.27 log requests per frame); a two-way Rollback no longer waits in",
    "the handler pool but on the loop, woken by the thread that writes its OP record (Rollback p50 at 8",
    "producers 1.47-2.28x -> 1.14-1.23x a Commit's in bench/txn_nagle.py). Eighteen runs at load average 18-40:",
    "stream 0.41x (0.18-0.57), unary 0.28x (0.10-0.35), the CPU ratio 0.41 / 0.27: still missed, CPU-bound.",
]


def _names(text: str, known, what: str) -> list:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(map(str, known))})")
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 3, --quick 1)")
    parser.add_argument("--duration-s", type=float, default=0.0, help="the measuring window (default 4, --quick 1)")
    parser.add_argument("--producers", default="", help="a part: producer counts, e.g. 8,32")
    parser.add_argument("--modes", default="", help=f"a part: modes ({', '.join(MODES)})")
    parser.add_argument("--variants", default="", help=f"a part: variants ({', '.join(VARIANTS)})")
    parser.add_argument("--hosts", default="", help=f"where the Transaction service runs ({', '.join(HOSTS)}; "
                        "default both)")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg["rounds"] = args.rounds or cfg["rounds"]
    cfg["duration_s"] = args.duration_s or cfg["duration_s"]
    producer_counts = ([int(x) for x in _names(args.producers, list(map(str, PRODUCERS)), "producers")]
                       or list(PRODUCERS))
    modes = _names(args.modes, MODES, "modes") or list(MODES)
    variants = _names(args.variants, VARIANTS, "variants") or list(VARIANTS)
    hosts = _names(args.hosts, HOSTS, "hosts") or list(HOSTS)
    if "batched" not in variants:
        variants.insert(0, "batched")
    partial = bool(args.producers or args.modes or args.variants or args.rounds or args.duration_s or args.hosts)
    out_dir = RESULTS / "scratch" if args.quick or partial else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-txn-bench-"))
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            results = measure(cfg, work, producer_counts, modes, variants, hosts)
    except BenchError as exc:
        print(f"txn bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta("quick" if args.quick else "partial" if partial else "full", **cfg, producers=producer_counts,
                    modes=modes, variants=variants, hosts=hosts, **watch.report())
    write_table(out_dir, "txn", meta, rows(results, producer_counts, modes, variants, hosts), results, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
