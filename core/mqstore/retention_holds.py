"""Retention holds: followers whose data cannot be rebuilt (the compactor) hold back the commit log's
retention below their position.

A follower names itself in its Tail request (``hold_retention_as``); the stream's start offset is its
hold, refreshed at every frame of the stream. Retention then deletes no segment that ends above the
lowest hold. A hold may have a floor, below which it keeps nothing: the compactor's (named
:data:`COMPACTOR`) protects the records of COMPACTION topics only, so the store keeps the log for it
from max(its hold, lowest start_physical_offset of the COMPACTION topics), and not at all while there is
no COMPACTION topic (mqstore.store_retention). So a deleted topic's hold goes with it: a
compactor away while its topics were deleted keeps no log for them, and meets a gap that it may skip
(mqstore.compaction.projection: the gap can hold no record it needs). Other holds (the Transaction
service's) have no floor.

Who may hold, and for how long (a hold stops retention of the whole log, so it is an operator's tool):

* naming a hold needs ADMIN on the cluster (mqstore_rpc.permissions, Tail); the services name theirs
  as the internal identity ``service``, which has it;
* a hold lives while a stream naming it is open, refreshed at each frame; an open stream that has not
  refreshed it for ``retention_hold_max_ms`` (StoreConfig, 7 days by default: a stream stuck on a peer
  that reads nothing) lapses;
* once its last stream closes, a hold ends after a grace period: ``retention_hold_grace_ms`` (60 s by
  default: long enough for a follower to reconnect) for a hold named by any user, and
  ``retention_hold_max_ms`` for a *durable* one: named by the internal identity (or with authentication
  off, where every caller is trusted). Why the difference: the compactor's and the Transaction
  service's holds protect data that cannot be rebuilt (compaction logs, open transactions), and a
  restart or an upgrade of that service must not let retention delete what it has not yet read; an
  administrator's hold (a backup, a replay) is over once its stream ends. The grace is never longer
  than ``retention_hold_max_ms``, which therefore caps how long any hold keeps the log after its
  stream stops.

A lapsed hold logs ``retention.hold_lapsed`` (its follower then meets a gap when it comes back, which it
reports instead of skipping). Holds live in the commit log's memory: a commit log restart forgets them
until their followers reconnect. :meth:`RetentionHolds.listing` is what CommitLog/ListRetentionHolds
answers (`mqstore retention holds`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog

log = structlog.get_logger("mqstore.retention")
COMPACTOR = "compactor"  # the compactor's hold (TailRequest.hold_retention_as): compaction data only


def instance_hold(instance_id: str) -> str:
    """The hold of one of several compactors (``--etcd-endpoints``): ``compactor-<id>``, so two do not share
    one hold (the lower one's position would be lost when the other's stream refreshes it); the same floor
    as :data:`COMPACTOR`. A dead instance's hold ends like any durable hold: ``retention_hold_max_ms`` after
    its stream closed."""
    return f"{COMPACTOR}-{instance_id}"


def is_compactor(name: str) -> bool:
    """Whether a hold is a compactor's (its floor: the COMPACTION topics' lowest start)."""
    return name == COMPACTOR or name.startswith(COMPACTOR + "-")


@dataclass(frozen=True)
class HoldInfo:
    """One hold as listed: ``lapses_at_ms`` is when it ends unless a stream refreshes it (open) or
    reopens it (closed)."""

    name: str
    physical_offset: int
    open_streams: int
    durable: bool
    refreshed_ms: int
    closed_ms: int       # when its last stream closed; 0 while one is open
    lapses_at_ms: int


class _Hold:
    __slots__ = ("offset", "refreshed_ms", "open_streams", "closed_ms", "durable")

    def __init__(self, offset: int, now_ms: int, durable: bool):
        self.offset, self.refreshed_ms, self.durable = offset, now_ms, durable
        self.open_streams, self.closed_ms = 0, 0


class RetentionHolds:
    """Thread-safe (``_lock``): Tail streams open, refresh and close holds; the maintenance duty and
    the listing read them."""

    def __init__(self, max_hold_ms: int, grace_ms: int = 60_000):
        self.max_hold_ms = max_hold_ms
        self.grace_ms = min(grace_ms, max_hold_ms)
        self._lock = threading.Lock()
        self._holds: dict[str, _Hold] = {}

    def open(self, follower: str, physical_offset: int, now_ms: int, *, durable: bool) -> None:
        """A stream naming ``follower`` starts at ``physical_offset``. Streams of one name open at once
        hold from the lowest start, and the hold is durable when any of them is (an administrator's
        stream of the same name does not shorten a service's hold)."""
        with self._lock:
            hold = self._holds.get(follower)
            if hold is None:
                hold = self._holds[follower] = _Hold(physical_offset, now_ms, durable)
            elif hold.open_streams:
                hold.offset = min(hold.offset, physical_offset)
                hold.durable = hold.durable or durable
            else:
                hold.offset, hold.durable = physical_offset, durable
            hold.open_streams += 1
            hold.refreshed_ms, hold.closed_ms = now_ms, 0

    def refresh(self, follower: str, now_ms: int) -> None:
        """A frame of an open stream (a lapsed hold stays lapsed until a new stream opens it)."""
        with self._lock:
            if (hold := self._holds.get(follower)) is not None and hold.open_streams:
                hold.refreshed_ms = now_ms

    def close(self, follower: str, now_ms: int) -> None:
        """A stream naming ``follower`` ended; the grace starts when the last one does."""
        with self._lock:
            hold = self._holds.get(follower)
            if hold is None or not hold.open_streams:
                return
            hold.open_streams -= 1
            if not hold.open_streams:
                hold.refreshed_ms = hold.closed_ms = now_ms

    def _lapses_at(self, hold: _Hold) -> int:
        if hold.open_streams:
            return hold.refreshed_ms + self.max_hold_ms
        return hold.closed_ms + (self.max_hold_ms if hold.durable else self.grace_ms)

    def _drop_lapsed(self, now_ms: int) -> None:
        for name, hold in list(self._holds.items()):
            if now_ms > self._lapses_at(hold):
                del self._holds[name]
                if hold.open_streams:
                    why = "its open stream has not refreshed it for longer than retention_hold_max_ms"
                elif hold.durable:
                    why = "its stream closed longer than retention_hold_max_ms ago"
                else:
                    why = "its stream closed longer than retention_hold_grace_ms ago"
                log.warning("retention.hold_lapsed", follower=name, physical_offset=hold.offset,
                            idle_ms=now_ms - hold.refreshed_ms, open_streams=hold.open_streams,
                            durable=hold.durable, why=why)

    def low(self, now_ms: int, floors: dict[str, int | None] | None = None) -> int | None:
        """The lowest live hold (None: nothing holds); lapsed holds are dropped. ``floors``: follower ->
        the offset below which its hold keeps nothing (None: it keeps nothing at all)."""
        floors = floors or {}
        with self._lock:
            self._drop_lapsed(now_ms)
            held = []
            for name, hold in self._holds.items():
                if name not in floors:
                    held.append(hold.offset)
                elif floors[name] is not None:
                    held.append(max(hold.offset, floors[name]))
            return min(held, default=None)

    def names(self) -> list[str]:
        """The names of the holds, lapsed ones included."""
        with self._lock:
            return list(self._holds)

    def listing(self, now_ms: int) -> list[HoldInfo]:
        """The live holds by name (lapsed ones are dropped first)."""
        with self._lock:
            self._drop_lapsed(now_ms)
            return [HoldInfo(name, h.offset, h.open_streams, h.durable, h.refreshed_ms, h.closed_ms,
                             self._lapses_at(h)) for name, h in sorted(self._holds.items())]

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """follower -> (physical offset, last refreshed ms), lapsed ones included (tests)."""
        with self._lock:
            return {name: (h.offset, h.refreshed_ms) for name, h in self._holds.items()}
