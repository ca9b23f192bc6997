"""Configuration of pop consumption (frozen, validated; built once in the commit log's main())."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.errors import InvalidArgument


@dataclass(frozen=True)
class PopConfig:
    # In-flight messages one group may hold on one topic (its retry topic included); a receive with less
    # room gets a smaller batch, one with none RESOURCE_EXHAUSTED. Bounds the memory of the in-flight set.
    pop_max_in_flight: int = 20_000
    # In flight over every group and topic (the same rule); about 300 bytes of memory each.
    pop_max_in_flight_total: int = 500_000
    # How often pop offsets and the revive checkpoint are stored (one record of the offsets topic).
    pop_flush_interval_ms: int = 1_000
    # Expired messages copied to retry or dead-letter topics per step of the revive duty; also the most a
    # crash inside a step can copy twice (the copies are written before their ACK record).
    pop_revive_batch: int = 256

    def __post_init__(self) -> None:
        for name in ("pop_max_in_flight", "pop_max_in_flight_total", "pop_flush_interval_ms", "pop_revive_batch"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.pop_max_in_flight > self.pop_max_in_flight_total:
            raise InvalidArgument(f"pop_max_in_flight ({self.pop_max_in_flight}) must not exceed "
                                  f"pop_max_in_flight_total ({self.pop_max_in_flight_total})")
