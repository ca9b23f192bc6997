"""gRPC server flavours for the single-message Append (issue 20): which server should CommitLog run?

``.venv/bin/python bench/grpc_flavours.py [--rounds 5] [--shape unary-1] [--producers 8]`` starts the
no-op CommitLog server in each flavour (bench/noop_server.py: ``sync`` as every service builds it,
``sync-bare`` without the interceptors, ``aio`` on grpc.aio) and mqstore ASYNC, then measures the same
closed-loop workload (bench/append.py's ``measure``) on each in turn, round after round, so that the
noise of the moment falls on every server alike. It prints and writes to
``bench/results/scratch/grpc_flavours.json`` each server's median msgs/s, its spread, its server CPU per
call (us, from /proc: steadier than rates on a loaded machine; with ``--perf`` also context
switches and CPU migrations per call from ``perf stat``) and the paired ratios against the
``sync`` no-op (each round's ratio, then their median).

What it answers: ``sync`` against ``sync-bare`` is what the interceptor chain (per-RPC metrics and the
error mapping, mqstore_rpc.server) costs a call; ``aio`` against ``sync`` is what an asyncio server would
win at the gRPC layer alone, before any store work is added to it. ``--burn-us 10,40`` adds no-ops whose
Append first spends that much CPU holding the GIL: what a longer handler costs beyond its own time.
``--running 0,4`` runs the sync no-op and mqstore with each max_running_handlers (mqstore_rpc.executor; the
plain ones run with the CommitLog service's default); ``--mode SYNC --shape unary-100 --producers 32`` asks
the same of SYNC group commit. Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile

import append
from procs import BENCH_DIR, PYTHON, GrpcServer, cpu_seconds, stop_all

FLAVOURS = ("sync", "sync-bare", "aio")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=sorted(append.SHAPES), default="unary-1")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--no-mqstore", action="store_true", help="the no-op flavours only")
    parser.add_argument("--flavours", default=",".join(FLAVOURS), help="the no-op flavours to run (sync always runs)")
    parser.add_argument("--burn-us", default="", help="comma-separated: also run the sync no-op whose Append "
                        "spends this much CPU first (noop_server.py --burn-us), e.g. 10,40")
    parser.add_argument("--running", default="", help="comma-separated max_running_handlers values: run the sync "
                        "no-op and mqstore ASYNC with each (mqstore_rpc.executor; 0 = no cap), e.g. 0,4")
    parser.add_argument("--mode", choices=("ASYNC", "SYNC"), default="ASYNC", help="mqstore's flush mode")
    parser.add_argument("--perf", action="store_true", help="perf stat each server: context switches, migrations")
    args = parser.parse_args(argv)
    timing = {"warmup_s": 1.0, "duration_s": args.duration_s, "channels": 1}
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mqstore-flavours-") as tmp:
        work = pathlib.Path(tmp)
        try:
            flavours = ["sync"] + [f for f in args.flavours.split(",") if f and f != "sync"]
            servers = {f"noop-{f}": GrpcServer(f"noop-{f}", [PYTHON, str(BENCH_DIR / "noop_server.py"), "--port", "0",
                                                             "--flavour", f], work / f"noop-{f}.log").start()
                       for f in flavours}
            for burn in (b for b in args.burn_us.split(",") if b):
                name = f"noop-sync-burn{burn}"
                servers[name] = GrpcServer(name, [PYTHON, str(BENCH_DIR / "noop_server.py"), "--port", "0",
                                                  "--burn-us", burn], work / f"{name}.log").start()
            if not args.no_mqstore:
                mq = GrpcServer.commitlog(work / "mqstore", args.mode).start().check_codec()
                append.create_topic(mq.target)
                servers[f"mqstore-{args.mode}"] = mq
            for running in (r for r in args.running.split(",") if r):
                name = f"noop-sync-r{running}"
                servers[name] = GrpcServer(name, [PYTHON, str(BENCH_DIR / "noop_server.py"), "--port", "0",
                                                  "--max-running-handlers", running], work / f"{name}.log").start()
                if not args.no_mqstore:
                    name = f"mqstore-{args.mode}-r{running}"
                    mq = GrpcServer.commitlog(work / name, args.mode, extra=("--max-running-handlers", running),
                                              log_name=f"{name}.log").start().check_codec()
                    append.create_topic(mq.target)
                    servers[name] = mq
            for round_ in range(args.rounds):
                for name, server in servers.items():
                    perf = _start_perf(server.pid, work / "perf.txt") if args.perf else None
                    cpu0 = cpu_seconds(server.pid)
                    r = append.measure(server, args.shape, args.producers, timing, 1)
                    calls = _calls(r, timing, append.SHAPES[args.shape])
                    r["cpu_us_per_call"] = (cpu_seconds(server.pid) - cpu0) / calls * 1e6 if calls else float("nan")
                    if perf is not None:
                        for event, count in _stop_perf(perf, work / "perf.txt").items():
                            r[f"{event}_per_call"] = count / calls if calls else float("nan")
                    results.setdefault(name, []).append(r)
                    per_call = " ".join(f"{k}={v:,.1f}" for k, v in r.items() if k.endswith("_per_call"))
                    print(f"round {round_ + 1}/{args.rounds} {name:14} msgs/s={r['msgs_per_s']:9,.0f} "
                          f"server_cores={r['server_cores']:.2f} {per_call} errors={r['errors']}", flush=True)
        finally:
            stop_all()
    summary = _summary(results)
    summary["meta"] = {"shape": args.shape, "producers": args.producers, "rounds": args.rounds, "mode": args.mode,
                       "duration_s": args.duration_s, "loadavg": os.getloadavg()}
    out = BENCH_DIR / "results" / "scratch"
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpc_flavours.json").write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def _calls(r: dict, timing: dict, shape: dict) -> float:
    """The calls of the whole measurement: the window's rate over warm-up and window (the server is idle
    while the load generator starts), so that per-call figures taken over the whole run divide right."""
    return r["msgs_per_s"] / (shape["batch"] * shape["items"]) * (timing["warmup_s"] + timing["duration_s"])


def _start_perf(pid: int, out: pathlib.Path) -> subprocess.Popen:
    """perf stat on the server: context switches, migrations and page faults (this VM exposes no hardware
    counters, so no instruction counts)."""
    return subprocess.Popen(["perf", "stat", "-x", ",", "-e", "context-switches,cpu-migrations,page-faults",
                             "-p", str(pid),
                             "-o", str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _stop_perf(perf: subprocess.Popen, out: pathlib.Path) -> dict[str, float]:
    perf.send_signal(signal.SIGINT)
    perf.wait(30)
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].replace(".", "").isdigit():
            counts[fields[2].split(":")[0].replace("-", "_")] = float(fields[0])
    return counts


def _summary(results: dict[str, list[dict]]) -> dict:
    base = results["noop-sync"]
    out = {}
    for name, runs in results.items():
        rates = [r["msgs_per_s"] for r in runs]
        ratios = [r["msgs_per_s"] / b["msgs_per_s"] for r, b in zip(runs, base, strict=True) if b["msgs_per_s"]]
        out[name] = {"median_msgs_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                     "median_cpu_us_per_call": statistics.median(r["cpu_us_per_call"] for r in runs),
                     **{f"median_{k}": statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_per_call")
                        and k != "cpu_us_per_call"},
                     "paired_ratios_vs_noop_sync": [round(x, 3) for x in ratios],
                     "median_paired_ratio": statistics.median(ratios) if ratios else None}
    return out


if __name__ == "__main__":
    sys.exit(main())
