"""compactor_service.lease.RoundLease over an in-memory etcd (the Coordination protocol): one of two instances
is active; the other takes over when the active one's lease lapses or is revoked at stop; a standby's
Compact is refused naming the active one."""

from __future__ import annotations

import itertools
import threading

from compactor_service.lease import RoundLease
from mqstore.errors import Unavailable
from mqstore.replication.controller import Versioned
from tests.support.waiting import wait_until


class FakeEtcd:
    def __init__(self):
        self.lock = threading.Lock()
        self.keys: dict[str, tuple[bytes, int, int]] = {}  # key -> (value, mod revision, lease)
        self.leases: set[int] = set()
        self.revision = 0
        self.ids = itertools.count(1)

    def get(self, key):
        with self.lock:
            value, rev, _ = self.keys.get(key, (None, 0, 0))
            return Versioned(value, rev)

    def commit(self, expected, puts, deletes=()):
        with self.lock:
            if any(self.keys.get(k, (None, 0, 0))[1] != rev for k, rev in expected.items()):
                return 0
            self.revision += 1
            for k, (v, lease) in puts.items():
                self.keys[k] = (v, self.revision, lease)
            return self.revision

    def grant_lease(self, ttl_s):
        with self.lock:
            lease = next(self.ids)
            self.leases.add(lease)
            return lease

    def keep_alive(self, lease_id):
        with self.lock:
            return 2 if lease_id in self.leases else 0

    def revoke_lease(self, lease_id):
        self.lapse(lease_id)

    def lapse(self, lease_id):
        with self.lock:
            self.leases.discard(lease_id)
            self.keys = {k: v for k, v in self.keys.items() if v[2] != lease_id}


def test_one_is_active_and_the_other_takes_over_when_its_lease_lapses():
    etcd = FakeEtcd()
    a, b = RoundLease(etcd, "/c", "a", 2), RoundLease(etcd, "/c/", "b", 2)
    a.step()
    b.step()
    assert a.active() and not b.active() and b.holder() == "a"
    refused = b.not_active()
    assert isinstance(refused, Unavailable) and "standby" in str(refused) and "(a)" in str(refused)
    etcd.lapse(a._lease)  # a stopped renewing (kill -9, SIGSTOP past the TTL)
    b.step()
    assert b.active() and b.holder() == "b"
    a.step()  # a finds its lease gone: standby from then on
    a.step()
    assert not a.active() and a.holder() == "b"


def test_a_stopped_active_revokes_its_lease_so_the_standby_takes_over_at_once():
    etcd = FakeEtcd()
    a, b = RoundLease(etcd, "/c", "a", 2), RoundLease(etcd, "/c", "b", 2)
    a.start()
    try:
        wait_until(a.active, "a to take the lease")
    finally:
        assert a.stop()
    assert not a.active() and etcd.get("/c/active").value is None
    b.step()
    assert b.active()
