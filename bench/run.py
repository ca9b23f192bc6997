"""CommitLog benchmark: ``make bench`` (= ``.venv/bin/python bench/run.py``). See bench/README.md.

Groups (``--only NAME[,NAME]``; default all):
  append    Append / AppendStream on mqstore ASYNC and SYNC with 1, 8, 16 (batched only) and 32
            producers, each against the no-op gRPC server and, for 100-message Appends, Redis
            Streams (everysec against ASYNC, always against SYNC); server memory at the end. Each
            on the compiled codec and on the pure-Python one (``--codec``; mqstore.codec).
  read      Pull (1 and 8 consumers) and Tail over a pre-filled log; no-op Pull; the append rate.
  recovery  restart after kill -9 of a ~1 GiB log, with and without the checkpoint (without: on both
            codecs); read it twice.
  profile   py-spy samples of the server under batched append and during a checkpoint-less
            restart (only if py-spy is installed; needs the recovery group's log, so runs it too).

A full run writes bench/results/commitlog.json and .md. ``--quick`` (a smoke run with tiny sizes and
short windows) and ``--only`` write to bench/results/scratch/ instead (ignored by git), so that a check
never overwrites the figures of a full run. Every process started is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time
import traceback

import grpc

import append
import diskuse
import pyspy as profiling
import reads
import recovery
import redis_peer
import report
from procs import CODEC_COMPILED, CODEC_PYTHON, BenchError, git_rev, stop_all

BENCH_DIR = pathlib.Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
GROUPS = ("append", "read", "recovery", "profile")
MiB = 1 << 20

FULL = {"warmup_s": 1.0, "duration_s": 4.0, "rounds": 3, "max_rounds": 5, "profile_s": 8.0, "channels": 1,
        "redis_probe": 20_000,
        "read_fill_bytes": 400 * MiB, "log_bytes": 1024 * MiB, "segment_bytes": 256 * MiB,
        "fill_timeout_s": 240.0, "read_timeout_s": 60.0, "recovery_timeout_s": 300.0}
QUICK = {"warmup_s": 0.3, "duration_s": 0.7, "rounds": 2, "max_rounds": 2, "profile_s": 1.0, "channels": 1,
         "redis_probe": 3_000,
         "read_fill_bytes": 16 * MiB, "log_bytes": 32 * MiB, "segment_bytes": 8 * MiB,
         "fill_timeout_s": 60.0, "read_timeout_s": 20.0, "recovery_timeout_s": 60.0}

_T0 = time.monotonic()


def log(group: str, label: str, data: dict) -> None:
    """One progress line per measurement on stdout."""
    keys = ("msgs_per_s", "p50_ms", "p99_ms", "seconds", "server_cores", "client_cores", "errors", "read_s",
            "direct_s", "floor_s", "samples")
    shown = []
    for k in keys:
        if k in data and data[k] not in (None, {}):
            v = data[k]
            shown.append(f"{k}={v:,.0f}" if k == "msgs_per_s" else
                         f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}")
    print(f"[{time.monotonic() - _T0:6.1f}s] {group:8} {label:28} {' '.join(shown)}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="mqstore CommitLog benchmark")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, short windows")
    parser.add_argument("--only", default="", help=f"comma-separated groups: {', '.join(GROUPS)}")
    parser.add_argument("--no-profile", action="store_true", help="skip py-spy profiling even if installed")
    parser.add_argument("--client-procs", type=int, default=1, help="load generator processes per workload")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    parser.add_argument("--codec", choices=("both", CODEC_COMPILED, CODEC_PYTHON), default="both",
                        help="the codecs the append and read groups measure mqstore on (mqstore.codec; "
                             "default both)")
    args = parser.parse_args(argv)
    chosen = [g.strip() for g in args.only.split(",") if g.strip()] or list(GROUPS)
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        parser.error(f"unknown group(s) {sorted(unknown)}; choose from {', '.join(GROUPS)}")
    if args.no_profile and "profile" in chosen:
        chosen.remove("profile")
    if "profile" in chosen and not profiling.py_spy():
        print("bench: py-spy not installed (.venv/bin/pip install py-spy): no profile", flush=True)
        chosen.remove("profile")
    args.groups = chosen
    return args


def _meta(args, elapsed_s: float, started: str) -> dict:
    return {"started": started, "elapsed_s": elapsed_s, "mode": "quick" if args.quick else "full",
            "groups": args.groups, "git": git_rev(), "client_procs": args.client_procs,
            "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, grpcio {grpc.__version__}, "
                       f"Linux {platform.release()}"}


def _notes(args, results: dict, cfg: dict) -> list[str]:
    notes = [
        f"Clients: {args.client_procs} load-generator process(es) per workload (bench/loadgen.py, grpc.aio, "
        f"{cfg['channels']} channel), separate from the measuring process, which only waits. Requests are "
        "serialised once and sent as bytes; append responses are not parsed (the first of each task is, and "
        "checked). Client and servers share the machine's cores; 'server_cores' and 'client_cores' in the JSON "
        "show how busy each was.",
        f"Throughput windows: {cfg['warmup_s']} s warm-up then {cfg['duration_s']} s measured, closed loop; "
        "1 KiB bodies; topic with 8 queues, queue chosen round robin.",
        f"The Append configurations the targets name "
        f"({', '.join(f'{shape} {n}p' for shape, n in sorted(append.TARGET_CONFIGURATIONS))}) "
        f"are measured in {cfg['rounds']} rounds (up to {cfg['max_rounds']} while one round's ratio of a target "
        "moves by more than 10% from the median of its rounds), each round every server (no-op, mqstore, Redis) "
        "in turn, each target's pair side by side and in alternating order (bench/append.py round_order: "
        "mqstore ASYNC beside Redis everysec, SYNC beside Redis always, swapped every other round); their "
        "figures are the medians over the rounds (each round's rate: 'rounds_msgs_per_s' in the JSON), and the "
        "ratio is median over median. The pure-Python codec runs in the first round only.",
        "Redis latency is per request inside a pipeline of 100 (so comparable to our per-call latency of a "
        "100-message Append).",
        "Recovery: 'checkpoint removed' deletes <data>/checkpoint after the kill -9, so the store re-checks the "
        "whole log and rebuilds the consume queues from it; 'checkpoint kept' is the ordinary crash restart.",
    ]
    note = (results.get("append") or {}).get("redis_note")
    if note:
        notes.append(f"redis-server: {note}.")
    for group, value in results.items():
        if isinstance(value, dict) and value.get("error"):
            notes.append(f"group {group} FAILED: {value['error']}")
    return notes


def _run_group(name: str, fn, results: dict, work: pathlib.Path, keep: tuple[str, ...] = ()) -> None:
    """Run one group; a failure is recorded and the next group still runs. Either way its servers' data
    is deleted after it (but the directories in ``keep``, which a later group reads)."""
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - recorded in the results and the exit status; other groups go on
        traceback.print_exc()
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        stop_all()
    finally:
        diskuse.prune(work, keep)


def run_groups(args, cfg: dict, work: pathlib.Path, results: dict) -> None:
    if "append" in args.groups:
        def append_group():
            try:
                note = redis_peer.ensure_installed()
            except BenchError as exc:
                print(f"bench: no Redis comparison: {exc}", flush=True)
                note = None
            codecs = (CODEC_COMPILED, CODEC_PYTHON) if args.codec == "both" else (args.codec,)
            return append.run(work, cfg, note, args.client_procs, log, codecs)
        _run_group("append", append_group, results, work)
    if "read" in args.groups:
        codecs = (CODEC_COMPILED, CODEC_PYTHON) if args.codec == "both" else (args.codec,)
        _run_group("read", lambda: reads.run(work, cfg, log, codecs), results, work)
    if "recovery" in args.groups or "profile" in args.groups:
        # the profile group restarts the recovery group's log: kept until then
        keep = ("recovery",) if "profile" in args.groups else ()
        _run_group("recovery", lambda: recovery.run(work, cfg, log), results, work, keep)
    if "profile" in args.groups:
        profile_dir = RESULTS_DIR if not (args.quick or args.only) else RESULTS_DIR / "scratch"
        profile_dir.mkdir(parents=True, exist_ok=True)

        def profile_group():
            found = {"append": profiling.profile_append(work, profile_dir, cfg, log)}
            if "error" not in results.get("recovery", {}):
                for removed in (False, True):
                    key = "recovery_checkpoint_" + ("removed" if removed else "kept")
                    found[key] = profiling.profile_recovery(work, profile_dir, cfg, log, removed)
            return found
        _run_group("profile", profile_group, results, work)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.quick:
        append.PRODUCERS = (1, 32)  # 16 stays (EXTRA): it is the configuration the targets name
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-bench-"))
    results: dict = {}
    print(f"bench: groups {', '.join(args.groups)}; work directory {work}", flush=True)
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            run_groups(args, cfg, work, results)
    finally:
        stop_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - _T0
    rows = report.build_rows(results)
    partial = args.quick or bool(args.only)
    out_dir = RESULTS_DIR / "scratch" if partial else RESULTS_DIR
    if partial:
        out_dir.mkdir(parents=True, exist_ok=True)
        ignore = out_dir / ".gitignore"  # committed; recreated only if someone removed the directory
        if not ignore.exists():
            ignore.write_text("*\n!.gitignore\n")
    stem = "commitlog" + ("-quick" if args.quick else "") + (f"-{'-'.join(args.groups)}" if args.only else "")
    meta = {**_meta(args, elapsed, started), **watch.report()}
    report.write(out_dir, stem, results, rows, meta, _notes(args, results, cfg))
    print(report.markdown(rows, meta, []), flush=True)
    print(f"bench: wrote {out_dir / stem}.json and .md in {elapsed:.0f} s", flush=True)
    failed = [g for g, v in results.items() if isinstance(v, dict) and v.get("error")]
    if failed:
        print(f"bench: group(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
