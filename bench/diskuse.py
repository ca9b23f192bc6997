"""Disk a benchmark takes: the peak of the bytes allocated under its work directory, sampled in the
background, and the least free space seen on that filesystem.

``make bench`` must run within the disk a developer has (bench/README.md says how much): every group
deletes its servers' data when it ends, the append group starts a server again on an empty directory
once its data passes :data:`SERVER_DATA_BUDGET_BYTES`, and each results file reports what was used.

Allocated bytes are ``st_blocks * 512`` (a pre-allocated segment counts in full, a sparse file only
for what is written), summed over every file under the directory; a file that vanishes while it is
walked counts as 0. Thread-safe: the sampler is the only writer of the figures; readers see the last.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import threading

GiB = 1 << 30
# A server's data directory is emptied (the server restarted on a fresh one) between two measurements
# once it holds more than this. A new store already allocates its first 1 GiB segment, so this is that
# segment plus about half a GiB written; with the four mqstore servers of the append group each below
# ~2.5 GiB (this, one measurement's writes and the next segment) the bench stays within the 10 GiB
# bench/README.md asks for.
SERVER_DATA_BUDGET_BYTES = 3 * GiB // 2


def allocated_bytes(root: pathlib.Path) -> int:
    """Bytes allocated on disk to the files under ``root`` (0 when it does not exist)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # deleted while we walked
    return total


class DiskWatch:
    """Samples :func:`allocated_bytes` of ``root`` and the free bytes of its filesystem every
    ``interval_s`` until stopped; a context manager."""

    def __init__(self, root: pathlib.Path, interval_s: float = 0.5):
        self.root, self.interval_s = root, interval_s
        self.peak_bytes = 0
        self.min_free_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-diskwatch", daemon=True)

    def __enter__(self) -> "DiskWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sample()

    def sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, allocated_bytes(self.root))
        try:
            free = shutil.disk_usage(self.root).free
        except FileNotFoundError:
            return
        self.min_free_bytes = free if self.min_free_bytes is None else min(self.min_free_bytes, free)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def report(self) -> dict:
        """{"peak_gib": ..., "min_free_gib": ...}, for a results file's meta."""
        free = None if self.min_free_bytes is None else round(self.min_free_bytes / GiB, 2)
        return {"disk_peak_gib": round(self.peak_bytes / GiB, 2), "disk_min_free_gib": free}


def describe(meta: dict) -> str:
    """The sentence a results table gives about disk use ("" when the run did not measure it)."""
    if meta.get("disk_peak_gib") is None:
        return ""
    return (f"Peak disk use of the run's work directory {meta['disk_peak_gib']} GiB (least free on its "
            f"filesystem {meta['disk_min_free_gib']} GiB). ")


def prune(work: pathlib.Path, keep: tuple[str, ...] = ()) -> None:
    """After a group: delete every directory under ``work`` (the servers' data) but those named in
    ``keep``; the servers' log files, directly in ``work``, stay for a failure's diagnosis."""
    for entry in work.iterdir():
        if entry.is_dir() and entry.name not in keep:
            shutil.rmtree(entry)


def remove(path: pathlib.Path) -> None:
    """Delete a server's or a group's data once it is no longer needed (its processes stopped)."""
    if path.exists():
        shutil.rmtree(path)
