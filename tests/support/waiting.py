"""Waiting for a condition in tests without sleeping to synchronise: poll it, bounded by a deadline."""

from __future__ import annotations

import threading
import time

# A deadline, not a sleep: a passing test waits only as long as its condition takes. 60 s, because on a 2-core
# machine under a CPU hog a follower's reconnect (a connection attempt timing out, then its backoff) took
# longer than 20 s, and a test then failed that would have passed a few seconds later.
WAIT_S = 60


def wait_until(condition, what: str, timeout_s: float = WAIT_S, poll_s: float = 0.005):
    """The first truthy value of ``condition()``; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < deadline:
        if value := condition():
            return value
        pause.wait(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
