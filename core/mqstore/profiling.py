"""An opt-in cProfile of one thread, for benchmarks (bench/README.md, *The replication benchmark*).

``MQSTORE_PROFILE_DIR=<dir>``: each thread started through :func:`run` (the grpc.aio loop thread, the
background duties' threads) runs under its own ``cProfile.Profile`` and writes
``<dir>/<pid>-<thread name>.prof`` when it ends (a clean stop of the process). Unset (the default): the
target runs as is, at no cost. cProfile costs CPU itself: compare profiles with profiles, not rates.
``MQSTORE_PROFILE_CLOCK=cpu`` times the thread's CPU (``time.thread_time_ns``) instead of the wall clock:
a thread waiting for the GIL or for a core (three servers on two cores) then counts nothing, where the
wall clock charges it to whatever function was running (costlier per call: a system call each).
"""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Callable


OS_NAME_BYTES = 15  # Linux keeps this many bytes of a thread's name (TASK_COMM_LEN less its NUL)


def name_os_thread() -> None:
    """Give the calling thread's Python name (its first 15 bytes) to the OS thread (Linux: /proc/self/task/TID/comm,
    what top -H and /proc show). Nothing elsewhere, nor when the kernel refuses: a name is no reason to fail."""
    name = threading.current_thread().name.encode("utf-8", "replace")[:OS_NAME_BYTES]
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "wb") as comm:
            comm.write(name)
    except OSError:
        pass


def run(target: Callable[[], object]) -> None:
    """``target()`` with the thread named (:func:`name_os_thread`), profiled when MQSTORE_PROFILE_DIR is set."""
    name_os_thread()
    where = os.environ.get("MQSTORE_PROFILE_DIR")
    if not where:
        target()
        return
    import cProfile

    if os.environ.get("MQSTORE_PROFILE_CLOCK") == "cpu":
        import time

        profile = cProfile.Profile(time.thread_time_ns, 1e-9)
    else:
        profile = cProfile.Profile()
    try:
        profile.runcall(target)
    finally:
        path = pathlib.Path(where) / f"{os.getpid()}-{threading.current_thread().name}.prof"
        path.parent.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(str(path))
