"""Automatic failover through etcd: every node of a group runs this duty ("replication-controller").

Keys under ``etcd_prefix``:

  key        value (JSON unless said)                       lease            written by
  ---------- ---------------------------------------------- ---------------- --------------------------------
  leader     {"node_id", "address", "epoch"}                 the leader's     the election's transaction
  epoch      the last epoch handed out (decimal text)        none             the election's transaction
  isr        {"epoch", "leader", "members"}: the published   none             the election; then the leader,
             in-sync set, the leader included                                 only while the leader key is its
  handover   {"target", "until_ms"}: a switchover's choice    none             TransferLeadership (switchover.py)

Each step renews this node's lease (granting one when it has none) and reads the leader key:

* the key names another node: follow it (the replica follower reconnects there);
* it names this node in its epoch: go on leading; the node may acknowledge until ``lease_valid_until_s``
  = the time the renewal was *sent* + its TTL - ``fence margin`` (etcd counts the TTL from when it *got*
  it, so the node stops before etcd can let the key lapse: no two leaders acknowledge at once);
* no leader: if this node is in the published in-sync set (or ``unclean_election`` is on, or no set has
  ever been published: a new group), campaign with one compare-and-set transaction: the leader key is
  still absent, and ``epoch`` and ``isr`` are unchanged since read; it puts the leader key (on this
  node's lease), epoch + 1, and the set without the old leader. The winner records the new epoch in its
  epoch file and starts taking writes. Losers see the winner on their next step.

Timing (defaults): a 2 s lease renewed every ``controller_interval_ms`` (200 ms, 5 renewals before the
fence time, which is 1 s after a renewal was sent; the config refuses an interval leaving fewer than 4).
A node that follows no leader, or whose leader sent nothing on the replication stream for three
heartbeats (``node.leader_silent_s``: dead or frozen), reads the leader key every ``fast_poll_ms``
(50 ms) instead, renewing its own lease at the usual pace: it campaigns within 50 ms of the old lease
lapsing in etcd (etcd expires a lease 2 s after its last renewal, plus up to its 0.5 s expiry check), and
the other replica follows the winner as fast. No node shortens another's lease: only etcd's expiry ends it.

A leader that fails to renew keeps leading until its fence time, refusing writes after it (fenced);
a renewal that says the lease is gone, or a leader key naming another node, makes it a candidate.
The in-sync set is published by the leader with a transaction that also checks the leader key's
revision is still the one it wrote (mqstore.replication.isr: the set an election reads).

Thread-safety: ``step`` runs on the duty's thread; ``publish_isr`` on the replication-isr duty's thread
(it only reads ``_leader_revision``, an int replaced whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Protocol

import structlog

from mqstore.background import Duty
from mqstore.errors import FailedPrecondition, Unavailable
from mqstore.replication.config import fence_margin_s
from mqstore.replication.node import ReplicationNode

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class Versioned:
    value: bytes | None
    mod_revision: int  # 0 when the key is absent


class Coordination(Protocol):
    """etcd, as the controller uses it (mqstore_rpc.etcd_client; a fake in tests). Thread-safe;
    every call raises Unavailable when etcd cannot be reached."""

    def get(self, key: str) -> Versioned: ...

    def commit(self, expected: dict[str, int], puts: dict[str, tuple[bytes, int]],
               deletes: tuple[str, ...] = ()) -> int: ...

    def grant_lease(self, ttl_s: int) -> int: ...

    def keep_alive(self, lease_id: int) -> int: ...

    def revoke_lease(self, lease_id: int) -> None: ...


def _json(value: bytes | None) -> dict | None:
    return json.loads(value) if value else None


class Controller(Duty):
    def __init__(self, node: ReplicationNode, coordination: Coordination, *,
                 on_leader_change: Callable[[], None] = lambda: None):
        config = node.config
        super().__init__("replication-controller", interval_s=config.controller_interval_ms / 1000,
                         backoff_initial_s=0.05, backoff_max_s=config.controller_interval_ms / 1000)
        self.node = node
        self.coordination = coordination
        self.on_leader_change = on_leader_change
        prefix = config.etcd_prefix.rstrip("/")
        self.leader_key, self.epoch_key = f"{prefix}/leader", f"{prefix}/epoch"
        self.isr_key, self.handover_key = f"{prefix}/isr", f"{prefix}/handover"
        self._lease = 0
        self._leader_revision = 0
        self._renewed_s = -1e9  # when the last renewal was sent (monotonic)
        # A replica whose leader sent nothing for this long (3 missed heartbeats) suspects it is dead or frozen
        self.suspect_after_s = max(0.5, 3 * config.replication_heartbeat_ms / 1000)

    def pause_s(self) -> float:
        """The next step after ``controller_interval_ms``, or after ``fast_poll_ms`` while this node follows no
        leader or its leader is silent: the leader key is then read that often, so a node campaigns within
        ``fast_poll_ms`` of the old leader's lease lapsing in etcd (its lease is renewed at the usual pace)."""
        node = self.node
        urgent = not node.is_leader and (not node.leadership.leader_address or
                                         node.leader_silent_s() > self.suspect_after_s)
        return node.config.fast_poll_ms / 1000 if urgent else self.interval_s

    # ---- the duty -----------------------------------------------------------------------------------
    def step(self) -> None:
        self._renew()
        leader = self.coordination.get(self.leader_key)
        if leader.value:
            self._observe(leader)
        else:
            self._campaign()

    def _renew(self) -> None:
        monotonic = self.node.clock.monotonic_s
        if not self._lease:
            self._lease = self.coordination.grant_lease(self.node.config.lease_ttl_s)
        elif monotonic() - self._renewed_s < self.interval_s * 0.9:
            return  # a fast poll between two renewals
        sent = monotonic()
        ttl = self.coordination.keep_alive(self._lease)
        self._renewed_s = sent
        if ttl <= 0:
            log.warning("controller.lease_lost", node=self.node.config.node_id, lease=self._lease)
            self._lease = 0
            self._step_down("its etcd lease expired")
            return
        self.node.lease_valid_until_s = sent + ttl - fence_margin_s(self.node.config.lease_ttl_s)

    def _observe(self, leader: Versioned) -> None:
        info = _json(leader.value)
        me = self.node.config.node_id
        lead = self.node.leadership
        if info["node_id"] == me:
            if self.node.is_leader and info["epoch"] == lead.epoch:
                self._leader_revision = leader.mod_revision
                return
            # A key of an earlier life of this node (a restart within the lease's TTL): let it go now.
            self.coordination.commit({self.leader_key: leader.mod_revision}, {}, (self.leader_key,))
            return
        if self.node.is_leader:
            self._step_down(f"{info['node_id']} leads epoch {info['epoch']}")
        if (lead.leader_id, lead.epoch, lead.leader_address) != (info["node_id"], info["epoch"], info["address"]):
            self.node.become_replica(info["node_id"], info["address"], info["epoch"])
            self.on_leader_change()

    def _campaign(self) -> None:
        node, me = self.node, self.node.config.node_id
        if node.is_leader:
            self._step_down("its leader key is gone (lease expired)")
        if node.leadership.leader_address:  # the leader we followed is gone: stop copying from it
            node.become_replica("", "", node.leadership.epoch)
            self.on_leader_change()
        if not self._lease:
            return
        handover = _json(self.coordination.get(self.handover_key).value)
        if handover and handover["target"] != me and handover["until_ms"] > node.clock.now_ms():
            return  # a switchover chose another node
        isr, epoch = self.coordination.get(self.isr_key), self.coordination.get(self.epoch_key)
        published = _json(isr.value)
        if published is not None and me not in published["members"] and not node.config.unclean_election:
            return  # out of sync: never elected unless an operator allows an unclean election
        new_epoch = max(int(epoch.value or 0), node.history.last_epoch) + 1
        members = set(published["members"]) - {published["leader"]} if published else set()
        members.add(me)
        revision = self.coordination.commit(
            {self.leader_key: 0, self.epoch_key: epoch.mod_revision, self.isr_key: isr.mod_revision},
            {self.leader_key: (json.dumps({"node_id": me, "address": node.config.advertised_address,
                                           "epoch": new_epoch}).encode(), self._lease),
             self.epoch_key: (str(new_epoch).encode(), 0),
             self.isr_key: (json.dumps({"epoch": new_epoch, "leader": me, "members": sorted(members)}).encode(), 0)},
            (self.handover_key,) if handover else ())
        if not revision:
            return  # another node won; the next step follows it
        self._leader_revision = revision
        unclean = published is not None and me not in published["members"]
        log.warning("controller.elected", node=me, epoch=new_epoch, in_sync=sorted(members), unclean=unclean)
        self.on_leader_change()
        node.become_leader(new_epoch, frozenset(members))

    def _step_down(self, why: str) -> None:
        if self.node.is_leader:
            lead = self.node.leadership
            log.warning("controller.stepped_down", node=self.node.config.node_id, epoch=lead.epoch, why=why)
            self.node.become_replica("", "", lead.epoch)
            self.on_leader_change()

    def on_stop(self) -> None:
        """A clean stop gives the leadership up at once (the lease's keys go with it) instead of after
        the TTL: a switchover by restart."""
        if self._lease and self.node.is_leader:
            self.node.become_replica("", "", self.node.leadership.epoch)
            try:
                self.coordination.revoke_lease(self._lease)
            except Unavailable as exc:
                log.warning("controller.revoke_failed", error=str(exc), effect="the lease lapses after its TTL")

    # ---- switchover -------------------------------------------------------------------------------
    def transfer(self, target: str, timeout_s: float) -> int:
        """Hand the leadership to ``target`` (see replication.proto's TransferLeadership); the log end it
        held. Runs on a handler thread while the controller's duty goes on."""
        node = self.node
        node.check_writable()
        if target not in node.in_sync.published() or target == node.config.node_id:
            raise FailedPrecondition(f"target_node_id {target!r} is not an in-sync replica of this leader "
                                     f"(in sync: {sorted(node.in_sync.published())}); pick one of them")
        node.handing_over_to = target
        try:
            deadline = node.clock.monotonic_s() + timeout_s
            # No write starts meanwhile; one already past the gate may still land, so the end is read again.
            while node.in_sync.written_by(target) < (end := node.log_end()):
                if node.clock.monotonic_s() >= deadline:
                    raise Unavailable(f"{target} did not catch up with this leader's end {end} within "
                                      f"{timeout_s:g} s; the leadership stays here and writes resume")
                node.in_sync.wait_progress(0.05)
            handover = json.dumps({"target": target, "until_ms": node.clock.now_ms() +
                                   2000 * node.config.lease_ttl_s}).encode()
            if not self.coordination.commit({self.leader_key: self._leader_revision},
                                            {self.handover_key: (handover, 0)}, (self.leader_key,)):
                raise Unavailable("this node's leader key changed meanwhile: it is no longer the leader")
            self._step_down(f"switchover to {target}")
            log.warning("controller.handed_over", node=node.config.node_id, target=target, at_offset=end)
            return end
        finally:
            node.handing_over_to = ""

    # ---- the in-sync set (InSyncSet.publish) --------------------------------------------------------
    def publish_isr(self, members: frozenset[str]) -> None:
        node = self.node
        lead = node.leadership
        if not node.is_leader or not self._leader_revision:
            raise Unavailable("not the leader: the in-sync set is not published")
        value = json.dumps({"epoch": lead.epoch, "leader": lead.leader_id, "members": sorted(members)}).encode()
        if not self.coordination.commit({self.leader_key: self._leader_revision}, {self.isr_key: (value, 0)}):
            raise Unavailable(f"the in-sync set was not published: this node's leader key of epoch {lead.epoch} "
                              f"changed (another node leads, or the lease lapsed)")
