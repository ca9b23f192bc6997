"""Counters and the stats snapshot of the index storage."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RebuildRange:
    """Physical offsets [start, end) whose index must be re-fed from the commit log. The store time
    bounds are those of the healthy neighbours (the damaged file's own header is not trusted)."""

    start_physical_offset: int
    end_physical_offset: int
    begin_timestamp_ms: int
    end_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class IndexStats:
    files_unsealed: int
    files_compact_local: int
    files_compact_tier: int
    entries: int
    next_physical_offset: int | None         # every record below it is indexed (resume point); None: nothing yet
    checkpoint_physical_offset: int | None   # ... and durable (last checkpoint written); None: none written
    indexed_end_physical_offset: int | None  # physical offset of the last message indexed, None if none
    needs_rebuild: tuple[RebuildRange, ...]
    queries: int
    query_reads_total: int
    last_query_reads: int
    max_reads_per_file: int
    records_applied: int
    records_skipped: int
    keys_dropped: int
    healthy: bool
    last_error: str

    @property
    def reads_per_query(self) -> float:
        return self.query_reads_total / self.queries if self.queries else 0.0


class Counters:
    """Monotonic counters. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queries = 0
        self.query_reads_total = 0
        self.last_query_reads = 0
        self.max_reads_per_file = 0
        self.records_applied = 0
        self.records_skipped = 0
        self.keys_dropped = 0

    def query_done(self, reads: int, max_reads_per_file: int) -> None:
        with self._lock:
            self.queries += 1
            self.query_reads_total += reads
            self.last_query_reads = reads
            self.max_reads_per_file = max(self.max_reads_per_file, max_reads_per_file)

    def applied(self, applied: int, skipped: int, dropped: int) -> None:
        with self._lock:
            self.records_applied += applied
            self.records_skipped += skipped
            self.keys_dropped += dropped
