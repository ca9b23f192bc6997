"""Counters of pop consumption since the process started (Stats). Thread-safe: one lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, slots=True)
class PopCounts:
    received: int = 0          # deliveries handed out
    acked: int = 0
    ack_failures: int = 0      # ack entries that were not OK
    changed_invisible: int = 0
    revived: int = 0           # expired messages copied to a retry topic
    dead_lettered: int = 0     # messages moved to a DLQ
    filtered: int = 0          # passed over by a tag or SQL92 filter
    damaged_skipped: int = 0   # records that failed their checks, passed over
    lost: int = 0              # expired messages whose record was gone or damaged
    replayed_records: int = 0  # revive-log records read at start
    bad_records: int = 0       # revive-log records that did not decode (skipped)


_NAMES = frozenset(f.name for f in fields(PopCounts))


class PopCounters:
    def __init__(self):
        self._lock = threading.Lock()
        self._counts = PopCounts()

    def add(self, **deltas: int) -> None:
        unknown = set(deltas) - _NAMES
        if unknown:
            raise TypeError(f"unknown pop counters {sorted(unknown)}")
        with self._lock:
            current = self._counts
            self._counts = replace(current, **{name: getattr(current, name) + delta for name, delta in deltas.items()})

    def snapshot(self) -> PopCounts:
        with self._lock:
            return self._counts
