"""One concurrency model (issue 33, item 3): the CommitLog port of this tree, a grpc.aio server (the only kind of
port there is: mqstore_rpc.aio), against the synchronous port of an older tree, side by side (run by ``make bench``):
``bench/concurrency.py [--quick] [--old-root DIR]``.

The CommitLog service (``--flush-mode ASYNC``) served by:

  sync   the synchronous grpc server with the handler pool (mqstore_rpc.executor) of the tree at ``--old-root``
         (``git archive <rev> | tar -x -C DIR``, its compiled codec built there: ``python setup.py build_ext
         --inplace``), a revision from before every port was grpc.aio, run with ``--append-on-loop false``:
         every call's handler on a pool thread. Left out without ``--old-root``
  shim   the old tree's grpc.aio port (``--append-on-loop true``): Append on the loop, every other handler
         in the pool through its shim, the interceptors' synchronous adapters running there. Left out without
         ``--old-root``
  aio    this tree's port: Append, GetStoreInfo and Pulls of the hot local log (this workload's) answered on
         the event loop, every other handler in the handler pool (a synchronous unary call by run_in_executor, a
         response stream driven by the loop)

Workloads, each at 1 and 16 concurrent callers, closed loop, the client (bench/loadgen.py, grpc.aio) in
another process: Append of 1 message, Append of 100 messages, Pull of 32 messages (task i reads queue
i mod 8 from offset 0, the same bytes each time: page cache), GetStoreInfo (a unary read that touches
no log) and Tail (a server stream from the earliest record, cancelled after TAIL_RECORDS 1 KiB records:
a few MB per stream). Throughput, p50/p99 per call (per stream for Tail) and the server process's CPU
per call (its CPU seconds over the run, over its calls). The servers run at once and each round
measures every configuration on each back to back, the order reversed every other round; the figures
are the medians over the rounds, the ratios over sync's (for CPU per call: lower is better).

A full run writes bench/results/concurrency.json and .md; ``--quick`` (under a minute), or a run of some
``--workloads``, ``--callers``, ``--rounds`` or ``--duration-s``, writes to bench/results/scratch/. Every process
started is stopped at the end.
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

import append
import diskuse
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2
from procs import GrpcServer, cpu_seconds, run_loadgen, run_meta, stop_all, write_table

BENCH = pathlib.Path(__file__).resolve().parent
RESULTS = BENCH / "results"
REPO = BENCH.parent
PORTS = ("sync", "shim", "aio")  # sync, shim: the old tree's two ports (--old-root); aio: this tree's
CALLERS = (1, 16)
PULL_MESSAGES = 32
TAIL_RECORDS = 4096  # 1 KiB bodies: ~4.6 MB of records per stream
FILL_MESSAGES = 8 * 1024  # before the first round: Pull's and Tail's data (8 queues x 1024)
WORKLOADS = {
    "append-1": "Append, 1 msg/call",
    "append-100": "Append, 100 msgs/call",
    "pull": f"Pull, {PULL_MESSAGES} msgs/call",
    "info": "GetStoreInfo (unary read)",
    "tail": f"Tail, {TAIL_RECORDS} records/stream",
}
FULL = {"warmup_s": 0.5, "duration_s": 2.5, "rounds": 3}
QUICK = {"warmup_s": 0.2, "duration_s": 0.4, "rounds": 1}


def spec(workload: str, server: GrpcServer, callers: int, cfg: dict) -> dict:
    base = {"target": server.target, "concurrency": callers, "channels": 1, "warmup_s": cfg["warmup_s"],
            "duration_s": cfg["duration_s"], "max_calls": 10_000_000, "start_at": 0}
    if workload.startswith("append-"):
        batch = int(workload.split("-")[1])
        return {**base, "kind": "unary", "topic": append.TOPIC, "batch": batch, "items": 1,
                "body_bytes": append.BODY_BYTES}
    if workload == "pull":
        requests = [commitlog_pb2.PullRequest(topic=append.TOPIC, queue_id=q, offset=0, max_messages=PULL_MESSAGES,
                                              max_bytes=4 << 20).SerializeToString().hex()
                    for q in range(append.QUEUES)]
        return {**base, "kind": "call", "method": "Pull", "requests_hex": requests, "per_call": PULL_MESSAGES}
    if workload == "info":
        return {**base, "kind": "call", "method": "GetStoreInfo",
                "requests_hex": [commitlog_pb2.GetStoreInfoRequest().SerializeToString().hex()]}
    return {**base, "kind": "tails", "expected_records": TAIL_RECORDS, "max_frame_bytes": 1 << 20}


def measure(workload: str, server: GrpcServer, callers: int, cfg: dict) -> dict:
    cpu0 = cpu_seconds(server.pid)
    [r] = run_loadgen(spec(workload, server, callers, cfg), 1, timeout_s=cfg["warmup_s"] + cfg["duration_s"] + 60)
    cpu = cpu_seconds(server.pid) - cpu0
    # The server's CPU over the whole run (warm-up and the tail of the window included) over the calls
    # answered in that time, estimated from the window's rate: the same rate holds over the warm-up.
    run_s = cfg["warmup_s"] + cfg["duration_s"]
    latencies = sorted(r["latencies_ms"])
    calls_per_s = r["calls"] / cfg["duration_s"]
    return {"calls_per_s": calls_per_s, "msgs_per_s": r["messages"] / cfg["duration_s"],
            "p50_ms": append.percentile(latencies, 0.50), "p99_ms": append.percentile(latencies, 0.99),
            "cpu_us_per_call": cpu / (calls_per_s * run_s) * 1e6 if calls_per_s else None,
            "errors": r["errors"], "first_error": r["first_error"]}


def fill(server: GrpcServer) -> None:
    append.create_topic(server.target)
    run_loadgen({"kind": "fill", "target": server.target, "topic": append.TOPIC, "batch": 128,
                 "body_bytes": append.BODY_BYTES, "concurrency": 4, "target_bytes": FILL_MESSAGES * 1024,
                 "max_calls": 10_000, "timeout_s": 60.0})


def start(work: pathlib.Path, name: str, old_root: pathlib.Path | None) -> GrpcServer:
    if name == "aio":
        return GrpcServer.commitlog(work / name, "ASYNC").start()
    on_loop = "false" if name == "sync" else "true"
    server = GrpcServer.commitlog(work / name, "ASYNC", extra=("--append-on-loop", on_loop))
    # The old tree's packages in place of this tree's (the same layout: core, services/*, spark)
    server.env = {**(server.env or os.environ),
                  "PYTHONPATH": os.environ.get("PYTHONPATH", "").replace(str(REPO), str(old_root))}
    return server.start()


def rounds(work: pathlib.Path, cfg: dict, log, ports: tuple[str, ...], old_root: pathlib.Path | None,
           workloads: list[str], callers_each: tuple[int, ...]) -> dict[str, list[dict]]:
    servers = {name: start(work, name, old_root) for name in ports}
    raw: dict[str, list[dict]] = {}
    try:
        for server in servers.values():
            fill(server)
        for round_ in range(cfg["rounds"]):
            for workload in workloads:
                for callers in callers_each:
                    order = list(ports) if round_ % 2 == 0 else list(reversed(ports))  # each first in turn
                    for name in order:
                        r = measure(workload, servers[name], callers, cfg)
                        raw.setdefault(f"{workload} {callers} {name}", []).append(r)
                        log(round_, workload, callers, name, r)
                        server = servers[name]
                        if diskuse.allocated_bytes(server.data_dir) > diskuse.SERVER_DATA_BUDGET_BYTES:
                            server.restart_empty()
                            fill(server)
    finally:
        for server in servers.values():
            server.stop()
    return raw


def _median(results: list[dict], key: str) -> float | None:
    values = [r[key] for r in results if r[key] is not None]
    return statistics.median(values) if values else None


def rows(raw: dict[str, list[dict]], workloads: tuple[str, ...] = tuple(WORKLOADS),
         callers_each: tuple[int, ...] = CALLERS) -> list[dict]:
    table = []
    for workload in workloads:
        label = WORKLOADS[workload]
        for callers in callers_each:
            row = {"workload": label, "callers": callers}
            for name in PORTS:
                runs = raw.get(f"{workload} {callers} {name}", [])
                for key in ("calls_per_s", "msgs_per_s", "p50_ms", "p99_ms", "cpu_us_per_call"):
                    row[f"{name}_{key}"] = _median(runs, key)
                row[f"{name}_errors"] = sum(sum(r["errors"].values()) for r in runs)
            for name in ("shim", "aio"):
                row[f"{name}_ratio_calls"] = (row[f"{name}_calls_per_s"] / row["sync_calls_per_s"]
                                              if row["sync_calls_per_s"] else None)
                row[f"{name}_ratio_cpu"] = (row[f"{name}_cpu_us_per_call"] / row["sync_cpu_us_per_call"]
                                            if row["sync_cpu_us_per_call"] and row[f"{name}_cpu_us_per_call"] else None)
            table.append(row)
    return table


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.{digits}f}"


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# Concurrency models: the synchronous port vs the grpc.aio port", "",
             f"{meta['when']} at {meta['git']} on {meta['machine']}; {meta['mode']} run: the CommitLog service "
             f"(ASYNC) on {len(meta.get('ports') or PORTS)} ports, medians of {meta['rounds']} alternating round(s) "
             f"of {meta['duration_s']} s "
             "windows; calls/s (Tail: streams/s), p50/p99 ms per call, server CPU µs per call. Workload: "
             "bench/concurrency.py.", "",
             f"Ports: sync = the synchronous server of the tree at {meta.get('old_root') or '(none given)'} "
             "(--append-on-loop false), shim = that tree's grpc.aio port (--append-on-loop true), aio = this tree's "
             "grpc.aio port (Append, GetStoreInfo and hot Pulls on the loop, the rest in the handler pool). Ratios: "
             "figure / "
             "sync's.", "",
             "| workload | callers | sync calls/s | shim | aio | sync p50/p99 ms | shim p50/p99 | aio p50/p99 | "
             "sync CPU µs/call | shim | aio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        def pair(name: str, key: str, ratio: str, r: dict = r) -> str:
            return f"{_fmt(r[f'{name}_{key}'])} ({_fmt(r[f'{name}_{ratio}'])}x)"
        lines.append(f"| {r['workload']} | {r['callers']} | {_fmt(r['sync_calls_per_s'])} | "
                     f"{pair('shim', 'calls_per_s', 'ratio_calls')} | {pair('aio', 'calls_per_s', 'ratio_calls')} | "
                     + " | ".join(f"{_fmt(r[f'{n}_p50_ms'])} / {_fmt(r[f'{n}_p99_ms'])}" for n in PORTS) +
                     f" | {_fmt(r['sync_cpu_us_per_call'])} | {pair('shim', 'cpu_us_per_call', 'ratio_cpu')} | "
                     f"{pair('aio', 'cpu_us_per_call', 'ratio_cpu')} |")
    errors = [f"{r['workload']} x{r['callers']}" for r in table if any(r[f"{n}_errors"] for n in PORTS)]
    if errors:
        lines += ["", f"Calls that failed in: {', '.join(errors)} (the JSON has the first error)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the synchronous port vs the grpc.aio port (bench/README.md)")
    parser.add_argument("--quick", action="store_true", help="one short round (under a minute)")
    parser.add_argument("--old-root", type=pathlib.Path, help="a tree from before every port was grpc.aio, its "
                        "codec built: its synchronous port is the sync column (left out without it)")
    parser.add_argument("--rounds", type=int, help="rounds (default: 1 quick, 3 full)")
    parser.add_argument("--workloads", help=f"comma-separated, of {','.join(WORKLOADS)} (default: all)")
    parser.add_argument("--callers", help="comma-separated (default: 1,16)")
    parser.add_argument("--duration-s", type=float, help="each window (default: 0.4 quick, 2.5 full)")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.rounds:
        cfg["rounds"] = args.rounds
    if args.duration_s:
        cfg["duration_s"] = args.duration_s
    workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    callers = tuple(int(c) for c in args.callers.split(",")) if args.callers else CALLERS
    ports = PORTS if args.old_root else ("aio",)
    partial = args.quick or args.workloads or args.callers or args.rounds or args.duration_s
    out_dir = RESULTS / "scratch" if partial else RESULTS  # only a full run of everything replaces the table
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-concurrency-"))
    t0 = time.monotonic()

    def log(round_, workload, callers, name, r):
        print(f"[{time.monotonic() - t0:5.1f}s] round {round_ + 1} {workload:10} x{callers:<2} {name:4} "
              f"calls/s={r['calls_per_s']:9,.0f} p50_ms={r['p50_ms'] or 0:.2f} p99_ms={r['p99_ms'] or 0:.2f} "
              f"cpu_us/call={r['cpu_us_per_call'] or 0:.0f} errors={r['errors']}", flush=True)

    try:
        with diskuse.DiskWatch(work) as watch:
            raw = rounds(work, cfg, log, ports, args.old_root and args.old_root.resolve(), workloads, callers)
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta("quick" if args.quick else "full", **cfg, **watch.report(),
                    old_root=str(args.old_root) if args.old_root else None, ports=list(ports))
    write_table(out_dir, "concurrency", meta, rows(raw, workloads, callers), raw, markdown)
    return 1 if any(sum(r["errors"].values()) for runs in raw.values() for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
