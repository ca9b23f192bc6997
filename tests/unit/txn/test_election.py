"""mqstore.txn.election: active and standby Transaction services on one etcd lease key, over an in-memory
Coordination whose leases lapse on a FakeClock (the real etcd: tests/crash/test_txn_failover.py)."""

from __future__ import annotations

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import NotWritten, Unavailable
from mqstore.replication.controller import Versioned
from mqstore.txn.election import TxnElection
from mqstore.txn.table import TxnTable


class MemoryEtcd:
    """Keys with mod revisions, leases that lapse ``ttl`` after their last renewal (on ``clock``); ``down``
    makes every call raise Unavailable, as an unreachable etcd."""

    def __init__(self, clock: FakeClock):
        self.clock, self.down = clock, False
        self.revision, self.next_lease = 0, 0
        self.keys: dict[str, tuple[bytes, int, int]] = {}  # key -> value, mod revision, lease
        self.leases: dict[int, tuple[int, float]] = {}   # id -> ttl, expiry

    def _expire(self) -> None:
        if self.down:
            raise Unavailable("etcd is down")
        now = self.clock.monotonic_s()
        for lease, (_, until) in list(self.leases.items()):
            if until <= now:
                del self.leases[lease]
                self.keys = {k: v for k, v in self.keys.items() if v[2] != lease}

    def get(self, key: str) -> Versioned:
        self._expire()
        value, revision, _ = self.keys.get(key, (None, 0, 0))
        return Versioned(value, revision)

    def commit(self, expected, puts, deletes=()) -> int:
        self._expire()
        if any(self.keys.get(k, (None, 0, 0))[1] != rev for k, rev in expected.items()):
            return 0
        self.revision += 1
        for key, (value, lease) in puts.items():
            self.keys[key] = (value, self.revision, lease)
        for key in deletes:
            self.keys.pop(key, None)
        return self.revision

    def grant_lease(self, ttl_s: int) -> int:
        self._expire()
        self.next_lease += 1
        self.leases[self.next_lease] = (ttl_s, self.clock.monotonic_s() + ttl_s)
        return self.next_lease

    def keep_alive(self, lease_id: int) -> int:
        self._expire()
        if lease_id not in self.leases:
            return 0
        ttl = self.leases[lease_id][0]
        self.leases[lease_id] = (ttl, self.clock.monotonic_s() + ttl)
        return ttl

    def revoke_lease(self, lease_id: int) -> None:
        self._expire()
        self.leases.pop(lease_id, None)
        self.keys = {k: v for k, v in self.keys.items() if v[2] != lease_id}


def _instance(etcd, clock, address: str, log_end: list[int]) -> TxnElection:
    table = TxnTable(100)
    table.standby = "standby: starting"  # as compose_txn does with --etcd-endpoints
    return TxnElection(etcd, "/t", address, table, lambda: log_end[0], clock, ttl_s=2)


def test_one_serves_the_other_refuses_naming_it_and_takes_over_once_caught_up_after_the_lease_lapses():
    clock = FakeClock()
    etcd = MemoryEtcd(clock)
    end = [100]
    a, b = _instance(etcd, clock, "a:1", end), _instance(etcd, clock, "b:1", end)
    a.step()
    b.step()
    assert a.active and not b.active
    a.table.set_applied(100, 100)
    b.table.set_applied(100, 100)
    assert a.table.ready and not b.table.ready  # the standby follows but never becomes ready
    a.check_active()
    with pytest.raises(NotWritten, match="standby.*the active one is a:1"):
        b.check_active()
    assert "a:1" in b.table.standby

    # a cannot renew (etcd away from it): it takes writes only until the renewal's time + TTL - the margin
    clock.advance(500)
    a.step()
    b.step()
    etcd.down = True
    with pytest.raises(Unavailable):
        a.step()
    clock.advance(900)
    a.check_active()  # 0.9 s after its last renewal: still inside TTL 2 s - margin 1 s
    clock.advance(200)
    with pytest.raises(NotWritten, match="fenced"):
        a.check_active()
    etcd.down = False
    b.step()  # b renews its own lease meanwhile (every 200 ms by default)

    # its lease lapses in etcd after the fence time: b wins, and serves only once it has read the log's end
    clock.advance(1000)  # 2.1 s after a's last renewal
    end[0] = 250
    b.step()
    assert b.active and not b.table.ready and not b.table.standby
    b.table.set_applied(200, 250)
    assert not b.table.ready
    b.table.set_applied(250, 250)
    assert b.table.ready
    b.check_active()

    # a hears its lease is gone: a standby now, not ready, naming b
    a.step()
    assert not a.active and not a.table.ready and a.table.standby
    a.step()
    with pytest.raises(Unavailable, match="the active one is b:1"):
        a.check_active()


def test_a_clean_stop_hands_over_at_once():
    clock = FakeClock()
    etcd = MemoryEtcd(clock)
    a, b = _instance(etcd, clock, "a:1", [0]), _instance(etcd, clock, "b:1", [0])
    a.step()
    b.step()
    a.on_stop()
    assert not a.active and a.table.standby
    b.step()  # no waiting for the TTL: the lease was revoked
    assert b.active
