"""The controller's timing at the 2 s default lease (issue 34, item 4): renewals at the controller's pace,
the leader key read every fast_poll_ms while the leader is silent or gone, the fence time inside the
lease, the config refusing an interval with too few renewals before it; and the replica follower cutting
its backoff short when the controller names a new leader. A fake etcd and a fake clock: no sleeps."""

from __future__ import annotations

import json
import threading

import pytest

from mqstore.background import Duty
from mqstore.clock import FakeClock
from mqstore.errors import InvalidArgument, NotWritten, Unavailable
from mqstore.replication.config import ReplicationConfig, fence_margin_s
from mqstore.replication.controller import Controller, Versioned
from mqstore.replication.node import ReplicationNode
from tests.support.waiting import wait_until


class FakeEtcd:
    """Coordination in memory: leases never lapse by themselves (a test deletes a key to play the expiry)."""

    def __init__(self) -> None:
        self.kv: dict[str, tuple[bytes, int]] = {}
        self.revision = 0
        self.keep_alives = 0
        self.gets = 0

    def get(self, key: str) -> Versioned:
        self.gets += 1
        value, rev = self.kv.get(key, (None, 0))
        return Versioned(value, rev)

    def commit(self, expected, puts, deletes=()):
        if any(self.kv.get(k, (None, 0))[1] != rev for k, rev in expected.items()):
            return 0
        self.revision += 1
        for k, (v, _) in puts.items():
            self.kv[k] = (v, self.revision)
        for k in deletes:
            self.kv.pop(k, None)
        return self.revision

    def grant_lease(self, ttl_s: int) -> int:
        return 7

    def keep_alive(self, lease_id: int) -> int:
        self.keep_alives += 1
        return 2

    def revoke_lease(self, lease_id: int) -> None:
        pass


def _controller(tmp_path, **config) -> tuple[Controller, ReplicationNode, FakeEtcd, FakeClock]:
    clock = FakeClock()
    node = ReplicationNode(ReplicationConfig(node_id="n2", advertised_address="127.0.0.1:2", **config), clock,
                           tmp_path / "epochs", log_end=lambda: 0, flush_sync=False)
    etcd = FakeEtcd()
    return Controller(node, etcd), node, etcd, clock


def _name_leader(etcd: FakeEtcd, node_id: str = "n1", epoch: int = 1) -> None:
    etcd.commit({}, {"/mqstore/commitlog/leader": (json.dumps(
        {"node_id": node_id, "address": f"127.0.0.1:{node_id[1:]}", "epoch": epoch}).encode(), 7)})


def test_the_default_lease_is_two_seconds_and_the_leader_fences_one_second_after_a_renewal(tmp_path):
    controller, node, etcd, clock = _controller(tmp_path)
    assert node.config.lease_ttl_s == 2 and fence_margin_s(2) == 1.0
    controller.step()  # no leader key: it campaigns and wins
    assert node.is_leader
    assert node.lease_valid_until_s == clock.monotonic_s() + 1.0
    clock.advance(999)
    assert not node.fenced
    clock.advance(1)
    assert node.fenced  # no renewal for 1 s: it stops acknowledging, 1 s before etcd may let the key lapse
    with pytest.raises(NotWritten, match="may have lost its leadership lease") as refused:
        node.begin_append(sync=True)  # before anything is written: safe to send again (commitlog.proto, Append)
    assert isinstance(refused.value, Unavailable)  # UNAVAILABLE on the wire, its trailer naming NotWritten


def test_renewals_keep_the_controller_pace_while_the_leader_key_is_read_fast(tmp_path):
    controller, node, etcd, clock = _controller(tmp_path)
    _name_leader(etcd)
    controller.step()
    assert node.leadership.leader_id == "n1" and etcd.keep_alives == 1
    for _ in range(3):  # fast polls 50 ms apart: the key read each time, the lease renewed once per 200 ms
        clock.advance(50)
        controller.step()
    assert etcd.keep_alives == 1 and etcd.gets == 4
    clock.advance(150)
    controller.step()
    assert etcd.keep_alives == 2


def test_a_replica_reads_the_leader_key_fast_only_while_its_leader_is_silent_or_gone(tmp_path):
    controller, node, etcd, clock = _controller(tmp_path)
    assert controller.pause_s() == 0.05  # no leader known yet
    _name_leader(etcd)
    controller.step()
    assert controller.pause_s() == 0.2  # just named: silent only from now on
    clock.advance(400)
    node.heard_from_leader()  # a heartbeat
    clock.advance(400)
    assert controller.pause_s() == 0.2
    clock.advance(200)  # 600 ms without a message: 3 heartbeats of 200 ms missed
    assert controller.pause_s() == 0.05
    del etcd.kv["/mqstore/commitlog/leader"]  # the dead leader's lease lapsed in etcd
    controller.step()
    assert node.is_leader  # campaigned at the first read after the lapse
    assert controller.pause_s() == 0.2


@pytest.mark.parametrize("ttl, interval, ok", [(2, 200, True), (2, 250, True), (2, 251, False), (5, 1000, True),
                                               (5, 1001, False)])
def test_the_config_refuses_a_controller_interval_with_fewer_than_four_renewals_before_the_fence(ttl, interval, ok):
    if ok:
        ReplicationConfig(node_id="n1", lease_ttl_s=ttl, controller_interval_ms=interval)
    else:
        with pytest.raises(InvalidArgument, match="renew its lease 4 times"):
            ReplicationConfig(node_id="n1", lease_ttl_s=ttl, controller_interval_ms=interval)


class _Failing(Duty):
    def __init__(self) -> None:
        super().__init__("failing", interval_s=0.0, backoff_initial_s=30.0, backoff_max_s=30.0)
        self.steps = 0
        self.stepped = threading.Event()

    def step(self) -> None:
        self.steps += 1
        self.stepped.set()
        raise Unavailable("the old leader is gone")


@pytest.mark.parametrize("wake_ends_backoff", [True, False])
def test_wake_cuts_a_backoff_short_only_for_a_duty_that_asks(wake_ends_backoff):
    duty = _Failing()
    duty.wake_ends_backoff = wake_ends_backoff
    duty.start()
    try:
        wait_until(lambda: duty.steps == 1, "the first failing step")
        wait_until(lambda: duty.state().retries == 1, "the backoff to start")
        duty.wake()
        if wake_ends_backoff:
            wait_until(lambda: duty.steps == 2, "the step after the wake, not after the 30 s backoff")
    finally:
        duty.stop(timeout_s=5)
    if not wake_ends_backoff:
        assert duty.steps == 1  # woken, stopped: still in its backoff


def test_the_replica_follower_cuts_its_backoff_when_named_a_new_leader(tmp_path):
    from mqstore.replication.replica import ReplicaFollower
    _, node, _, _ = _controller(tmp_path)
    assert ReplicaFollower(None, node, None).wake_ends_backoff
