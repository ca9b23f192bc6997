"""Active and standby Transaction services through an etcd lease (``--etcd-endpoints``; issue 34).

Every instance runs this duty ("txn-election"). One key, ``<etcd_prefix>/active`` = ``{"id", "address"}``,
is put on the holder's lease with a compare-and-set (absent before), as the commit log's controller does
for its leader key (mqstore.replication.controller: the same Coordination and fence margin). Each step
renews this instance's lease and reads the key:

* it names another instance: this one is the standby. Its table follows the log as at start but never
  becomes ``ready`` (TxnTable.standby), so Prepare, Commit, Rollback and CheckBack answer UNAVAILABLE
  naming the active one, and it writes nothing (no check-back, no OP record);
* no key: campaign; the winner reads the log's end and the table becomes ready only once its follower
  has applied the log up to it (TxnTable.activate): everything the old active acknowledged is in the log
  before that end (it stopped writing before its lease could lapse, and this key is only free after), so
  a Commit it answered is seen as committed, a Rollback as rolled back, before this one decides anything;
* it names this instance: go on; writes are allowed until the renewal's send time + TTL - the fence
  margin (:meth:`check_active`, called before every append: RemoteTxnLog's gate). A renewal that fails
  leaves the instance fenced once that time passes; one that says the lease is gone, or a key naming
  another instance, makes it a standby again (TxnTable.deactivate).

A clean stop revokes the lease, so the standby takes over at its next step instead of after the TTL.
Thread-safety: ``step`` runs on the duty's thread; ``check_active`` on any (it reads floats and a str).
"""

from __future__ import annotations

import json
import uuid
from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import NotWritten, Unavailable
from mqstore.replication.controller import Coordination, fence_margin_s
from mqstore.txn.table import TxnTable

log = structlog.get_logger("mqstore.txn.election")


class TxnElection(Duty):
    def __init__(self, coordination: Coordination, prefix: str, address: str, table: TxnTable,
                 log_end: Callable[[], int], clock: Clock, *, ttl_s: int = 5, interval_ms: int = 200):
        super().__init__("txn-election", interval_s=interval_ms / 1000, backoff_initial_s=0.05,
                         backoff_max_s=interval_ms / 1000)
        self.coordination, self.address, self.table = coordination, address, table
        self.key = f"{prefix.rstrip('/')}/active"
        self.id = uuid.uuid4().hex
        self._log_end, self._clock, self._ttl_s = log_end, clock, ttl_s
        self._lease = 0
        self._valid_until_s = 0.0
        self.active = False
        self.active_address = ""  # the holder as last read ("" = none known)
        table.standby = self._standby_text()

    def _standby_text(self) -> str:
        where = f"the active one is {self.active_address}" if self.active_address else "no active one is known yet"
        return (f"standby: this Transaction service ({self.address}) is the standby of an etcd group ({self.key}); "
                f"{where}: send Prepare, Commit, Rollback and CheckBack there")

    def check_active(self) -> None:
        """Raises NotWritten (an Unavailable: refused before doing anything) unless this instance holds the key and
        its lease cannot have lapsed yet."""
        if not self.active:
            raise NotWritten(self._standby_text())
        if self._clock.monotonic_s() >= self._valid_until_s:
            raise NotWritten(f"fenced: this Transaction service ({self.address}) could not renew its etcd lease in "
                             f"time and takes no writes until it does; another instance may be taking over")

    # ---- the duty -----------------------------------------------------------------------------------
    def step(self) -> None:
        if not self._lease:
            self._lease = self.coordination.grant_lease(self._ttl_s)
        sent = self._clock.monotonic_s()
        ttl = self.coordination.keep_alive(self._lease)
        if ttl <= 0:
            self._lease = 0
            self._step_down("its etcd lease expired")
            return
        self._valid_until_s = sent + ttl - fence_margin_s(self._ttl_s)
        current = self.coordination.get(self.key)
        info = json.loads(current.value) if current.value else None
        if info is not None and info["id"] == self.id:
            if not self.active:
                self._activate()
            return
        if info is not None:
            if info["address"] == self.address:  # an earlier life of this instance (restarted within the TTL)
                self.coordination.commit({self.key: current.mod_revision}, {}, (self.key,))
                return
            self._step_down(f"{info['address']} is active")
            if self.active_address != info["address"]:
                self.active_address = info["address"]
                self.table.standby = self._standby_text()
                log.info("txn.standby", address=self.address, active=self.active_address)
            return
        self._step_down("the active key is gone")
        value = json.dumps({"id": self.id, "address": self.address}).encode()
        if self.coordination.commit({self.key: 0}, {self.key: (value, self._lease)}):
            self._activate()

    def _activate(self) -> None:
        end = self._log_end()  # the old active wrote nothing after its fence time, before the key was free
        self.active, self.active_address = True, self.address
        log.warning("txn.elected", address=self.address, catch_up_to=end)
        self.table.activate(end)

    def _step_down(self, why: str) -> None:
        if self.active:
            self.active = False
            log.warning("txn.stepped_down", address=self.address, why=why)
        if not self.table.standby:
            self.active_address = ""
            self.table.deactivate(self._standby_text())

    def on_stop(self) -> None:
        if self._lease and self.active:
            self.active = False
            self.table.deactivate(self._standby_text())
            try:
                self.coordination.revoke_lease(self._lease)
            except Unavailable as exc:
                log.warning("txn.revoke_failed", error=str(exc), effect="the standby takes over after the lease's TTL")
