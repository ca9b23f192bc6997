"""The loss of one etcd member is invisible (issue 34, item 2): three CommitLog nodes on a three-member etcd
cluster (every node given every member), SYNC appends running, then each member in turn killed with -9 (the
one the leader's etcd client is on among them: its client moves to another member) and restarted, then the
member the leader's client is on paused (SIGSTOP: cut off, its connections open, answering nothing) and
resumed. Throughout: the same leader in the same epoch, never fenced; no append refused or failed; every
acknowledged message readable; each member restarted rejoins the cluster (it serves a linearizable read of
the leader key, as the others do). Then, on the same rig, the group's catalogs in that etcd (issue 34, item 1):
a topic and a user created on the leader are seen by a replica (Pull, ListUsers), and after kill -9 of the
leader the new leader serves both and takes appends and new users."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest

from mqstore_rpc.gen.etcd.etcdserver.etcdserverpb import rpc_pb2 as etcd, rpc_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import access_pb2, access_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from tests.support.ha import Group, etcd_cluster_or_skip
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.e2e]

# A 3 s lease: a leader may go unconfirmed for 2 s after a renewal it sent, no more than the 2 s the etcd
# client before issue 34 waited on a member cut off (the renewal after it, on the next member, came later:
# fenced), with headroom for make test-loaded (scripts/cpu_hog.py, load ~20).
FLAGS = ("--lease-ttl-s", "3", "--controller-interval-ms", "100", "--min-insync-replicas", "2",
         "--default-replication", "SYNC", "--sync-replication-timeout-ms", "5000", "--replication-heartbeat-ms", "100")
LEADER_KEY = "/mqstore/commitlog/leader"
OUTAGE_S = 4.0  # each member stays away this long (two leases): long enough for a renewal to need another one


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    cluster = etcd_cluster_or_skip(3)
    group = Group(tmp_path_factory.mktemp("group"), cluster.endpoints, 3, *FLAGS)
    try:
        yield cluster, group
    finally:
        group.stop()
        cluster.stop()


class Producer:
    """SYNC appends to one node, one after another; every acknowledgement and every error kept."""

    def __init__(self, group: Group, node_id: str, topic: str):
        self.group, self.node_id, self.topic = group, node_id, topic
        self.acked: list[tuple[int, bytes, int]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="producer")

    def _run(self) -> None:
        counter = 0
        while not self.stop.is_set():
            bodies = [f"m{counter + i:08d}".encode() * 4 for i in range(4)]
            counter += len(bodies)
            try:
                results = self.group.append(self.node_id, self.topic, bodies)
            except grpc.RpcError as exc:
                self.errors.append(f"{time.monotonic():.3f} {exc.code().name} {exc.details()}")
                continue
            self.acked.extend((r.physical_offset, b, r.epoch) for r, b in zip(results, bodies, strict=True))

    def progressed(self, since: int, after_s: float, started: float) -> bool:
        return len(self.acked) >= since + 50 and time.monotonic() >= started + after_s


def _leader_key(endpoint: str) -> tuple[bytes, int] | None:
    """The leader key as one member serves it (a linearizable read: only a member in the cluster answers)."""
    with grpc.insecure_channel(endpoint) as channel:
        try:
            response = rpc_pb2_grpc.KVStub(channel).Range(etcd.RangeRequest(key=LEADER_KEY.encode()), timeout=2)
        except grpc.RpcError:
            return None
    return (response.kvs[0].value, response.kvs[0].mod_revision) if response.kvs else None


def _move_etcd_leader_off(endpoints: list[str], index: int) -> None:
    """If the member at ``index`` leads the etcd cluster, hand its leadership to another member."""
    with grpc.insecure_channel(endpoints[index]) as channel:
        status = rpc_pb2_grpc.MaintenanceStub(channel).Status(etcd.StatusRequest(), timeout=5)
        if status.leader != status.header.member_id:
            return
        other = endpoints[(index + 1) % len(endpoints)]
        with grpc.insecure_channel(other) as other_channel:
            target = rpc_pb2_grpc.MaintenanceStub(other_channel).Status(etcd.StatusRequest(), timeout=5)
        rpc_pb2_grpc.MaintenanceStub(channel).MoveLeader(
            etcd.MoveLeaderRequest(targetID=target.header.member_id), timeout=10)


def _rejoined(endpoints: list[str], index: int) -> bool:
    """The member at ``index`` serves the leader key as another member does."""
    served = _leader_key(endpoints[index])
    return served is not None and served == _leader_key(endpoints[(index + 1) % len(endpoints)])


def _client_member(group: Group, node_id: str, first: str) -> str:
    """The etcd member the node's client is on: the first one given, or the last it moved to (its log)."""
    now = first
    for line in group.procs[node_id].lines:
        if '"etcd.member_changed"' in line:
            now = json.loads(line)["now"]
    return now


def test_losing_any_one_etcd_member_changes_no_leader_and_fails_no_append(rig):
    cluster, group = rig
    endpoints = [m.endpoint for m in cluster.members]
    group.start_all()
    leader, epoch = group.wait_leader()
    group.log(leader).CreateTopic(pb.CreateTopicRequest(name="ha", queue_count=2), timeout=10)
    wait_until(lambda: len(group.state(leader).in_sync) == 3, "all three nodes in sync", timeout_s=30)
    producer = Producer(group, leader, "ha")
    producer.thread.start()
    moved_from: list[str] = []
    try:
        wait_until(lambda: len(producer.acked) >= 50, "the first acknowledgements")
        for index in range(len(cluster.members)):  # kill -9 each member in turn, then restart it
            on = _client_member(group, leader, endpoints[0])
            if on == endpoints[index]:
                moved_from.append(on)
            cluster.kill9(index)
            print(f"{time.monotonic():.3f} killed {endpoints[index]}, client on {on}")
            mark, killed_at = len(producer.acked), time.monotonic()
            wait_until(lambda mark=mark, at=killed_at: producer.progressed(mark, OUTAGE_S, at),
                       "appends with a member away")
            assert _client_member(group, leader, endpoints[0]) != endpoints[index]
            cluster.restart(index)
            wait_until(lambda index=index: _rejoined(endpoints, index),
                       f"member {cluster.members[index].name} to rejoin and serve the leader key")
        # Cut off (SIGSTOP) the member the leader's client is on: its calls hang until their deadline. If that
        # member leads etcd, etcd's leadership is moved off it first: etcd 3.4.23 (Debian's) has a bug where
        # a leader paused and resumed still revokes the leases it thinks expired meanwhile, though the new
        # leader renewed them (etcd-io/etcd#15247, #12528; seen here under scripts/cpu_hog.py): a bug of
        # etcd's, not of a client. Its kill -9 above is covered (each member in turn, the leader among them).
        on = _client_member(group, leader, endpoints[0])
        paused = endpoints.index(on)
        _move_etcd_leader_off(endpoints, paused)
        cluster.pause(paused)
        print(f"{time.monotonic():.3f} paused {on}")
        try:
            mark, paused_at = len(producer.acked), time.monotonic()
            wait_until(lambda: producer.progressed(mark, OUTAGE_S, paused_at), "appends with a member cut off")
            assert _client_member(group, leader, endpoints[0]) != on
        finally:
            cluster.resume(paused)
        mark = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= mark + 50, "appends after the member came back")
    finally:
        producer.stop.set()
        producer.thread.join(30)
        if producer.errors:
            moves = [line for line in group.procs[leader].lines
                     if '"etcd.' in line or '"duty.retrying"' in line or '"controller.' in line]
            print("first errors", producer.errors[:2], "the leader's etcd client:", *moves[-12:], sep="\n")
    assert producer.errors == [], producer.errors[:3]
    assert moved_from, "the leader's client was never on a member that was killed"
    state = group.state(leader)
    assert (state.role, state.epoch, state.fenced) == ("LEADER", epoch, False)
    assert {ack_epoch for _, _, ack_epoch in producer.acked} == {epoch}
    assert all(group.state(n).role == "REPLICA" and group.state(n).epoch == epoch for n in group.procs if n != leader)
    acked = producer.acked
    found = []
    for first in range(0, len(acked), 1000):
        part = acked[first:first + 1000]
        found += group.log(leader).GetMessages(pb.GetMessagesRequest(physical_offsets=[a[0] for a in part]),
                                               timeout=30).messages
    missing = [(offset, got.missing_reason) for (offset, _, _), got in zip(acked, found, strict=True) if not got.found]
    assert missing == []
    assert [got.message.body for got in found] == [body for _, body, _ in acked]
    print("acked", len(acked), "client moved from", moved_from)


def _users(group: Group, node_id: str) -> list[str]:
    response = access_pb2_grpc.AccessStub(group.channels[node_id]).ListUsers(access_pb2.ListUsersRequest(), timeout=10)
    return [u.name for u in response.users]


def _pulled(group: Group, node_id: str, topic: str) -> list[bytes]:
    try:
        response = group.log(node_id).Pull(pb.PullRequest(topic=topic, queue_id=0, offset=0, max_messages=100),
                                           timeout=10)
    except grpc.RpcError:
        return []
    return [m.body for m in response.messages]


def test_topics_and_users_live_in_etcd_and_survive_the_leaders_kill9(rig):
    """Before issue 34's catalogs, a replica with its own SQLite answered NOT_FOUND for a topic its leader
    created, and nothing of the topic could be reached after the leader's kill -9. Runs after the member-loss
    test on its group (one rig for the module)."""
    cluster, group = rig
    if any(p is None for p in group.procs.values()):
        group.start_all()
    leader, epoch = group.wait_leader()
    group.log(leader).CreateTopic(pb.CreateTopicRequest(name="made-on-leader", queue_count=1), timeout=10)
    # at once, not after a poll: a compactor asking a replica about a record's topic skipped the topic's records
    # for good when the replica had not polled since the create (make compose-check-ha, at the etcd catalogs)
    for node in (n for n in group.procs if n != leader):
        listed = group.log(node).ListTopics(pb.ListTopicsRequest(), timeout=10).topics
        assert "made-on-leader" in {t.name for t in listed}, node
    access_pb2_grpc.AccessStub(group.channels[leader]).CreateUser(
        access_pb2.CreateUserRequest(name="alice", secret="s3cret-enough-for-a-test"), timeout=10)
    bodies = [b"a", b"b", b"c"]
    group.append(leader, "made-on-leader", bodies)
    replica = next(n for n in group.procs if n != leader)
    wait_until(lambda: _pulled(group, replica, "made-on-leader") == bodies, "a replica to serve the new topic")
    assert "alice" in _users(group, replica)
    group.kill9(leader)
    new_leader, _ = group.wait_leader(above_epoch=epoch, timeout_s=30)
    wait_until(lambda: _pulled(group, new_leader, "made-on-leader") == bodies, "the new leader to serve the topic")
    assert "alice" in _users(group, new_leader)
    wait_until(lambda: len(group.state(new_leader).in_sync) >= 2, "a SYNC append's two copies")
    group.append(new_leader, "made-on-leader", [b"d"])
    access_pb2_grpc.AccessStub(group.channels[new_leader]).CreateUser(
        access_pb2.CreateUserRequest(name="bob", secret="another-s3cret-for-a-test"), timeout=10)
    assert {"alice", "bob"} <= set(_users(group, new_leader))
    wait_until(lambda: _pulled(group, new_leader, "made-on-leader") == [*bodies, b"d"], "the append after failover")
