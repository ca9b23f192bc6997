"""Index files on disk: names, and one handle type per layout with a common query method.

A file is named by the physical offset of the first message it indexes, 20 digits, so names sort in
log order, never collide (two files created in the same millisecond would, with RocketMQ's
creation-time names), come out the same when the index is rebuilt from the log, and give the range a
file covers even when its header is destroyed: [its name, the next file's name).

  name                      what
  ------------------------- ---------------------------------------------------------------------
  <offset>.idx              unsealed IndexFile (mqstore.format.index_file); the newest is written
  <offset>.cidx             sealed file in the compact layout (mqstore.format.compact_index)
  <offset>.cidx.tmp         compact file being written
  <offset>.rebuild          unsealed file being rebuilt for a quarantined range
  <start>-<end>.damaged     a quarantined file (or an empty marker for a tier file); the range
                            [start, end) needs rebuilding from the commit log
"""

from __future__ import annotations

import abc
import pathlib
import threading
from dataclasses import dataclass

from mqstore.errors import invariant
from mqstore.format import compact_index
from mqstore.format.index_file import IndexFile, ScanResult

UNSEALED = "unsealed"
COMPACT = "compact"
LOCAL = "local"
TIER = "tier"
IDX_SUFFIX = ".idx"
CIDX_SUFFIX = ".cidx"
REBUILD_SUFFIX = ".rebuild"
DAMAGED_SUFFIX = ".damaged"
DIGITS = 20


def idx_name(first_phy_offset: int) -> str:
    return f"{first_phy_offset:0{DIGITS}d}{IDX_SUFFIX}"


def cidx_name(first_phy_offset: int) -> str:
    return f"{first_phy_offset:0{DIGITS}d}{CIDX_SUFFIX}"


def rebuild_name(first_phy_offset: int) -> str:
    return f"{first_phy_offset:0{DIGITS}d}{REBUILD_SUFFIX}"


def damaged_name(start_phy_offset: int, end_phy_offset: int) -> str:
    return f"{start_phy_offset:0{DIGITS}d}-{end_phy_offset:0{DIGITS}d}{DAMAGED_SUFFIX}"


def parse_name(name: str, suffix: str) -> int:
    """First physical offset of ``<20 digits><suffix>``; ValueError for anything else."""
    stem = name[:-len(suffix)] if name.endswith(suffix) else ""
    if len(stem) != DIGITS or not stem.isdigit():
        raise ValueError(f"not an index file name with suffix {suffix}: {name!r}")
    return int(stem)


def parse_damaged(name: str) -> tuple[int, int]:
    stem = name[:-len(DAMAGED_SUFFIX)] if name.endswith(DAMAGED_SUFFIX) else ""
    start, sep, end = stem.partition("-")
    if not sep or len(start) != DIGITS or len(end) != DIGITS or not (start + end).isdigit():
        raise ValueError(f"not a quarantine name: {name!r}")
    return int(start), int(end)


@dataclass(frozen=True, slots=True)
class FileInfo:
    first_phy_offset: int
    layout: str
    tier: str
    begin_timestamp_ms: int
    end_timestamp_ms: int
    begin_phy_offset: int
    end_phy_offset: int
    entries: int


class _Handle(abc.ABC):
    """Base of the per-layout handles. Pins keep a file open while queries read it; ``retire``
    closes it once the last query lets go. Thread-safe."""

    layout = ""

    def __init__(self, first_phy_offset: int, tier: str):
        self.first_phy_offset = first_phy_offset
        self.tier = tier
        self._pin_lock = threading.Lock()
        self._pins = 0
        self._retired = False

    def pin(self) -> None:
        with self._pin_lock:
            invariant(not self._retired, f"index file {self.first_phy_offset} pinned after retire")
            self._pins += 1

    def unpin(self) -> None:
        with self._pin_lock:
            self._pins -= 1
            close = self._retired and self._pins == 0
        if close:
            self._close()

    def retire(self) -> None:
        with self._pin_lock:
            self._retired = True
            close = self._pins == 0
        if close:
            self._close()

    @abc.abstractmethod
    def _close(self) -> None:
        """Release what the handle holds (its mapping or reader); called once, when retired and unpinned."""


class UnsealedHandle(_Handle):
    """An IndexFile. The store's lock is held for puts; queries of the writable file also hold it,
    queries of sealed files do not (sealed files are read-only)."""

    layout = UNSEALED

    def __init__(self, first_phy_offset: int, file: IndexFile, path: pathlib.Path):
        super().__init__(first_phy_offset, LOCAL)
        self.file = file
        self.path = path
        self.sealed = False

    def info(self) -> FileInfo:
        h = self.file.header
        return FileInfo(self.first_phy_offset, self.layout, self.tier, h.begin_timestamp_ms,
                        h.end_timestamp_ms, h.begin_phy_offset, h.end_phy_offset, h.entries)

    def query(self, hash_: int, begin_ms: int, end_ms: int, max_num: int, *, max_scan_entries: int,
              before_phy_offset: int | None, start_entry: int, start_ordinal: int) -> ScanResult:
        return self.file.query(hash_, begin_ms, end_ms, max_num, max_scan_entries=max_scan_entries,
                               before_phy_offset=before_phy_offset, start_entry=start_entry,
                               start_ordinal=start_ordinal)

    def _close(self) -> None:
        self.file.close()


class CompactHandle(_Handle):
    """A compact file behind a RangeReader (local file or tier). Immutable, so thread-safe."""

    layout = COMPACT

    def __init__(self, first_phy_offset: int, reader, header: compact_index.CompactHeader, tier: str,
                 path: pathlib.Path | None = None):
        super().__init__(first_phy_offset, tier)
        self.reader = reader
        self.header = header
        self.path = path  # local path, None on the tier
        h = header  # immutable file: its info is computed once, not on every query
        self._info = FileInfo(first_phy_offset, self.layout, tier, h.begin_timestamp_ms, h.end_timestamp_ms,
                              h.begin_phy_offset, h.end_phy_offset, h.entry_count)

    def info(self) -> FileInfo:
        return self._info

    def query(self, hash_: int, begin_ms: int, end_ms: int, max_num: int, *, max_scan_entries: int,
              before_phy_offset: int | None, start_entry: int, start_ordinal: int) -> ScanResult:
        del start_entry  # entry numbers exist only in the unsealed layout; the ordinal is the same
        return compact_index.query(self.reader, self.header, hash_, begin_ms, end_ms, max_num,
                                   max_scan_entries=max_scan_entries,
                                   before_phy_offset=before_phy_offset, start_ordinal=start_ordinal)

    def _close(self) -> None:
        self.reader.close()


Handle = UnsealedHandle | CompactHandle


def open_compact_local(path: pathlib.Path, first_phy_offset: int) -> CompactHandle:
    reader = compact_index.FileRangeReader(path)
    try:
        header = compact_index.read_header(reader)
    except Exception:
        reader.close()
        raise
    return CompactHandle(first_phy_offset, reader, header, LOCAL, path)
