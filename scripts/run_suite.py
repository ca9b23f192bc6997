"""Run the test suite as N pytest processes side by side (what ``make test`` runs; tests/support/shards.py
says how tests are split and why it pays on two cores).

    python scripts/run_suite.py [--shards N] [--save-timings] [-- PYTEST_ARGS...]

Each shard's output goes to ``.pytest-shards/shard-K.log`` and is printed whole, one shard after the other,
when every shard has ended (a line a minute says how far each one is meanwhile). The seconds each unit took
are merged into ``.pytest-timings.json`` so that the next run balances on them; ``--save-timings`` also
copies them to ``tests/timings.json`` (committed: the figures of a fresh clone).

Exit status: 0 when every shard passed; otherwise the first shard's status that is not 0 or 5 (5: pytest
selected no test, which a shard of a narrow selection may be), or 5 when no shard ran a test.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import shards  # noqa: E402  (the repository's root first)

LOGS = ROOT / ".pytest-shards"
NO_TESTS = 5
PROGRESS_EVERY_S = 60.0
PERCENT = re.compile(rb"\[ *(\d+)%\]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=int(os.environ.get("MQSTORE_TEST_SHARDS", "2")),
                        help="pytest processes side by side (default 2, or MQSTORE_TEST_SHARDS)")
    parser.add_argument("--save-timings", action="store_true",
                        help="also write this run's figures to tests/timings.json (to commit)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every pytest process")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    LOGS.mkdir(exist_ok=True)
    started = time.monotonic()
    runs = []
    for index in range(1, args.shards + 1):
        log = LOGS / f"shard-{index}.log"
        timings = LOGS / f"shard-{index}.timings.json"
        timings.unlink(missing_ok=True)
        command = [sys.executable, "-m", "pytest", f"--shard={index}/{args.shards}", f"--timings-out={timings}",
                   *args.pytest_args]
        out = log.open("wb")
        runs.append((index, log, timings, out, subprocess.Popen(command, cwd=ROOT, stdout=out,
                                                                stderr=subprocess.STDOUT)))
    print(f"run_suite: {args.shards} pytest processes side by side; their output follows when all have ended",
          flush=True)
    try:
        while any(process.poll() is None for *_, process in runs):
            deadline = time.monotonic() + PROGRESS_EVERY_S
            while time.monotonic() < deadline and any(process.poll() is None for *_, process in runs):
                time.sleep(0.5)
            print("run_suite: " + ", ".join(_progress(index, log, process) for index, log, _, _, process in runs)
                  + f" ({time.monotonic() - started:,.0f} s)", flush=True)
    except KeyboardInterrupt:
        for *_, process in runs:
            process.terminate()
        raise
    statuses = []
    for index, log, _, out, process in runs:
        out.close()
        print(f"\n{'=' * 30} shard {index} of {args.shards}: exit {process.returncode} {'=' * 30}", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.flush()
        statuses.append(process.returncode)
    figures = []
    for _, _, timings, _, _ in runs:
        try:
            figures.append(json.loads(timings.read_text()))
        except (OSError, ValueError):
            pass
    merged = shards.merge_timings(figures, shards.load_timings())
    shards.LOCAL_TIMINGS.write_text(json.dumps(merged, indent=0) + "\n")
    if args.save_timings:
        shutil.copyfile(shards.LOCAL_TIMINGS, shards.COMMITTED_TIMINGS)
    status = _status(statuses)
    print(f"\nrun_suite: {args.shards} shards, exit {statuses}, wall {time.monotonic() - started:,.0f} s -> {status}")
    return status


def _progress(index: int, log: pathlib.Path, process: subprocess.Popen) -> str:
    """``shard K at NN%`` from the last ``[ NN%]`` pytest printed, and whether it still runs."""
    try:
        text = log.read_bytes()
    except OSError:
        text = b""
    found = PERCENT.findall(text)
    where = f"at {int(found[-1])}%" if found else "before its first line of results"
    return f"shard {index} {where}" + ("" if process.poll() is None else f", ended {process.returncode}")


def _status(statuses: list[int]) -> int:
    for status in statuses:
        if status not in (0, NO_TESTS):
            return status
    return 0 if any(status == 0 for status in statuses) else NO_TESTS


if __name__ == "__main__":
    sys.exit(main())
