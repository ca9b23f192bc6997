"""Frozen, validated configuration, one dataclass per component. Built once in main(); domain code
never reads the environment."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

from mqstore import defaults
from mqstore.errors import InvalidArgument
from mqstore.format import record

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

FLUSH_ASYNC = "ASYNC"
FLUSH_SYNC = "SYNC"


def max_write_bytes(max_batch_body_bytes: int, max_batch_messages: int) -> int:
    per_message = record.MAX_FIXED_OVERHEAD + record.MAX_TOPIC_BYTES_V1 + record.MAX_PROPERTIES_BYTES
    return max_batch_body_bytes + max_batch_messages * per_message


@dataclass(frozen=True)
class StoreConfig:
    data_dir: pathlib.Path
    segment_size_bytes: int = 1 * GiB
    cq_entries_per_file: int = 300_000
    flush_mode: str = FLUSH_ASYNC
    flush_interval_ms: int = 500
    flush_min_dirty_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5_000
    sync_flush_delay_us: int = 2000       # SYNC: the longest an fsync waits for more appends to share it (log/flush.py)
    cq_flush_interval_ms: int = 1_000
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    max_batch_messages: int = 1000
    max_batch_body_bytes: int = 4 * MiB
    max_stream_messages: int = 100_000
    retention_ms: int = 72 * 3600 * 1000
    retention_hold_max_ms: int = 7 * 24 * 3600 * 1000  # the longest a hold outlives its last refresh (retention_holds)
    retention_hold_grace_ms: int = 60_000  # a user's hold ends this long after its stream closes (retention_holds)
    clean_interval_ms: int = 10_000
    disk_max_used_ratio: float = 0.90
    store_host: str = defaults.HOST
    store_port: int = defaults.COMMITLOG_PORT
    metadata_url: str = ""  # "" = SQLite file <data_dir>/metadata.db
    default_queue_count: int = 4
    checkpoint_interval_ms: int = 1_000
    max_long_poll_waiters: int = 32  # Pulls waiting at once; keep below the server's handler threads
    preallocate_segments: bool = True
    warm_ahead_bytes: int = 64 * MiB  # page cache kept ahead of the write position; 0 = off
    page_cache_keep_bytes: int = 1024 * MiB  # flushed log kept in the page cache (mqstore.log.warmer); 0 = off
    recheck_segments: int = 3  # start re-checks (CRC included) at least this many last segments, as RocketMQ
    check_all: bool = False    # start re-checks every record of the log
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.flush_mode not in (FLUSH_ASYNC, FLUSH_SYNC):
            raise InvalidArgument(f"flush_mode must be ASYNC or SYNC, not {self.flush_mode!r}")
        if self.segment_size_bytes < 4 * KiB or self.segment_size_bytes % 4096:
            raise InvalidArgument(
                f"segment_size_bytes must be a multiple of 4096 and at least 4 KiB, not {self.segment_size_bytes}")
        if self.page_cache_keep_bytes < 0:
            raise InvalidArgument(f"page_cache_keep_bytes must be 0 (off) or more, not {self.page_cache_keep_bytes}")
        if self.cq_entries_per_file < 2:
            raise InvalidArgument("cq_entries_per_file must be at least 2")
        if not 0 <= self.sync_flush_delay_us <= 100_000:
            raise InvalidArgument(f"sync_flush_delay_us must be in [0, 100000] (at most 100 ms), not "
                                  f"{self.sync_flush_delay_us}")
        if self.retention_hold_grace_ms < 0:
            raise InvalidArgument(f"retention_hold_grace_ms must be 0 or more, not {self.retention_hold_grace_ms}")
        if self.recheck_segments < 0:
            raise InvalidArgument(f"recheck_segments must be 0 or more, not {self.recheck_segments}")
        if not 0 < self.disk_max_used_ratio <= 1:
            raise InvalidArgument("disk_max_used_ratio must be in (0, 1]")
        for name in ("flush_interval_ms", "sync_flush_timeout_ms", "max_body_bytes", "max_batch_messages",
                     "retention_ms", "retention_hold_max_ms", "clean_interval_ms", "checkpoint_interval_ms",
                     "default_queue_count",
                     "max_long_poll_waiters"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")

    @property
    def max_write_bytes(self) -> int:
        """The most one append copies into the log: every body, plus the largest record overhead
        (topic and properties) for every message. Recovery uses it to bound a torn tail."""
        return max_write_bytes(self.max_batch_body_bytes, self.max_batch_messages)

    @property
    def commitlog_dir(self) -> pathlib.Path:
        return self.data_dir / "commitlog"

    @property
    def consumequeue_dir(self) -> pathlib.Path:
        return self.data_dir / "consumequeue"

    @property
    def metadata_url_resolved(self) -> str:
        return self.metadata_url or f"sqlite:///{self.data_dir / 'metadata.db'}"
