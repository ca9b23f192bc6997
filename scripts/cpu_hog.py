"""Keep every core busy while a command runs: ``python scripts/cpu_hog.py [options] -- COMMAND ...``.

``make test-loaded`` runs the suite under it, to show that the tests pass on a loaded machine the first
time (a 2-core machine shared with other work). It starts ``--processes`` busy processes (default: one
per core), runs COMMAND, stops them and exits with COMMAND's status. Without a command it only burns
until ``--duration-s`` has passed or Ctrl-C.

Bounded, whatever happens to this script: each busy process stops by itself once ``--duration-s`` has
passed (default 3 h) or once its parent is gone (it checks its parent's pid between short bursts, so
a kill -9 of this script leaves nothing behind for more than a few milliseconds of work).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

BURST_ITERATIONS = 200_000     # a few ms of pure Python work between checks of the deadline and the parent
STOP_TIMEOUT_S = 10.0


def burn(deadline: float, parent_pid: int) -> None:
    """The busy loop of one process: until ``deadline`` (monotonic) or until ``parent_pid`` is gone."""
    while time.monotonic() < deadline and os.getppid() == parent_pid:
        for _ in range(BURST_ITERATIONS):
            pass


def start_hogs(count: int, duration_s: float) -> list[subprocess.Popen]:
    # A fresh interpreter per hog (not fork): no state of this process is shared, and each one knows
    # its parent by pid. time.monotonic() is system-wide on Linux, so the deadline carries over.
    deadline = time.monotonic() + duration_s
    command = [sys.executable, os.path.abspath(__file__), "--burn-until", repr(deadline), "--parent", str(os.getpid())]
    return [subprocess.Popen(command, stdin=subprocess.DEVNULL) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        if hog.poll() is None:
            hog.kill()
    for hog in hogs:
        hog.wait(STOP_TIMEOUT_S)


def run(command: list[str], processes: int, duration_s: float) -> int:
    hogs = start_hogs(processes, duration_s)
    what = f" while running: {' '.join(command)}" if command else ""
    print(f"cpu_hog: {processes} busy processes (pids {' '.join(str(h.pid) for h in hogs)}) for at most "
          f"{duration_s:.0f} s{what}", file=sys.stderr, flush=True)
    try:
        if not command:
            for hog in hogs:
                hog.wait()
            return 0
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_hogs(hogs)


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(prog="cpu_hog.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 2,
                        help="busy processes (default: one per core)")
    parser.add_argument("--duration-s", type=_positive, default=3 * 3600.0,
                        help="each busy process stops after this long, whatever happens (default 3 h)")
    parser.add_argument("--burn-until", type=float, help=argparse.SUPPRESS)   # the busy process itself
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.burn_until is not None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C in the terminal ends the hogs at once
        burn(args.burn_until, args.parent)
        return 0
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, not {args.processes}")
    return run(command, args.processes, args.duration_s)


if __name__ == "__main__":
    sys.exit(main())
