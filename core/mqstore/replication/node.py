"""The replication role of one CommitLog node, and the gate every write of its store passes.

Roles: LEADER (takes writes, serves replication streams), REPLICA (copies a leader; refuses writes with
NotLeader naming the leader), CANDIDATE (no leader known yet: refuses writes with NotLeader and an empty
address). A static group (``replica_of``) has a fixed leader; with a controller (etcd) the role follows
the election (mqstore.replication.controller).

Each leadership starts an epoch: the new leader adds (epoch, its log end) to its epoch file before it
takes the first write. A leader whose lease may have lapsed is *fenced*: it refuses every write and
acknowledges no SYNC append (``lease_valid_until_s`` is set by the controller from each keep-alive, a
margin before the lease can expire in etcd, so the old leader stops before a new one can be elected).

Thread-safety: role changes take ``_lock``; the gate methods read immutable snapshots without it.
"""

from __future__ import annotations

import pathlib
import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import waits
from mqstore.errors import MqStoreError, NotLeader, NotWritten, Unavailable
from mqstore.replication import epochs
from mqstore.replication.config import SYNC, ReplicationConfig
from mqstore.replication.isr import InSyncSet

log = structlog.get_logger()

LEADER = "LEADER"
REPLICA = "REPLICA"
CANDIDATE = "CANDIDATE"


@dataclass(frozen=True, slots=True)
class Leadership:
    role: str
    epoch: int
    leader_id: str
    leader_address: str


class LogGrowth:
    """Wakes replication streams when the leader's log grows: a stream answered on an event loop, or one
    whose handler thread runs :meth:`wait` by mqstore.waits.blocking. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._waiters: list[waits.ThreadWaiter | waits.LoopWaiter] = []

    def grew(self) -> None:
        with self._lock:
            self._version += 1
            woken, self._waiters = self._waiters, []
        if woken:
            waits.wake(woken)

    def version(self) -> int:
        return self._version

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Until the log grows past version ``seen``, or ``timeout_s``: a waiter (mqstore.waits.waiter) is
        awaited; on a thread it blocks there (a replica's stream between chunks: its handler thread does not
        count)."""
        waiter = waits.waiter()
        with self._lock:
            if self._version != seen:
                return
            self._waiters.append(waiter)
        try:
            await waiter.wait(timeout_s)
        finally:
            with self._lock:
                if waiter in self._waiters:  # timed out or cancelled: not woken
                    self._waiters.remove(waiter)


class ReplicationNode:
    def __init__(self, config: ReplicationConfig, clock, epoch_path: pathlib.Path, *, log_end: Callable[[], int],
                 flush_sync: bool, monotonic: Callable[[], float] | None = None):
        self.config = config
        self.clock = clock
        self.epoch_path = epoch_path
        self.log_end = log_end
        self.history = epochs.load(epoch_path)
        self.growth = LogGrowth()
        self.in_sync = InSyncSet(config, clock, log_end, flush_sync)
        self._monotonic = monotonic or clock.monotonic_s
        self._lock = threading.Lock()
        # Held by the replica follower while it changes the log; taken by become_leader, so that the epoch
        # starts where the copied bytes end and no copied byte follows it.
        self.apply_lock = threading.Lock()
        self._leadership = Leadership(CANDIDATE, self.history.last_epoch, "", "")
        self.lease_valid_until_s: float | None = None  # None: no lease (static group): never fenced
        self.handing_over_to = ""  # a switchover in progress: writes are refused meanwhile
        self.on_promote: Callable[[], None] = lambda: None  # the store's: queue offsets from its log
        self._leader_heard_s = self._monotonic()  # a replica's last message from its leader (heartbeats too)

    # ---- role ---------------------------------------------------------------------------------------
    @property
    def leadership(self) -> Leadership:
        return self._leadership

    @property
    def is_leader(self) -> bool:
        return self._leadership.role == LEADER

    def leading_epoch(self) -> int:
        """The epoch this node leads, 0 when it does not lead (pop consumption's leadership follows it)."""
        lead = self._leadership
        return lead.epoch if lead.role == LEADER else 0

    def become_leader(self, epoch: int, in_sync: frozenset[str]) -> None:
        """Take ``epoch`` (greater than any this node holds): record it at the log's end, durably,
        before the first write of the epoch."""
        with self.apply_lock, self._lock:
            if epoch < self.history.last_epoch:
                raise Unavailable(f"cannot lead epoch {epoch}: this node holds epoch {self.history.last_epoch}")
            self.on_promote()
            self.history = self.history.with_entry(epoch, self.log_end())
            epochs.save(self.epoch_path, self.history)
            self.in_sync.reset(in_sync)
            self._leadership = Leadership(LEADER, epoch, self.config.node_id, self.config.advertised_address)
        log.info("replication.leader", node=self.config.node_id, epoch=epoch, start_offset=self.log_end(),
                 in_sync=sorted(in_sync))

    def become_replica(self, leader_id: str, leader_address: str, epoch: int) -> None:
        with self._lock:
            was = self._leadership
            self._leadership = Leadership(REPLICA if leader_address else CANDIDATE, epoch, leader_id, leader_address)
            if (was.leader_id, was.leader_address) != (leader_id, leader_address):
                self._leader_heard_s = self._monotonic()  # a new leader: silent only from now on
            if was.role == LEADER:
                self.in_sync.close(f"this node stopped leading epoch {was.epoch}")
        if was.role != self._leadership.role or was.leader_id != leader_id:
            log.info("replication.follow", node=self.config.node_id, leader=leader_id, address=leader_address,
                     epoch=epoch)

    def heard_from_leader(self) -> None:
        """The replica follower got a message (data or heartbeat) from the leader it follows."""
        self._leader_heard_s = self._monotonic()

    def leader_silent_s(self) -> float:
        """Seconds since the leader this node follows last sent anything (since it was named, at most)."""
        return self._monotonic() - self._leader_heard_s

    def record_epochs(self, leader_history: epochs.EpochHistory, held_end: int) -> None:
        """A replica adopts its leader's history for the bytes it holds (durably, before applying them)."""
        wanted = leader_history.below(held_end)
        if wanted != self.history:
            self.history = wanted
            epochs.save(self.epoch_path, wanted)

    def truncated(self, offset: int) -> None:
        self.history = self.history.cut_at(offset)
        epochs.save(self.epoch_path, self.history)

    # ---- fencing ------------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        until = self.lease_valid_until_s
        return self.is_leader and until is not None and self._monotonic() >= until

    # ---- the gate of writes -------------------------------------------------------------------------
    def check_writable(self) -> None:
        lead = self._leadership
        if lead.role != LEADER:
            where = f"the leader is {lead.leader_id} at {lead.leader_address}" if lead.leader_address else \
                "no leader is known yet (an election is running); retry shortly"
            raise NotLeader(f"this commit log ({self.config.node_id}) is a replica and takes no writes: {where}",
                            leader_address=lead.leader_address)
        if self.handing_over_to:
            raise NotWritten(f"this commit log ({self.config.node_id}) is handing its leadership over to "
                             f"{self.handing_over_to}; retry shortly (the new leader takes writes)")
        if self.fenced:
            raise NotWritten(f"this commit log ({self.config.node_id}) may have lost its leadership lease of "
                             f"epoch {lead.epoch}: it takes no writes until it is confirmed or a new leader is "
                             f"elected; retry shortly")

    def sync_wanted(self, requested: str | None) -> bool:
        return (requested or self.config.default_replication) == SYNC

    def begin_append(self, sync: bool) -> None:
        self.check_writable()
        if sync:
            self.in_sync.require_enough()

    def committed_offset(self) -> int:
        """What readers may see: on the leader, what every in-sync node holds; elsewhere nothing new (a
        replica makes its leader's committed offset visible itself, store.replica_view.visible_to)."""
        return self.in_sync.committed() if self.is_leader else 0

    async def finish_append(self, end: int, sync: bool) -> tuple[int, int]:
        """(copies holding [.., end), epoch) once the append may be acknowledged: the in-sync replicas'
        acknowledgement is awaited (on a thread, mqstore.waits.blocking blocks for it)."""
        self.growth.grew()
        epoch = self._leadership.epoch
        if not sync:
            return self.in_sync.copies(end), epoch
        return self._still_leading(end, epoch, await self.in_sync.wait(end))

    def _still_leading(self, end: int, epoch: int, copies: int) -> tuple[int, int]:
        if self.fenced or self._leadership.epoch != epoch:
            raise Unavailable(f"records up to physical offset {end} were replicated, but this node's leadership of "
                              f"epoch {epoch} may have lapsed meanwhile: not acknowledged; a retry may duplicate")
        return copies, epoch


class SingleNode:
    """The gate of a store without replication: always the leader of epoch 0, one copy."""

    def check_writable(self) -> None:
        return None

    def sync_wanted(self, requested: str | None) -> bool:
        return False

    def begin_append(self, sync: bool) -> None:
        return None

    async def finish_append(self, end: int, sync: bool) -> tuple[int, int]:
        return 1, 0

    def committed_offset(self) -> int:
        return 1 << 62  # one copy: everything written is committed


def takes_writes(gate: ReplicationNode | SingleNode) -> bool:
    """Whether the node behind ``gate`` takes writes now (a replica, a candidate or a fenced leader does not):
    retention's rewrite of live offsets and the SQL offsets' import ask it before appending."""
    try:
        gate.check_writable()
    except MqStoreError:
        return False
    return True
