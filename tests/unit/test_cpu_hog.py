"""scripts/cpu_hog.py (``make test-loaded``): it runs the command and exits with its status, and its busy
processes are bounded: they end with the command, after --duration-s, and when the hog itself is
killed with -9."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

from tests.support.waiting import wait_until

HOG = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "cpu_hog.py"
TIMEOUT_S = 60
PIDS = re.compile(r"\(pids ([\d ]+)\)")


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for its new parent to reap it counts: it burns nothing)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


def hog_pids(stderr_line: str) -> list[int]:
    found = PIDS.search(stderr_line)
    assert found, stderr_line
    return [int(p) for p in found.group(1).split()]


def test_runs_the_command_and_exits_with_its_status_and_stops_the_hogs():
    done = subprocess.run([sys.executable, str(HOG), "--processes", "2", "--", sys.executable, "-c",
                           "import sys; sys.exit(3)"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 3, done.stderr
    pids = hog_pids(done.stderr)
    assert len(pids) == 2 and all(gone(p) for p in pids)


def test_the_hogs_stop_by_themselves_after_the_duration():
    done = subprocess.run([sys.executable, str(HOG), "--processes", "1", "--duration-s", "0.5"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr


def test_the_hogs_end_when_the_hog_is_killed():
    hog = subprocess.Popen([sys.executable, str(HOG), "--processes", "2", "--", sys.executable, "-c",
                            "import time; time.sleep(60)"], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = hog_pids(hog.stderr.readline())
        hog.send_signal(signal.SIGKILL)
        hog.wait(TIMEOUT_S)
        wait_until(lambda: all(gone(p) for p in pids), "the busy processes to notice their parent is gone",
                   timeout_s=TIMEOUT_S)
    finally:
        os.killpg(hog.pid, signal.SIGKILL)  # the command, orphaned by the kill -9
        hog.wait(TIMEOUT_S)
        hog.stderr.close()
