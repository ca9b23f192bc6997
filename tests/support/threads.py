"""What the OS calls a thread (Linux: /proc/self/task/TID/comm), for the tests of mqstore.profiling.name_os_thread."""

from __future__ import annotations

import threading


def os_thread_name(native_id: int | None = None) -> str:
    """The OS name of the thread ``native_id`` of this process (the calling thread's by default)."""
    with open(f"/proc/self/task/{native_id or threading.get_native_id()}/comm") as comm:
        return comm.read().rstrip("\n")
