"""What bench/index_bench.py and bench/compactor.py share: their options, running the chosen groups
and writing the results.

- ``--quick`` (tiny sizes), ``--only A,B`` (some groups), ``--keep`` (keep the work directory) and one
  hidden option of the script's own (the process it runs as a child); unknown options are ignored, as
  `make bench` passes run.py's options to every script.
- Each chosen group runs in one temporary work directory; a group that fails is recorded as
  ``{"error": ...}`` and the others still run; every process the procs module started is stopped, and the
  group's data is deleted when it ends (bench/diskuse.py); the peak disk use goes into the results.
- A full run writes ``bench/results/<stem>.json`` and ``.md``; ``--quick`` and ``--only`` runs write to
  ``bench/results/scratch/`` (ignored by git). The exit status is 1 when a group failed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import tempfile
import time
import traceback
from typing import Callable

import diskuse
import grpc
from procs import git_rev, stop_all

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
LAST_DISK: dict = {}  # the disk use of the last run(): written into the results' meta by write()


def parse(description: str, groups: tuple[str, ...], child_option: str, argv=None) -> argparse.Namespace:
    """The options; ``args.groups`` are the chosen groups in their order, ``args.partial`` says whether
    the results go to scratch/."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, short windows")
    parser.add_argument("--only", default="", help=f"comma-separated groups: {', '.join(groups)}")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    parser.add_argument(f"--{child_option}", dest="child", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # run.py's own options come along through BENCH_ARGS
    asked = [g.strip() for g in args.only.split(",") if g.strip()]
    args.groups = [g for g in groups if not asked or g in asked]
    args.asked = bool(asked)
    args.partial = args.quick or args.asked
    return args


def run(name: str, table: tuple[tuple[str, Callable], ...], args: argparse.Namespace, cfg: dict) -> dict:
    """{group: its result, or {"error": ...}} for the chosen groups of ``table`` (group, fn(work, cfg)).
    The run's peak disk use is kept for :func:`write` (``LAST_DISK``)."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"mqstore-{name}-bench-"))
    print(f"{name} bench: groups {', '.join(args.groups)}; work directory {work}", flush=True)
    results: dict = {}
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            for group, fn in table:
                if group in args.groups:
                    try:
                        results[group] = fn(work, cfg)
                    except Exception as exc:  # noqa: BLE001 - recorded in the results; the other groups still run
                        traceback.print_exc()
                        results[group] = {"error": f"{type(exc).__name__}: {exc}"}
                        stop_all()
                    finally:
                        diskuse.prune(work)
    finally:
        stop_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    LAST_DISK.clear()
    LAST_DISK.update(watch.report())
    return results


def write(name: str, args: argparse.Namespace, cfg: dict, started: str, elapsed_s: float, results: dict,
          rows: list[dict], markdown: Callable[[list[dict], dict, dict], str], machine_extra: str = "") -> int:
    """Write the JSON and the Markdown of a run; the exit status (1 when a group failed)."""
    meta = {"started": started, "elapsed_s": elapsed_s, "mode": "quick" if args.quick else "full",
            "groups": args.groups, "git": git_rev(), "config": cfg, **LAST_DISK,
            "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, grpcio {grpc.__version__}"
                       + machine_extra}
    out_dir = RESULTS_DIR / "scratch" if args.partial else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = name + ("-quick" if args.quick else "") + (f"-{'-'.join(args.groups)}" if args.asked else "")
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "results": results}, indent=2,
                                                     default=str) + "\n")
    text = markdown(rows, meta, results)
    (out_dir / f"{stem}.md").write_text(text)
    print(text, flush=True)
    print(f"{name} bench: wrote {out_dir / stem}.json and .md", flush=True)
    return 1 if any(isinstance(v, dict) and v.get("error") for v in results.values()) else 0


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")
