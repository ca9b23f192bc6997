"""kill -9 between the steps of a DeleteTopic, with real processes (MQSTORE_FAILPOINTS=<step>=exit):
of the commit log (store_topics' steps), and of the compactor while it drops the deleted topic's
compaction logs. After a restart the delete is finished: the topic is gone, its records are never
served, the compactor holds nothing of it, and a topic created again with the name starts empty at 0."""

from __future__ import annotations

import grpc
import pytest

from mqstore.format import topic_event
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as cpb, compactor_pb2_grpc
from tests.integration.test_compactor_service import applied, commitlog_port  # noqa: F401 - a fixture
from tests.support.processes import ServiceProcess, commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]
T = 10
DELETE_STEPS = ["topic.delete.marked", "topic.delete.announced", "topic.delete.queues_dropped"]


def _filled_commitlog(address: str, kind=common_pb2.TOPIC_KIND_NORMAL) -> list:
    with grpc.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2, kind=kind), timeout=T)
        messages = [common_pb2.MessageInput(body=f"old-{i}".encode(), keys=[f"k{i}"]) for i in range(20)]
        return list(stub.Append(pb.AppendRequest(topic="t", messages=messages), timeout=T).results)


def check_deleted_and_created_again(stub, old: list) -> None:
    """``t`` is gone with its records; created again it starts empty at queue offset 0."""
    assert "t" not in [t.name for t in stub.ListTopics(pb.ListTopicsRequest(), timeout=T).topics]
    events = stub.Pull(pb.PullRequest(topic=topic_event.TOPIC, queue_id=0, offset=0), timeout=T).messages
    assert {topic_event.decode(m.body).topic for m in events} == {"t"}
    created = stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=T)
    assert created.start_physical_offset > old[-1].physical_offset
    result = stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"new")]),
                         timeout=T).results[0]
    assert (result.queue_id, result.queue_offset) == (0, 0)
    page = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=0), timeout=T)
    assert [m.body for m in page.messages] == [b"new"] and page.min_offset == 0 and page.max_offset == 1
    for r in old[:3]:
        with pytest.raises(grpc.RpcError) as info:
            stub.GetMessage(pb.GetMessageRequest(msg_id=r.msg_id), timeout=T)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "deleted topic" in info.value.details()


def crash_in_delete(name: str, tmp_path, failpoint=None) -> None:
    """The commit log killed (-9) at ``name`` inside a DeleteTopic; restarted, it finishes the delete."""
    data_dir = tmp_path / "log"
    with commitlog(data_dir, "--segment-size-bytes", "65536", env={"MQSTORE_FAILPOINTS": f"{name}=exit"}) as first:
        first.started()
        old = _filled_commitlog(first.address)
        with grpc.insecure_channel(first.address) as channel, pytest.raises(grpc.RpcError):
            commitlog_pb2_grpc.CommitLogStub(channel).DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=T)
        assert first.wait_exit() == 137  # killed at the failpoint, as by kill -9
    with commitlog(data_dir, "--segment-size-bytes", "65536") as second:
        second.started()
        with grpc.insecure_channel(second.address) as channel:
            check_deleted_and_created_again(commitlog_pb2_grpc.CommitLogStub(channel), old)


@pytest.mark.parametrize("name", DELETE_STEPS)
def test_a_commit_log_killed_inside_a_delete_finishes_it_at_start(name, tmp_path):
    crash_in_delete(name, tmp_path)


def _compactor(data_dir, log_port: int, env: dict | None = None) -> ServiceProcess:
    return ServiceProcess("compactor_service.main", [
        "--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", "--commitlog", f"127.0.0.1:{log_port}",
        "--spark-master", "", "--segment-size-bytes", "8192", "--checkpoint-interval-ms", "50",
        "--heartbeat-ms", "50", "--backoff-max-ms", "200"], env)


@pytest.mark.parametrize("name", ["compaction.topic.dropping", "compaction.topic.renamed"])
def test_a_compactor_killed_while_dropping_a_deleted_topic(name, tmp_path, commitlog_port):  # noqa: F811
    data_dir = tmp_path / "compactor"
    with grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel:
        log = commitlog_pb2_grpc.CommitLogStub(log_channel)
        with _compactor(data_dir, commitlog_port, {"MQSTORE_FAILPOINTS": f"{name}=exit"}) as first:
            first.started()
            with grpc.insecure_channel(first.address) as channel:
                _filled_commitlog(f"127.0.0.1:{commitlog_port}", common_pb2.TOPIC_KIND_COMPACTION)
                wait_until(lambda: applied(compactor_pb2_grpc.CompactorStub(channel), "t", 20),
                           "the compactor to apply every record")
            log.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=T)
            assert first.wait_exit() == 137  # killed inside drop_topic
        assert (data_dir / "logs" / ("t.deleted" if name.endswith("renamed") else "t")).is_dir()
        log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        log.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"new", keys=["k1"])]),
                   timeout=T)
        with _compactor(data_dir, commitlog_port) as second:
            second.started()
            with grpc.insecure_channel(second.address) as channel:
                compactor = compactor_pb2_grpc.CompactorStub(channel)
                check_compacted_topic_created_again(compactor)
        assert sorted(p.name for p in (data_dir / "logs").iterdir()) == ["t"]


def check_compacted_topic_created_again(compactor) -> None:
    """``t`` (COMPACTION, 2 queues) was deleted with keys k0..k19 and created again with k1 = b"new" only."""
    found = wait_until(lambda: (v := _latest(compactor, "k1")) and v.value == b"new" and v, "the new value of k1")
    assert found.queue_offset == 0
    for key in ("k0", "k2", "k19"):
        with pytest.raises(grpc.RpcError) as info:
            compactor.GetLatest(cpb.GetLatestRequest(topic="t", key=key), timeout=T)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    scanned = [v.key for page in compactor.Scan(cpb.ScanRequest(topic="t"), timeout=T) for v in page.values]
    assert scanned == ["k1"]
    queue = found.queue_id
    page = compactor.Pull(cpb.CompactedPullRequest(topic="t", queue_id=queue, offset=0), timeout=T)
    assert [(m.queue_offset, m.body) for m in page.messages] == [(0, b"new")] and page.max_offset == 1
    assert (page.min_offset, list(page.skipped)) == (0, [])


def _latest(compactor, key: str):
    try:
        return compactor.GetLatest(cpb.GetLatestRequest(topic="t", key=key), timeout=T)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return None
