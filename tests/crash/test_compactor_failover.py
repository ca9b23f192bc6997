"""The Compactor across a failover of the commit log (issue 17, 5.), real processes on 127.0.0.1: three CommitLog
nodes and etcd, a primary compactor given every node (``--commitlog a,b,c``) and a replica compactor copying
it (``--replica-of``, seed 000's message-based replication). The leader is killed between two rounds of keyed
SYNC appends: the primary's Tail resumes on the new leader at the same physical offset, so its compaction log
holds every acknowledged record once, in log order; its replica keeps up; a compaction round leaves the
latest value of each key, and a replica started after it all rebuilds that log from offset 0."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from tests.crash.test_failover import TTL_FLAGS
from tests.integration.test_compactor_replica import compactor, everything
from tests.support.ha import group_on_etcd
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.e2e]
T = 10
WAIT_S = 180  # deadlines, not sleeps: a run under two busy loops took up to 183 s in all
KEYS = 10


@pytest.fixture
def group(tmp_path):
    with group_on_etcd(tmp_path, *TTL_FLAGS) as g:
        yield g


def _held(stub) -> list:
    try:
        return everything(stub, "kv", 0)
    except grpc.RpcError:
        return []


def test_compactor_and_its_replicas_follow_the_new_leader_without_loss_or_duplicates(group, tmp_path):
    group.start_all()
    leader, epoch = group.wait_leader()
    group.log(leader).CreateTopic(clpb.CreateTopicRequest(name="kv", queue_count=1,
                                                          kind=common_pb2.TOPIC_KIND_COMPACTION), timeout=T)
    wait_until(lambda: len(group.state(leader).in_sync) == 3, "all three nodes in sync", timeout_s=90)
    nodes = ",".join(group.procs[n].address for n in group.procs)
    appended: list[tuple[str, bytes]] = []  # what the commit log acknowledged, in log order (one queue)

    def append(node_id: str, first: int) -> None:
        values = [(f"k{i % KEYS}", b"v%04d" % i) for i in range(first, first + 100)]
        request = clpb.AppendRequest(topic="kv", replication=clpb.REPLICATION_MODE_SYNC, messages=[
            common_pb2.MessageInput(body=v, keys=[k]) for k, v in values])
        group.log(node_id).Append(request, timeout=T)
        appended.extend(values)

    with compactor(tmp_path / "primary", "--commitlog", nodes) as primary_process, \
            grpc.insecure_channel(primary_process.address) as primary_channel:
        primary = compactor_pb2_grpc.CompactorStub(primary_channel)
        with compactor(tmp_path / "replica", "--replica-of", primary_process.address) as replica_process, \
                grpc.insecure_channel(replica_process.address) as replica_channel:
            replica = compactor_pb2_grpc.CompactorStub(replica_channel)
            append(leader, 0)
            wait_until(lambda: len(_held(primary)) == 100, "the primary to apply the first round", timeout_s=WAIT_S)

            group.kill9(leader)
            leader, epoch = group.wait_leader(above_epoch=epoch, timeout_s=90)
            wait_until(lambda: len(group.state(leader).in_sync) >= 2, "a replica in sync with the new leader",
                       timeout_s=90)
            append(leader, 100)
            expected = [(offset, key, body) for offset, (key, body) in enumerate(appended)]
            wait_until(lambda: _held(primary) == expected, "the primary to follow the new leader", timeout_s=WAIT_S)
            wait_until(lambda: _held(replica) == expected, "its replica to keep up", timeout_s=WAIT_S)

            primary.Compact(pb.CompactRequest(topic="kv", seal_active=True), timeout=120)
            latest = {key: body for key, body in appended}
            compacted = _held(primary)
            assert {key: body for _, key, body in compacted} == latest and len(compacted) == KEYS
            for key, body in latest.items():
                assert replica.GetLatest(pb.GetLatestRequest(topic="kv", key=key), timeout=T).value == body

            with compactor(tmp_path / "rebuilt", "--replica-of", primary_process.address) as rebuilt_process, \
                    grpc.insecure_channel(rebuilt_process.address) as rebuilt_channel:
                rebuilt = compactor_pb2_grpc.CompactorStub(rebuilt_channel)
                wait_until(lambda: _held(rebuilt) == compacted, "a new replica to rebuild the compacted log from "
                           "offset 0", timeout_s=WAIT_S)
