"""What a round may do and when one is due: the settings, the triggers, tombstone retention, quarantine.

  trigger (checked per queue)          a round is due when
  ------------------------------------ -------------------------------------------------------------
  dirty ratio                          dirty / (clean + dirty) bytes of the sealed segments >=
                                       min_cleanable_dirty_ratio, for records older than min lag
  max compaction lag                   the oldest dirty record is older than max_compaction_lag_ms
                                       (the active segment is sealed for it when it holds such records)
  tombstone horizon                    a kept tombstone's seen-at + delete_retention_ms has passed
  on demand                            Compact (any dirty or expired record, whatever the ratio)

Records younger than min_compaction_lag_ms are never cleaned (a consumer may still want each value).
A queue whose round fails is quarantined: no round before ``backoff`` has passed (doubling from
quarantine_initial_ms to quarantine_max_ms); the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.errors import InvalidArgument

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class CompactionConfig:
    """Frozen, validated; every field is a flag of the Compactor."""

    segment_size_bytes: int = 64 << 20          # address space of one compaction log segment
    offset_map_memory_bytes: int = 64 << 20     # budget of a round's key map (offset_map.py)
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 7 * DAY_MS
    delete_retention_ms: int = DAY_MS           # a tombstone is kept this long after the round that first saw it
    quarantine_initial_ms: int = 1_000
    quarantine_max_ms: int = 600_000
    round_interval_ms: int = 15_000             # how often the background duty checks the triggers

    def __post_init__(self) -> None:
        if self.segment_size_bytes < 4096:
            raise InvalidArgument(f"segment_size_bytes must be at least 4096, not {self.segment_size_bytes}")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise InvalidArgument(f"min_cleanable_dirty_ratio must be in [0, 1], not {self.min_cleanable_dirty_ratio}")
        for name in ("min_compaction_lag_ms", "delete_retention_ms"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must not be negative, not {getattr(self, name)}")
        for name in ("max_compaction_lag_ms", "quarantine_initial_ms", "quarantine_max_ms",
                     "round_interval_ms", "offset_map_memory_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.max_compaction_lag_ms < self.min_compaction_lag_ms:
            raise InvalidArgument("max_compaction_lag_ms must not be below min_compaction_lag_ms")


def tombstone_expired(seen_ms: int, now_ms: int, retention_ms: int) -> bool:
    """Whether a tombstone first seen by a round at ``seen_ms`` (0: not seen yet) is past its retention."""
    return seen_ms > 0 and now_ms >= seen_ms + retention_ms


def due_reason(dirty_bytes: int, clean_bytes: int, oldest_dirty_ms: int | None, expired_tombstones: int,
               now_ms: int, config: CompactionConfig) -> str:
    """Why a background round is due ("" when none is)."""
    if expired_tombstones:
        return "tombstone_horizon"
    if oldest_dirty_ms is None:
        return ""
    if now_ms - oldest_dirty_ms >= config.max_compaction_lag_ms:
        return "max_compaction_lag"
    total = dirty_bytes + clean_bytes
    if total and dirty_bytes / total >= config.min_cleanable_dirty_ratio:
        return "dirty_ratio"
    return ""


class Quarantine:
    """Backoff of one queue's failing rounds. Not thread-safe: the owner's lock."""

    def __init__(self, config: CompactionConfig):
        self.config = config
        self.failures = 0
        self.until_ms = 0
        self.error = ""

    def failed(self, now_ms: int, error: str) -> None:
        self.failures += 1
        backoff = min(self.config.quarantine_max_ms, self.config.quarantine_initial_ms << min(self.failures - 1, 30))
        self.until_ms, self.error = now_ms + backoff, error

    def succeeded(self) -> None:
        self.failures, self.until_ms, self.error = 0, 0, ""

    def blocks(self, now_ms: int) -> bool:
        return self.failures > 0 and now_ms < self.until_ms
