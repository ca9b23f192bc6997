"""Consumer offsets through a real commit log process (mqstore.consumer_offsets): retention deletes the
segments holding old commits and the offsets survive, also a kill -9 after it; a deleted topic's offsets
stay deleted across a kill -9; an earlier version's SQL offsets are imported once at start."""

from __future__ import annotations

import grpc
import pytest

from mqstore.clock import SystemClock
from mqstore.meta import MetadataStore
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]

SMALL = ("--segment-size-bytes", "65536", "--preallocate-segments", "false")


def _stub(server):
    channel = grpc.insecure_channel(server.address)
    return channel, commitlog_pb2_grpc.CommitLogStub(channel)


def _query(stub, group: str, topic: str, queue_id: int = 0) -> int:
    return stub.QueryOffset(pb.QueryOffsetRequest(group=group, topic=topic, queue_id=queue_id), timeout=10).offset


def _fill(stub, topic: str, count: int, body_bytes: int = 100) -> None:
    for start in range(0, count, 100):
        stub.Append(pb.AppendRequest(topic=topic, messages=[common_pb2.MessageInput(body=b"m" * body_bytes)]
                                     * min(100, count - start)), timeout=30)


def test_retention_deletes_the_segments_of_old_commits_and_the_offsets_survive(tmp_path):
    data = tmp_path / "data"
    server = commitlog(data, *SMALL, "--retention-ms", "1500", "--clean-interval-ms", "200").started()
    try:
        channel, stub = _stub(server)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        _fill(stub, "t", 10)
        stub.CommitOffset(pb.CommitOffsetRequest(group="idle", topic="t", offset=3), timeout=10)  # never again
        for i in range(1, 8):
            stub.CommitOffset(pb.CommitOffsetRequest(group="busy", topic="t", offset=i), timeout=10)
        _fill(stub, "t", 400, 1000)  # several segments past the first
        first_end = 65536
        wait_until(lambda: stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).min_physical_offset >= first_end,
                   "retention to delete the segments holding the first commits", timeout_s=30)
        assert (_query(stub, "idle", "t"), _query(stub, "busy", "t")) == (3, 7)
        channel.close()
        server.kill9()
    finally:
        server.stop()
    server = commitlog(data, *SMALL, "--retention-ms", "1500", "--clean-interval-ms", "200").started()
    try:
        channel, stub = _stub(server)
        assert (_query(stub, "idle", "t"), _query(stub, "busy", "t")) == (3, 7)
        channel.close()
    finally:
        server.stop()


def test_a_deleted_topics_offsets_stay_deleted_across_kill9(tmp_path):
    data = tmp_path / "data"
    server = commitlog(data, *SMALL).started()
    try:
        channel, stub = _stub(server)
        for name in ("t", "keep"):
            stub.CreateTopic(pb.CreateTopicRequest(name=name, queue_count=1), timeout=10)
            _fill(stub, name, 5)
            stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic=name, offset=4), timeout=10)
        stub.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=10)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        _fill(stub, "t", 5)
        channel.close()
        server.kill9()
    finally:
        server.stop()
    server = commitlog(data, *SMALL).started()
    try:
        channel, stub = _stub(server)
        with pytest.raises(grpc.RpcError) as missing:
            _query(stub, "g", "t")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert _query(stub, "g", "keep") == 4
        channel.close()
    finally:
        server.stop()


def test_an_earlier_versions_sql_offsets_are_imported_once(tmp_path):
    data = tmp_path / "data"
    server = commitlog(data, *SMALL).started()
    try:
        channel, stub = _stub(server)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=10)
        for queue_id in (0, 1):
            stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"m", queue_id=queue_id)]
                                         * 10), timeout=10)
        channel.close()
    finally:
        assert server.stop() == 0
    meta = MetadataStore(f"sqlite:///{data / 'metadata.db'}", SystemClock())
    meta.commit_offsets([("g", "t", 0, 6), ("g", "t", 1, 9)])  # what an earlier version's CommitOffset wrote
    meta.close()
    server = commitlog(data, *SMALL).started()
    try:
        migrated = [line for line in server.lines if '"offsets.migrated"' in line]
        assert len(migrated) == 1 and '"rows": 2' in migrated[0], server.stderr()
        channel, stub = _stub(server)
        assert (_query(stub, "g", "t", 0), _query(stub, "g", "t", 1)) == (6, 9)
        stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic="t", queue_id=0, offset=7), timeout=10)
        channel.close()
    finally:
        assert server.stop() == 0
    server = commitlog(data, *SMALL).started()
    try:
        assert not [line for line in server.lines if '"offsets.migrated"' in line]  # once
        channel, stub = _stub(server)
        assert (_query(stub, "g", "t", 0), _query(stub, "g", "t", 1)) == (7, 9)
        channel.close()
    finally:
        server.stop()
