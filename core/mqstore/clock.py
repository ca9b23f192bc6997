"""Time is injected: domain code asks a Clock, tests pass a FakeClock and never sleep."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_s(self) -> float: ...


class SystemClock:
    """Wall clock for store timestamps, monotonic clock for timeouts. Thread-safe."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when a test calls advance(). Thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self._lock = threading.Lock()
        self._now_ms = start_ms
        self._mono_s = 1000.0

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def monotonic_s(self) -> float:
        with self._lock:
            return self._mono_s

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now_ms += ms
            self._mono_s += ms / 1000.0
