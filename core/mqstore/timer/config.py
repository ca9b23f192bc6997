"""Configuration of the timer (delayed delivery; frozen, validated, built once in the commit log's main())."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.errors import InvalidArgument

DAY_MS = 86_400_000


@dataclass(frozen=True)
class TimerConfig:
    # The one limit on how far ahead a message may be due (from the store's clock when it is appended);
    # above it an append is INVALID_ARGUMENT naming this limit. RocketMQ: 1 day at the proxy, 3 at the broker.
    timer_max_delay_ms: int = 3 * DAY_MS
    # The width of a wheel slot. Delivery is never early; lateness stays under one precision while the timer
    # keeps up (a slot's units are delivered one by one at their own time, not at the slot's end).
    timer_precision_ms: int = 1_000
    # Slots of the wheel file (32 bytes each): the wheel spans slots x precision (2 days at 1 s); a message
    # due later is parked and re-appended to the timer topic when the wheel reaches it (a roll).
    timer_wheel_slots: int = 172_800
    # How often the timer log, the wheel and the checkpoint are fsynced and replaced.
    timer_checkpoint_interval_ms: int = 1_000

    def __post_init__(self) -> None:
        for name in ("timer_max_delay_ms", "timer_precision_ms", "timer_wheel_slots", "timer_checkpoint_interval_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if not 10 <= self.timer_precision_ms <= 60_000:
            raise InvalidArgument(f"timer_precision_ms must lie in 10..60000, not {self.timer_precision_ms}")
        if self.timer_wheel_slots < 8:
            raise InvalidArgument(f"timer_wheel_slots must be at least 8, not {self.timer_wheel_slots}")

    @property
    def span_ms(self) -> int:
        return self.timer_wheel_slots * self.timer_precision_ms
