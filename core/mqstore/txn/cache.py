"""The half-message cache (seed 003; RocketMQ never merged one): commit and rollback read a half here
first and the commit log only on a miss.

Rules: filled after a half is written; insertion order (LRU by insertion: a hit removes the entry, so
an entry is never "used" and kept); the eldest evicted on insert while over ``max_entries`` or
``max_bytes`` of bodies (a half bigger than the whole budget is not cached); empty after a restart.
Hits, misses and evictions are counted in the service's metrics registry (mqstore.metrics), which Stats
reads too.

Thread-safe: one lock around the OrderedDict; the counters are thread-safe themselves.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

from mqstore.metrics import Registry

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int


class HalfCache(Generic[V]):
    def __init__(self, max_entries: int, max_bytes: int, metrics: Registry | None = None):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: collections.OrderedDict[int, tuple[V, int]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        metrics = metrics or Registry()
        self._hits = metrics.counter("mqstore_txn_cache_hits_total", "commits and rollbacks that found their halves "
                                     "in the cache")
        self._misses = metrics.counter("mqstore_txn_cache_misses_total", "... that read them from the commit log")
        self._evictions = metrics.counter("mqstore_txn_cache_evictions_total", "halves evicted (eldest first)")
        metrics.gauge_fn("mqstore_txn_cache_hit_ratio", "hits / (hits + misses) since start", self.hit_ratio)
        metrics.gauge_fn("mqstore_txn_cache_entries", "half messages in the cache", lambda: len(self._items))

    def put(self, physical_offset: int, value: V, size_bytes: int) -> None:
        if self.max_entries == 0 or size_bytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(physical_offset, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[physical_offset] = (value, size_bytes)
            self._bytes += size_bytes
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, evicted_bytes) = self._items.popitem(last=False)
                self._bytes -= evicted_bytes
                self._evictions.inc()

    def take(self, physical_offset: int) -> V | None:
        """The cached half, removed (a hit removes the entry); None on a miss."""
        with self._lock:
            item = self._items.pop(physical_offset, None)
            if item is None:
                self._misses.inc()
                return None
            self._hits.inc()
            self._bytes -= item[1]
            return item[0]

    def discard(self, physical_offset: int) -> None:
        """Drop without counting (a transaction resolved by another path)."""
        with self._lock:
            item = self._items.pop(physical_offset, None)
            if item is not None:
                self._bytes -= item[1]

    def keys(self) -> list[int]:
        with self._lock:
            return list(self._items)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(len(self._items), self._bytes, int(self._hits.value), int(self._misses.value),
                              int(self._evictions.value))

    def hit_ratio(self) -> float:
        hits, misses = self._hits.value, self._misses.value
        return hits / (hits + misses) if hits + misses else 0.0
