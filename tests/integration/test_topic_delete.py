"""DeleteTopic for real, through gRPC on 127.0.0.1 (port 0) with a real CommitLog, Compactor and Index
in this process: a COMPACTION topic deleted and created again answers nothing of its old keys
(GetLatest NOT_FOUND, Scan, the compacted Pull and the commit log's Pull from 0 see only new records,
offsets from 0); a NORMAL topic likewise (Pull, queue info, and the Index answers nothing of an old key);
a compactor that was down during the delete applies it when it comes back, before any new value.
Kills between the steps: tests/crash/test_topic_delete_crash.py."""

from __future__ import annotations

import grpc
import pytest

from compactor_service.main import serving as compactor_serving
from index_service.main import serving as index_serving
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as cpb, compactor_pb2_grpc, index_pb2, index_pb2_grpc
from tests.crash.test_topic_delete_crash import check_compacted_topic_created_again
from tests.integration.test_compactor_service import applied, compactor_config
from tests.integration.test_index_service import index_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
T = 10
COMPACTION = common_pb2.TOPIC_KIND_COMPACTION


def _write(log, kind: int, count: int = 20) -> list:
    log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2, kind=kind), timeout=T)
    messages = [common_pb2.MessageInput(body=f"old-{i}".encode(), keys=[f"k{i}"]) for i in range(count)]
    return list(log.Append(pb.AppendRequest(topic="t", messages=messages), timeout=T).results)


def _recreate(log, kind: int) -> pb.Topic:
    created = log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2, kind=kind), timeout=T)
    log.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"new", keys=["k1"])]), timeout=T)
    return created


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _check_log_pulls_only_new(log, old: list, created: pb.Topic) -> None:
    assert created.start_physical_offset > old[-1].physical_offset
    infos = [log.GetQueueInfo(pb.GetQueueInfoRequest(topic="t", queue_id=q), timeout=T) for q in range(2)]
    assert sorted((i.min_offset, i.max_offset) for i in infos) == [(0, 0), (0, 1)]
    pulls = [log.Pull(pb.PullRequest(topic="t", queue_id=q, offset=0), timeout=T) for q in range(2)]
    pulled = [m for page in pulls for m in page.messages]
    assert [(m.body, m.queue_offset) for m in pulled] == [(b"new", 0)]
    assert _code(lambda: log.GetMessage(pb.GetMessageRequest(msg_id=old[0].msg_id), timeout=T)) == \
        grpc.StatusCode.NOT_FOUND


def test_a_compaction_topic_deleted_and_created_again(tmp_path, commitlog_port):
    with compactor_serving(compactor_config(tmp_path / "compactor", commitlog_port)) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        log, compactor = commitlog_pb2_grpc.CommitLogStub(log_channel), compactor_pb2_grpc.CompactorStub(channel)
        old = _write(log, COMPACTION)
        wait_until(lambda: applied(compactor, "t", 20), "the compactor to apply every record")
        compactor.Compact(cpb.CompactRequest(topic="t", seal_active=True), timeout=60)  # a cleaned log goes too
        log.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=T)
        wait_until(lambda: _code(lambda: compactor.GetLatest(cpb.GetLatestRequest(topic="t", key="k0"), timeout=T))
                   == grpc.StatusCode.NOT_FOUND, "the compactor to apply the delete")
        assert _code(lambda: list(compactor.Scan(cpb.ScanRequest(topic="t"), timeout=T))) == grpc.StatusCode.NOT_FOUND
        assert compactor.ListQueues(cpb.ListQueuesRequest(), timeout=T).queues == []
        assert not (tmp_path / "compactor" / "logs" / "t").exists()
        created = _recreate(log, COMPACTION)
        check_compacted_topic_created_again(compactor)
        _check_log_pulls_only_new(log, old, created)


def test_a_normal_topic_deleted_and_created_again_and_the_index(tmp_path, commitlog_port):
    with index_serving(index_config(tmp_path / "index", commitlog_port)) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        log, index = commitlog_pb2_grpc.CommitLogStub(log_channel), index_pb2_grpc.IndexStub(channel)
        old = _write(log, common_pb2.TOPIC_KIND_NORMAL)

        def found(key: str) -> list[bytes]:
            page = index.QueryByKey(index_pb2.QueryByKeyRequest(topic="t", key=key, include_messages=True), timeout=T)
            return [m.body for m in page.messages]
        wait_until(lambda: found("k5") == [b"old-5"], "the index to index the old records")
        log.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=T)
        assert found("k5") == [] and found("k1") == []
        created = _recreate(log, common_pb2.TOPIC_KIND_NORMAL)
        wait_until(lambda: found("k1") == [b"new"], "the index to index the new record")
        assert found("k5") == []
        uniq = old[5].uniq_key
        assert _code(lambda: index.QueryByUniqKey(index_pb2.QueryByUniqKeyRequest(topic="t", uniq_key=uniq),
                                                  timeout=T)) == grpc.StatusCode.NOT_FOUND
        page = index.QueryByKey(index_pb2.QueryByKeyRequest(topic="t", key="k5"), timeout=T)
        assert page.locators == [] and page.missing_removed == 1
        _check_log_pulls_only_new(log, old, created)


def test_a_compactor_that_was_down_during_the_delete_applies_it_when_back(tmp_path, commitlog_port):
    config = compactor_config(tmp_path / "compactor", commitlog_port)
    with grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel:
        log = commitlog_pb2_grpc.CommitLogStub(log_channel)
        with compactor_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _write(log, COMPACTION)
            wait_until(lambda: applied(compactor_pb2_grpc.CompactorStub(channel), "t", 20),
                       "the compactor to apply every record")
        log.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=T)  # while the compactor is down
        _recreate(log, COMPACTION)
        assert (tmp_path / "compactor" / "logs" / "t").is_dir()  # it still holds the old topic's logs
        with compactor_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            check_compacted_topic_created_again(compactor_pb2_grpc.CompactorStub(channel))
