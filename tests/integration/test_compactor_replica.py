"""A replica compactor (``--replica-of``) in its own process copies a primary compactor (another process)
from offset 0 and keeps up; real processes: a commit log, a primary and a replica."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from tests.support.processes import ServiceProcess, commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
T = 10
SMALL = ["--segment-size-bytes", "8192", "--round-interval-ms", "3600000", "--spark-master", "", "--grace-s", "1",
         "--port", "0", "--checkpoint-interval-ms", "50", "--heartbeat-ms", "50"]


def compactor(data_dir, *extra: str) -> ServiceProcess:
    return ServiceProcess("compactor_service.main", ["--data-dir", str(data_dir), *SMALL, *extra]).started()


def everything(stub, topic: str, queue_id: int) -> list[tuple[int, str, bytes]]:
    out, offset = [], 0
    for _ in range(1000):
        page = stub.Pull(pb.CompactedPullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=100),
                         timeout=T)
        if not page.messages:
            return out
        out += [(m.queue_offset, m.keys[0], m.body) for m in page.messages]
        offset = page.next_offset
    raise AssertionError("pull did not end")


def append(log, values: list[tuple[str, bytes]]) -> None:
    log.Append(clpb.AppendRequest(topic="kv", messages=[common_pb2.MessageInput(body=v, keys=[k]) for k, v in values]),
               timeout=T)


def test_a_replica_copies_the_compacted_log_from_offset_0_and_keeps_up(tmp_path):
    with commitlog(tmp_path / "log").started() as log_process, \
            compactor(tmp_path / "primary", "--commitlog", log_process.address) as primary_process, \
            grpc.insecure_channel(log_process.address) as log_channel, \
            grpc.insecure_channel(primary_process.address) as primary_channel:
        log = commitlog_pb2_grpc.CommitLogStub(log_channel)
        primary = compactor_pb2_grpc.CompactorStub(primary_channel)
        log.CreateTopic(clpb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        append(log, [(f"k{i % 10}", f"v{i}".encode() * 30) for i in range(300)])
        wait_until(lambda: len(_held(primary)) == 300, "the primary to apply every record")
        primary.Compact(pb.CompactRequest(topic="kv", seal_active=True), timeout=60)
        compacted = everything(primary, "kv", 0)
        assert len(compacted) == 10  # the latest value of each key
        with compactor(tmp_path / "replica", "--replica-of", primary_process.address) as replica_process, \
                grpc.insecure_channel(replica_process.address) as replica_channel:
            replica = compactor_pb2_grpc.CompactorStub(replica_channel)
            wait_until(lambda: _held(replica) == compacted, "the replica to copy the compacted log")
            append(log, [("k3", b"new"), ("k42", b"fresh")])  # keeps up with what the primary applies later
            wait_until(lambda: len(_held(replica)) == 12, "the replica to keep up")
            assert replica.GetLatest(pb.GetLatestRequest(topic="kv", key="k3"), timeout=T).value == b"new"
            stats = replica.Stats(pb.CompactorStatsRequest(), timeout=T)
            assert stats.replica_of == primary_process.address and stats.records_applied == 12
            assert stats.role == "replica"
        assert replica_process.process.returncode == 0


def _held(stub) -> list:
    try:
        return everything(stub, "kv", 0)
    except grpc.RpcError:
        return []


def test_a_replica_follows_its_primary_through_a_delete_and_a_topic_created_again(tmp_path):
    """The primary drops kv at its DELETED event; the replica, which copies the primary and not the log,
    learns it from ListQueues (kv gone, or held as another topic: topic_start_physical_offset)."""
    with commitlog(tmp_path / "log").started() as log_process, \
            compactor(tmp_path / "primary", "--commitlog", log_process.address) as primary_process, \
            compactor(tmp_path / "replica", "--replica-of", primary_process.address) as replica_process, \
            grpc.insecure_channel(log_process.address) as log_channel, \
            grpc.insecure_channel(primary_process.address) as primary_channel, \
            grpc.insecure_channel(replica_process.address) as replica_channel:
        log = commitlog_pb2_grpc.CommitLogStub(log_channel)
        replica = compactor_pb2_grpc.CompactorStub(replica_channel)
        create = clpb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION)
        log.CreateTopic(create, timeout=T)
        append(log, [(f"k{i}", b"old") for i in range(20)])
        wait_until(lambda: len(_held(replica)) == 20, "the replica to copy the old topic")
        log.DeleteTopic(clpb.DeleteTopicRequest(name="kv"), timeout=T)
        wait_until(lambda: replica.ListQueues(pb.ListQueuesRequest(), timeout=T).queues == [],
                   "the replica to drop the deleted topic")
        created = log.CreateTopic(create, timeout=T)
        append(log, [("k1", b"new")])
        wait_until(lambda: _held(replica) == [(0, "k1", b"new")], "the replica to copy the new topic from 0")
        refs = compactor_pb2_grpc.CompactorStub(primary_channel).ListQueues(pb.ListQueuesRequest(), timeout=T).queues
        assert [(r.topic, r.topic_start_physical_offset) for r in refs] == [("kv", created.start_physical_offset)]
        assert (tmp_path / "replica" / "logs" / "kv" / "topic.incarnation").exists()
