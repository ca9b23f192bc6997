"""Configuration of the index storage: one frozen, validated dataclass, built once in main()."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from mqstore.errors import InvalidArgument

DEFAULT_MAX_NUM = 64
MAX_MAX_NUM = 10_000


@dataclass(frozen=True)
class IndexConfig:
    """Sizes of one unsealed file (RocketMQ's defaults: 5,000,000 slots, 20,000,000 entries, 420 MB),
    query limits, and the background duties. Tests use tiny sizes."""

    data_dir: pathlib.Path
    slot_count: int = 5_000_000
    entry_count: int = 20_000_000
    max_keys_per_message: int = 256
    max_scan_entries: int = 16_384          # per file per query; compact run read <= 256 KiB
    default_max_num: int = DEFAULT_MAX_NUM
    max_max_num: int = MAX_MAX_NUM
    tier_min_age_ms: int = 0                 # compact files whose end time is older move to the tier
    checkpoint_interval_ms: int = 1_000     # apply() flushes and writes the checkpoint this often
    maintenance_interval_ms: int = 10_000
    maintenance_retry_ms: int = 10_000       # after a failed round (RocketMQ retries after 10 s)
    max_files: int = 100_000                 # a cap on file creation (RocketMQ #7539)

    def __post_init__(self) -> None:
        if self.slot_count < 1:
            raise InvalidArgument(f"slot_count must be at least 1, not {self.slot_count}")
        if self.max_keys_per_message < 1:
            raise InvalidArgument("max_keys_per_message must be at least 1")
        if self.entry_count <= self.max_keys_per_message:
            raise InvalidArgument(
                f"entry_count {self.entry_count} must exceed max_keys_per_message "
                f"{self.max_keys_per_message}, so every message fits in one empty file")
        if not 1 <= self.default_max_num <= self.max_max_num:
            raise InvalidArgument("need 1 <= default_max_num <= max_max_num")
        for name in ("max_scan_entries", "checkpoint_interval_ms", "maintenance_interval_ms", "maintenance_retry_ms",
                     "max_files"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.tier_min_age_ms < 0:
            raise InvalidArgument("tier_min_age_ms must be >= 0")

    @property
    def index_dir(self) -> pathlib.Path:
        return self.data_dir / "index"
