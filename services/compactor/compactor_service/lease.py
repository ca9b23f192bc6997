"""Active and standby compactors (``--etcd-endpoints``): which instance runs rounds.

Every instance follows the commit log into its own compaction logs and answers reads; only the one holding
the key ``<etcd-prefix>/active`` on its etcd lease runs rounds (background ones, Compact, Spark jobs). A
standby answers Compact with UNAVAILABLE naming the active, so a client given every instance
(mqstore_rpc.endpoints.Failover) goes on to it.

Thread ``compactor-lease`` (a Duty, every ttl/4): renew this instance's lease (grant one when it has none or
it lapsed), read the key; absent: put it on the lease with one compare-and-set transaction (key still
absent), so one instance wins. The holder is active until the renewal's send time + ttl - the commit log's
fence margin (mqstore.replication.controller.fence_margin_s): it stops starting rounds before etcd can let the
key lapse, so two instances never start rounds at once. A round already running when the lease is lost
ends on this instance's own logs (each instance's logs are its own: nothing of it reaches the other).

Why no round is applied twice and the new active resumes from what is recorded: a round is installed on the
instance's own logs together with its cleaned offset (mqstore.compaction.rounds: all or nothing), so the
new active's first round starts from the cleaned offset its own logs record; a round cut by kill -9 was
never installed (its staging is discarded at start). On stop the lease is revoked, so the standby takes
over at once instead of after the TTL.

Thread-safe: ``active()`` and ``holder()`` read state replaced under ``_lock``.
"""

from __future__ import annotations

import json
import threading
import time

import structlog
from mqstore.background import Duty
from mqstore.errors import MqStoreError, Unavailable
from mqstore.replication.controller import Coordination, fence_margin_s

log = structlog.get_logger("compactor_service.lease")
ACTIVE_KEY = "active"


class RoundLease(Duty):
    def __init__(self, coordination: Coordination, prefix: str, instance_id: str, ttl_s: int):
        super().__init__("compactor-lease", interval_s=ttl_s / 4, backoff_max_s=ttl_s / 4)
        self.coordination, self.instance_id, self.ttl_s = coordination, instance_id, ttl_s
        self.key = f"{prefix.rstrip('/')}/{ACTIVE_KEY}"
        self._lock = threading.Lock()
        self._lease = 0
        self._mine = False
        self._valid_until = 0.0
        self._holder = ""

    def active(self) -> bool:
        """Whether this instance may start a round now."""
        with self._lock:
            return self._mine and time.monotonic() < self._valid_until

    def holder(self) -> str:
        """The active instance's id as last read ("" when none was)."""
        with self._lock:
            return self._holder

    def step(self) -> None:
        sent = time.monotonic()
        if not self._lease:
            self._lease = self.coordination.grant_lease(self.ttl_s)
        elif self.coordination.keep_alive(self._lease) <= 0:
            self._lease = 0
            self._set(False, "", 0.0)
            self.wake()  # a new lease on the next step, at once
            return
        current = self.coordination.get(self.key)
        value = json.loads(current.value) if current.value else None
        if value is None:
            mine = json.dumps({"instance": self.instance_id, "lease": self._lease}).encode()
            if self.coordination.commit({self.key: 0}, {self.key: (mine, self._lease)}):
                value = {"instance": self.instance_id, "lease": self._lease}
            else:
                value = json.loads(self.coordination.get(self.key).value or b"{}") or {}
        is_mine = value.get("instance") == self.instance_id and value.get("lease") == self._lease
        self._set(is_mine, value.get("instance", ""), sent + self.ttl_s - fence_margin_s(self.ttl_s))

    def _set(self, mine: bool, holder: str, valid_until: float) -> None:
        with self._lock:
            if mine != self._mine:
                log.info("compactor.active" if mine else "compactor.standby", instance=self.instance_id,
                         active=holder)
            self._mine, self._holder, self._valid_until = mine, holder, valid_until

    def on_stop(self) -> None:
        with self._lock:
            self._mine = False

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop renewing, then revoke the lease (once the thread has ended: no step grants another after it),
        so the standby takes over now instead of after the TTL."""
        ended = super().stop(timeout_s)
        lease, self._lease = self._lease, 0
        if ended and lease:
            try:
                self.coordination.revoke_lease(lease)
            except MqStoreError:
                pass  # etcd away: the lease lapses by itself
        return ended

    def not_active(self) -> Unavailable:
        holder = self.holder()
        return Unavailable(f"this compactor ({self.instance_id}) is a standby: rounds run on the active one"
                           f" ({holder or 'none elected yet'}); ask it, or give the client every instance")
