"""FileTable: which index files exist, which ranges wait for a rebuild, which files are being rebuilt.

Files are keyed by their first physical offset (their name, files.py). A quarantined range [start, end)
has no file until its rebuild installs the files written for it. The newest file of all is the one the
writer may still fill, so maintenance never picks it.
"""

from __future__ import annotations

from typing import Callable

from mqstore.errors import NotFound, invariant

from . import files as F
from .paging import MAX_TIME_MS
from .stats import RebuildRange


class FileTable:
    """Not thread-safe: IndexStore holds its lock around every use (``IndexStore.files()``)."""

    def __init__(self, handles: dict[int, F.Handle] | None = None, damaged: dict[int, int] | None = None):
        self._handles: dict[int, F.Handle] = dict(handles or {})
        self._damaged: dict[int, int] = dict(damaged or {})   # start -> end physical offset
        self._rebuilding: dict[int, list[F.UnsealedHandle]] = {}  # range start -> files written for it

    # ---- reading -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._handles)

    def offsets(self) -> list[int]:
        """First physical offsets (names) of the files, oldest first."""
        return sorted(self._handles)

    def get(self, first_phy_offset: int) -> F.Handle | None:
        return self._handles.get(first_phy_offset)

    def newest_first(self) -> list[F.Handle]:
        return [self._handles[f] for f in sorted(self._handles, reverse=True)]

    def infos(self) -> list[F.FileInfo]:
        return [h.info() for h in self._handles.values()]

    def oldest_matching(self, predicate: Callable[[F.Handle], bool]) -> F.Handle | None:
        """The oldest file for which ``predicate`` holds, never the newest (the writer's)."""
        newest = max(self._handles, default=None)
        for first in sorted(self._handles):
            if first != newest and predicate(self._handles[first]):
                return self._handles[first]
        return None

    def damaged_end(self, start: int) -> int:
        """End of the quarantined range starting at ``start``; NotFound if there is none."""
        end = self._damaged.get(start)
        if end is None:
            raise NotFound(f"no index range needing rebuild starts at physical offset {start}")
        return end

    def rebuild_ranges(self) -> list[RebuildRange]:
        """Ranges to re-feed from the log, oldest first (empty ranges need nothing)."""
        return [self._rebuild_range(s, e) for s, e in sorted(self._damaged.items()) if e > s]

    def blocking_range(self, begin_ms: int, end_ms: int, before_phy: int | None) -> RebuildRange | None:
        """A range still to be rebuilt whose store times overlap [begin_ms, end_ms] (below ``before_phy``)."""
        for start, end in self._damaged.items():
            if end > start and (before_phy is None or start < before_phy):
                rng = self._rebuild_range(start, end)
                if rng.begin_timestamp_ms <= end_ms and begin_ms <= rng.end_timestamp_ms:
                    return rng
        return None

    def _rebuild_range(self, start: int, end: int) -> RebuildRange:
        """The store time bounds are the healthy neighbours' (a damaged file's header is not trusted)."""
        before = [h.info() for f, h in self._handles.items() if f < start and h.info().entries]
        after = [h.info() for f, h in self._handles.items() if f >= end and h.info().entries]
        begin_ms = max((i.end_timestamp_ms for i in before), default=0)
        end_ms = min((i.begin_timestamp_ms for i in after), default=MAX_TIME_MS)
        return RebuildRange(start, end, begin_ms, end_ms)

    # ---- changing ------------------------------------------------------------------------------------
    def add(self, handle: F.Handle) -> None:
        invariant(handle.first_phy_offset not in self._handles,
                  f"index file {handle.first_phy_offset} is in the table already")
        self._handles[handle.first_phy_offset] = handle

    def replace(self, old: F.Handle, new: F.Handle) -> None:
        """Put ``new`` where ``old`` is (a conversion or a tier move); the caller retires ``old``."""
        invariant(self._handles.get(old.first_phy_offset) is old,
                  f"index file {old.first_phy_offset} changed during maintenance")
        self._handles[old.first_phy_offset] = new

    def remove_before(self, log_min_physical_offset: int) -> tuple[list[F.Handle], list[tuple[int, int]]]:
        """Retention: take out the files whose end is below the log's minimum, oldest first, never the
        newest, stopping at the first file still needed; and the quarantined ranges the log no longer
        holds. The caller retires and deletes what comes back."""
        newest = max(self._handles, default=None)
        victims = []
        for first in sorted(self._handles):
            if first == newest or self._handles[first].info().end_phy_offset >= log_min_physical_offset:
                break
            victims.append(self._handles.pop(first))
        expired = [(s, e) for s, e in self._damaged.items() if e <= log_min_physical_offset]
        for start, _ in expired:
            del self._damaged[start]
        return victims, expired

    def add_rebuild_file(self, range_start: int, handle: F.UnsealedHandle) -> None:
        self._rebuilding.setdefault(range_start, []).append(handle)

    def rebuild_files(self, range_start: int) -> list[F.UnsealedHandle]:
        return list(self._rebuilding.get(range_start, ()))

    def install_rebuilt(self, range_start: int) -> list[F.UnsealedHandle]:
        """The rebuild of the range is on disk: its files join the table and the range is closed."""
        self.damaged_end(range_start)
        installed = self._rebuilding.pop(range_start, [])
        for handle in installed:
            self._handles[handle.first_phy_offset] = handle
        del self._damaged[range_start]
        return installed

    def take_all(self) -> list[F.Handle]:
        """Empty the table (the store is closing); the caller retires what comes back."""
        taken = [*self._handles.values(), *(h for files in self._rebuilding.values() for h in files)]
        self._handles.clear()
        self._rebuilding.clear()
        return taken
