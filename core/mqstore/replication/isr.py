"""The leader's view of its replicas: their progress, the in-sync set, and the waits of SYNC-replicated
appends (group-commit style, like the SYNC flush waiters of mqstore.log.flush).

A replica is *in sync* while it keeps up: its acknowledged offset is within ``isr_max_lag_bytes`` of
the leader's written end at least once every ``isr_max_lag_ms``, and its stream is connected. It joins
once it has caught up with the leader's end. A SYNC append is acknowledged once every in-sync replica
holds its bytes (flushed ones when the flush mode is SYNC) and the in-sync set, the leader included,
has at least ``min_insync_replicas`` members (Kafka's acks=all with min.insync.replicas; RocketMQ 5's
SyncStateSet).

The set an election may choose from is the *published* one (``publish``: the controller's compare-and-
set in etcd; a no-op without one). It must only name nodes holding every acknowledged byte, so:
  shrink  publish first, then stop waiting for the member (appends still wait for it meanwhile);
  grow    wait for the member at once, remember the leader's end W at that moment, and publish once the
          member has acknowledged W (everything acknowledged before it joined ends at or below W).

Only published members count toward ``min_insync_replicas`` (Kafka's KIP-841). A member that joined but
is not yet published is waited for, but an append it helped acknowledge would otherwise rest on a copy no
election may choose: with the published set at {leader}, losing the leader would leave no electable node
though a replica held every acknowledged byte. So while a replica is joining, a set published at
{leader} still refuses SYNC appends (NotEnoughReplicas) until the publication, one ``maintain`` later.
The published set is always a subset of the members (a shrink takes both at once, a grow adds to the
members first).

Thread-safety: every method may be called from any thread; state is guarded by ``_lock``. A waiting
append waits on an event of its own, kept in a heap by end offset: an acknowledgement that moves the
watermark sets exactly the events it satisfies (one Condition for all woke every waiting producer on
every acknowledgement, as the SYNC flush's once did); a change of the set wakes them all to re-check.
``publish`` runs outside the lock, only from :meth:`maintain` (the replication duty's thread). The watermark
is kept, computed again at each change of a member's offsets or of the members, so :meth:`committed` reads it
without the lock.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import waits
from mqstore.background import Duty
from mqstore.errors import NotEnoughReplicas, ReplicationTimeout
from mqstore.replication.config import ReplicationConfig

log = structlog.get_logger()


@dataclass
class Progress:
    replica_id: str
    address: str
    written_offset: int = 0
    flushed_offset: int = 0
    connected: bool = False      # its newest stream is open
    generation: int = 0          # its newest stream's (InSyncSet.connected): only that stream speaks for it
    last_ack_ms: int = 0
    last_ok_ms: int = 0          # last ack within isr_max_lag_bytes of the leader's end
    join_mark: int | None = None  # grow: publish once acknowledged up to here


@dataclass(frozen=True, slots=True)
class ProgressView:
    replica_id: str
    address: str
    written_offset: int
    flushed_offset: int
    in_sync: bool
    connected: bool
    lag_bytes: int
    last_ack_age_ms: int


class InSyncSet:
    def __init__(self, config: ReplicationConfig, clock, leader_end: Callable[[], int], flush_sync: bool,
                 publish: Callable[[frozenset[str]], None] | None = None):
        self.config = config
        self.clock = clock
        self.leader_end = leader_end
        self.flush_sync = flush_sync
        self.publish = publish or (lambda members: None)
        self.on_committed: Callable[[], None] = lambda: None  # the committed offset moved (ReplicaView.advance_visible)
        self.node_id = config.node_id
        self._lock = threading.Lock()
        self._advanced = threading.Condition(self._lock)
        self._progress: dict[str, Progress] = {}
        self._members: set[str] = {self.node_id}       # what SYNC appends wait for
        self._published: frozenset[str] = frozenset({self.node_id})
        self._watermark = 1 << 62  # _watermark_locked's value, kept by _rewatermark_locked at each change
        self._closed = ""
        self._waiters: list[tuple[int, int, waits.ThreadWaiter | waits.LoopWaiter]] = []  # heap of (end, seq, waiter)
        self._seq = itertools.count()
        self._generations = itertools.count(1)  # one per stream opened (connected), never reused
        self._peaks = [0, 0, 0]  # most SYNC appends waiting at once: this second's, the last one's; the second

    # ---- membership ---------------------------------------------------------------------------------
    def reset(self, members: frozenset[str]) -> None:
        """Start of a leadership: the published set as the election left it (this node included). What
        replicas acknowledged to an earlier leadership of this node counts for nothing: the log may have
        been cut back below it since (a divergence), so an append of this one would be acknowledged on
        bytes no replica holds; each replica's progress starts again from its first acknowledgement."""
        with self._lock:
            self._members = set(members) | {self.node_id}
            self._published = frozenset(self._members)
            for p in self._progress.values():
                p.written_offset = p.flushed_offset = 0
                p.join_mark = None
            now = self.clock.now_ms()
            for rid in self._members - {self.node_id}:
                p = self._progress.setdefault(rid, Progress(rid, ""))
                p.last_ok_ms = now  # a member that never connects leaves after isr_max_lag_ms
            self._rewatermark_locked()
            self._closed = ""
            self._wake_all_locked()

    def close(self, why: str) -> None:
        """Leadership ended: every waiting append fails (not acknowledged)."""
        with self._lock:
            self._closed = why
            self._wake_all_locked()

    def members(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._members)

    def published(self) -> frozenset[str]:
        with self._lock:
            return self._published

    def connected(self, replica_id: str, address: str, holds: int | None = None) -> int:
        """A stream of the replica opened; its generation, which its acknowledgements and its end carry
        (:meth:`on_ack`, :meth:`disconnected`). It supersedes the replica's earlier streams: a replica that
        reconnects opens its new stream before the leader has seen the old one's end, and what the old one
        still brings is ignored. ``holds``: where the replica's log ends after its handshake (the welcome's
        ``truncate_to``). Its progress is cut back to that: a replica that restarted after losing a tail it
        had acknowledged (written, not flushed, when the power went) holds only what its hello says, and its
        acknowledgements from before must not count (toward the watermark while it is still a member, toward
        the copies an append reports) until its first acknowledgement on this stream; one of them read only
        now, from the old stream (its reader runs until that stream's end), would raise it again."""
        with self._lock:
            p = self._progress.setdefault(replica_id, Progress(replica_id, address))
            p.address, p.connected = address, True
            p.generation = generation = next(self._generations)
            p.last_ack_ms = self.clock.now_ms()
            if holds is not None and (p.written_offset > holds or p.flushed_offset > holds):
                log.warning("isr.replica_holds_less", replica=replica_id, holds=holds,
                            acknowledged_written=p.written_offset, acknowledged_flushed=p.flushed_offset)
                p.written_offset, p.flushed_offset = min(p.written_offset, holds), min(p.flushed_offset, holds)
                self._rewatermark_locked()
            return generation

    def disconnected(self, replica_id: str, generation: int) -> None:
        """The replica's stream of ``generation`` ended. The replica is disconnected when that is its newest:
        the end of a superseded one (a sync server's handler sees it at its next heartbeat, after the
        replica reconnected) must not mark the new stream's replica disconnected; and once the newest has
        ended an older one still open brings nothing that counts, so the replica leaves the set at the next
        maintain() rather than after isr_max_lag_ms."""
        with self._lock:
            p = self._progress.get(replica_id)
            if p is not None and p.generation == generation:
                p.connected = False
                p.last_ok_ms = 0  # leaves the in-sync set at the next maintain()

    def on_ack(self, replica_id: str, written_offset: int, flushed_offset: int, generation: int) -> None:
        """An acknowledgement read from the replica's stream of ``generation``; ignored unless that is its
        newest (:meth:`connected`): an older stream's may be of bytes the replica has lost since."""
        end = self.leader_end()
        now = self.clock.now_ms()
        with self._lock:
            p = self._progress.get(replica_id)
            if p is None or p.generation != generation:
                return
            before = self._watermark
            p.written_offset, p.flushed_offset, p.last_ack_ms = written_offset, flushed_offset, now
            if end - written_offset <= self.config.isr_max_lag_bytes:
                p.last_ok_ms = now
            if replica_id not in self._members and p.connected and written_offset >= end:
                self._members.add(replica_id)
                # Read again now that appends wait for it: every append acknowledged without waiting for
                # it ends at or below this (the module docstring's W).
                p.join_mark = self.leader_end()
                log.info("isr.catching_up", replica=replica_id, offset=written_offset)
            watermark = self._rewatermark_locked()
            advanced = watermark != before
            if advanced:
                self._release_locked(watermark)
        if advanced:
            self.on_committed()

    def maintain(self) -> None:
        """Shrink the set by the replicas that lag, grow it by those that caught up (publishing each
        change as the module docstring says). Runs on the replication duty's thread."""
        now = self.clock.now_ms()
        with self._lock:
            lagging = {rid for rid in self._members - {self.node_id}
                       if now - self._progress[rid].last_ok_ms > self.config.isr_max_lag_ms
                       or not self._progress[rid].connected and self._progress[rid].last_ok_ms == 0}
            joined = {rid for rid in self._members - self._published - lagging
                      if self._offset(self._progress[rid]) >= (self._progress[rid].join_mark or 0)}
            target = frozenset((self._published & self._members) - lagging | joined)
        if target == self._published and not lagging:
            return
        if target != self._published:  # a member that joined only locally leaves without a publication
            self.publish(target)
        with self._lock:
            self._members -= lagging
            self._rewatermark_locked()
            self._published = target
            for rid in joined:
                self._progress[rid].join_mark = None
            self._wake_all_locked()
        if lagging:
            self.on_committed()  # a smaller set may hold more
        for rid in sorted(lagging):
            log.warning("isr.shrunk", replica=rid, in_sync=sorted(target))
        for rid in sorted(joined):
            log.info("isr.grew", replica=rid, in_sync=sorted(target))

    # ---- SYNC appends -------------------------------------------------------------------------------
    def require_enough(self) -> None:
        """Before a SYNC append is written: NotEnoughReplicas when too few copies are in sync."""
        with self._lock:
            if self._closed:
                raise ReplicationTimeout(self._closed)
            count, published = len(self._published), sorted(self._published)
            joining = sorted(self._members - self._published)
        if count < self.config.min_insync_replicas:
            raise NotEnoughReplicas(
                f"only {count} of the min_insync_replicas {self.config.min_insync_replicas} copies are in sync "
                f"(published in-sync set: {published}; joining: {joining or 'none'}); nothing was written. Retry "
                f"once a replica has caught up and been published (mqstore replication status), or append with "
                f"replication ASYNC")

    async def wait(self, end: int) -> int:
        """Until every in-sync replica holds [.., end); the number of copies holding it then. Awaits a
        waiter (mqstore.waits.waiter) that the acknowledgement wakes: on an event loop it suspends, run on a
        thread (mqstore.waits.blocking) it blocks there; many appends wait here at once, and the handler
        pool runs others meanwhile. ReplicationTimeout after sync_replication_timeout_ms, or when the set
        shrinks below the minimum."""
        deadline = self.clock.monotonic_s() + self.config.sync_replication_timeout_ms / 1000
        while True:
            waiter = waits.waiter()
            copies, left = self._ready_or_park(end, deadline, waiter)
            if copies is not None:
                return copies
            await waiter.wait(min(left, 0.5))

    def _ready_or_park(self, end: int, deadline: float, waiter) -> tuple[int | None, float]:
        """(copies, 0) once [.., end) may be acknowledged; else (None, seconds left), ``waiter`` parked
        until the watermark passes ``end`` or the set changes. ReplicationTimeout past ``deadline``."""
        with self._lock:
            copies = self._ready_locked(end)
            if copies is not None:
                return copies, 0.0
            left = deadline - self.clock.monotonic_s()
            if left <= 0:
                raise ReplicationTimeout(
                    f"records up to physical offset {end} are written on the leader but "
                    f"{self._copies_locked(end)} of the in-sync copies {sorted(self._members)} held them "
                    f"after sync_replication_timeout_ms {self.config.sync_replication_timeout_ms}: not "
                    f"acknowledged as replicated; they may survive or be cut by a failover, so a retry may "
                    f"duplicate them")
            heapq.heappush(self._waiters, (end, next(self._seq), waiter))
            self._note_peak_locked()
            return None, left

    def ready(self, end: int) -> int | None:
        """:meth:`wait`'s condition, without waiting: the copies holding [.., end) once it may be
        acknowledged, None while it may not yet; ReplicationTimeout when it never will."""
        with self._lock:
            return self._ready_locked(end)

    def _ready_locked(self, end: int) -> int | None:
        if self._closed:
            raise ReplicationTimeout(f"records up to physical offset {end} are written on this node but "
                                     f"were not acknowledged: {self._closed}; a retry may duplicate them")
        if len(self._published) < self.config.min_insync_replicas:
            raise ReplicationTimeout(
                f"records up to physical offset {end} are written on the leader, but the in-sync set "
                f"shrank to {sorted(self._published)}, below min_insync_replicas "
                f"{self.config.min_insync_replicas}: not acknowledged; a retry may duplicate them")
        if self._watermark_locked() < end:
            return None
        copies = self._copies_locked(end)
        if copies < self.config.min_insync_replicas:  # cannot happen (every member holds it): never ack so
            raise ReplicationTimeout(
                f"records up to physical offset {end} are held by {copies} copies, below min_insync_replicas "
                f"{self.config.min_insync_replicas}: not acknowledged; a retry may duplicate them")
        return copies

    def waiting(self) -> int:
        """How many SYNC appends wait for their replication (a replication stream's linger asks)."""
        with self._lock:
            return len(self._waiters)

    def waiting_and_peak(self) -> tuple[int, int]:
        """(SYNC appends waiting now, the most that waited at once this second or the last): how many
        producers a replication stream's linger may expect (mqstore.replication.leader)."""
        with self._lock:
            self._note_peak_locked()
            return len(self._waiters), max(self._peaks[0], self._peaks[1])

    def _note_peak_locked(self) -> None:
        second = int(self.clock.monotonic_s())
        peaks = self._peaks
        if second != peaks[2]:
            peaks[:] = [0, peaks[0] if second == peaks[2] + 1 else 0, second]
        peaks[0] = max(peaks[0], len(self._waiters))

    def written_by(self, replica_id: str) -> int:
        with self._lock:
            p = self._progress.get(replica_id)
            return p.written_offset if p is not None and p.connected else -1

    def wait_progress(self, timeout_s: float) -> None:
        """Until the next acknowledgement that moves the watermark (or ``timeout_s``)."""
        with self._lock:
            self._advanced.wait(timeout_s)

    def committed(self) -> int:
        """The high watermark: every in-sync node holds the log below it (the leader's end when alone)."""
        # Without the lock: one attribute's read (the watermark as the last change left it), as the lock
        # would give, and this runs ~3 times an append on the loop (the dispatch, each data message).
        return min(self.leader_end(), self._watermark)

    def _release_locked(self, watermark: int) -> None:
        waiters, woken = self._waiters, []
        while waiters and waiters[0][0] <= watermark:
            woken.append(heapq.heappop(waiters)[2])
        waits.wake(woken)
        self._advanced.notify_all()  # a switchover waiting for a replica's progress

    def _wake_all_locked(self) -> None:
        waits.wake([waiter for _, _, waiter in self._waiters])
        self._waiters.clear()
        self._advanced.notify_all()

    def copies(self, end: int) -> int:
        with self._lock:
            return self._copies_locked(end)

    def _offset(self, p: Progress) -> int:
        return p.flushed_offset if self.flush_sync else p.written_offset

    def _watermark_locked(self) -> int:
        """What every in-sync replica holds (the leader's own copy is the append path's business)."""
        return self._watermark

    def _rewatermark_locked(self) -> int:
        """:meth:`_watermark_locked` computed again: after every change of a member's offsets or of the
        members (it was computed at each look, ~7 times an append on the leader's loop)."""
        others = [self._offset(self._progress[rid]) for rid in self._members if rid != self.node_id]
        self._watermark = watermark = min(others) if others else 1 << 62
        return watermark

    def _copies_locked(self, end: int) -> int:
        """The leader and each replica that acknowledged [.., end): every member of the set (a member whose
        stream dropped since still holds what it acknowledged, and stays a member until ``maintain``) and
        any connected replica. Counting only the connected ones under-reported an acknowledged append
        whose replicas' streams dropped between its wake and its count (issue 34: replicas=1 with
        min_insync_replicas 2); counted so, an append acknowledged once the watermark passed its end has
        at least as many copies as the set has members, hence at least min_insync_replicas."""
        return 1 + sum(1 for rid, p in self._progress.items()
                       if rid != self.node_id and (p.connected or rid in self._members) and self._offset(p) >= end)

    # ---- state --------------------------------------------------------------------------------------
    def views(self) -> list[ProgressView]:
        end = self.leader_end()
        now = self.clock.now_ms()
        with self._lock:
            return [ProgressView(p.replica_id, p.address, p.written_offset, p.flushed_offset,
                                 p.replica_id in self._published, p.connected, max(0, end - p.written_offset),
                                 now - p.last_ack_ms if p.last_ack_ms else -1)
                    for p in sorted(self._progress.values(), key=lambda p: p.replica_id)]


class IsrKeeper(Duty):
    """Duty "replication-isr": on the leader, :meth:`InSyncSet.maintain` every ``interval_s``."""

    def __init__(self, in_sync: InSyncSet, is_leader: Callable[[], bool], interval_s: float = 0.1):
        super().__init__("replication-isr", interval_s=interval_s)
        self.in_sync = in_sync
        self.is_leader = is_leader

    def step(self) -> None:
        if self.is_leader():
            self.in_sync.maintain()
