"""Retention holds: followers whose data cannot be rebuilt (the compactor) hold back the commit log's
retention below their position.

A follower names itself in its Tail request (``hold_retention_as``); the stream's start offset is its
hold, refreshed at every frame of the stream. Retention then deletes no segment that ends above the
lowest hold. A hold may have a floor, below which it keeps nothing: the compactor's (named
:data:`COMPACTOR`) protects the records of COMPACTION topics only, so the store keeps the log for it
from max(its hold, lowest start_physical_offset of the COMPACTION topics), and not at all while there is
no COMPACTION topic (MessageStore.delete_expired_segments). So a deleted topic's hold goes with it: a
compactor away while its topics were deleted keeps no log for them, and meets a gap that it may skip
(compactor_service.projection: the gap can hold no record it needs). Other holds (the Transaction
service's) have no floor.

A follower that disappears for ever must not keep the log for ever: a hold lapses when its
follower has not had a Tail open for ``retention_hold_max_ms`` (StoreConfig, 7 days by default; then
``retention.hold_lapsed`` is logged, and the follower meets a gap when it comes back, which it reports
instead of skipping).
"""

from __future__ import annotations

import threading

import structlog

log = structlog.get_logger("mqstore.retention")
COMPACTOR = "compactor"  # the compactor's hold (TailRequest.hold_retention_as): compaction data only


class RetentionHolds:
    """Thread-safe (``_lock``): Tail streams hold, the maintenance duty reads."""

    def __init__(self, max_hold_ms: int):
        self.max_hold_ms = max_hold_ms
        self._lock = threading.Lock()
        self._holds: dict[str, tuple[int, int]] = {}  # follower -> (physical offset, last refreshed ms)

    def hold(self, follower: str, physical_offset: int, now_ms: int) -> None:
        with self._lock:
            self._holds[follower] = (physical_offset, now_ms)

    def low(self, now_ms: int, floors: dict[str, int | None] | None = None) -> int | None:
        """The lowest live hold (None: nothing holds); lapsed holds are dropped. ``floors``: follower ->
        the offset below which its hold keeps nothing (None: it keeps nothing at all)."""
        floors = floors or {}
        with self._lock:
            for name, (offset, at) in list(self._holds.items()):
                if now_ms - at > self.max_hold_ms:
                    del self._holds[name]
                    log.warning("retention.hold_lapsed", follower=name, physical_offset=offset,
                                idle_ms=now_ms - at, why="no Tail from it for longer than retention_hold_max_ms")
            held = []
            for name, (offset, _) in self._holds.items():
                if name not in floors:
                    held.append(offset)
                elif floors[name] is not None:
                    held.append(max(offset, floors[name]))
            return min(held, default=None)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return dict(self._holds)
