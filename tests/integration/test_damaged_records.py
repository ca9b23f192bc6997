"""Known damage does not stall readers, through real gRPC: records damaged in the segment files while
a CommitLog runs (its shared mapping sees the bytes change) are named by Pull and GetMessage in
trailers so that a consumer can skip them, and the Index service, following a real CommitLog
process, indexes around them and reports them in Stats. A restart then refuses to start on them."""

from __future__ import annotations

import grpc
import pytest
from commitlog_service.main import serving as commitlog_serving
from index_service.main import serving as index_serving
from mqstore.format import record
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, index_pb2_grpc
from test_commitlog_grpc import SEGMENT_BYTES, make_config
from test_index_service import index_config, query, stats, wait_until

from tests.support.processes import commitlog

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 10


def _damage(data_dir, physical_offset: int, position_in_record: int, data: bytes) -> None:
    path = data_dir / "commitlog" / f"{physical_offset - physical_offset % SEGMENT_BYTES:020d}"
    with open(path, "r+b") as f:
        f.seek(physical_offset % SEGMENT_BYTES + position_in_record)
        f.write(data)


def _append(stub, count: int) -> list[pb.AppendResult]:
    messages = [common_pb2.MessageInput(body=bytes([i]) * 500, keys=["all", f"k{i}"], queue_id=0) for i in range(count)]
    return list(stub.Append(pb.AppendRequest(topic="t", messages=messages), timeout=RPC_TIMEOUT_S).results)


def _trailers(error: grpc.RpcError) -> dict[str, str]:
    return dict(error.trailing_metadata())


def test_pull_serves_up_to_a_damaged_record_and_names_it_in_trailers(tmp_path):
    data_dir = tmp_path / "data"
    with commitlog_serving(make_config(data_dir)) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = commitlog_pb2_grpc.CommitLogStub(ch)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        results = _append(stub, 10)
        bad = results[4]
        _damage(data_dir, bad.physical_offset, 100, b"\xff\xfe")
        page = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=100), timeout=RPC_TIMEOUT_S)
        assert [m.queue_offset for m in page.messages] == [0, 1, 2, 3] and page.next_offset == 4
        with pytest.raises(grpc.RpcError) as info:
            stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=4), timeout=RPC_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.DATA_LOSS and "queue offset 5" in info.value.details()
        trailers = _trailers(info.value)
        assert trailers["mqstore-bad-queue-offset"] == "4"
        assert trailers["mqstore-bad-physical-offset"] == str(bad.physical_offset)
        skipped = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=5, max_messages=100), timeout=RPC_TIMEOUT_S)
        assert [m.queue_offset for m in skipped.messages] == [5, 6, 7, 8, 9]
        with pytest.raises(grpc.RpcError) as info:
            stub.GetMessage(pb.GetMessageRequest(msg_id=bad.msg_id), timeout=RPC_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.DATA_LOSS
        assert _trailers(info.value)["mqstore-bad-physical-offset"] == str(bad.physical_offset)


def test_index_follows_a_commitlog_process_past_damaged_records(tmp_path):
    data_dir = tmp_path / "log"
    log = commitlog(data_dir, "--segment-size-bytes", str(SEGMENT_BYTES), "--preallocate-segments", "false").started()
    try:
        with grpc.insecure_channel(log.address) as ch:
            stub = commitlog_pb2_grpc.CommitLogStub(ch)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
            results = _append(stub, 30)
            damaged = {7: (100, b"\xff\xfe"),                                       # body: CRC
                       15: (0, record.INT32.pack(3 * results[15].size_bytes)),     # TOTALSIZE
                       22: (28, record.INT64.pack(12345))}                          # PHYSICALOFFSET
            for i, (at, data) in damaged.items():
                _damage(data_dir, results[i].physical_offset, at, data)
            end = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).visible_physical_offset
        config = index_config(tmp_path / "index", int(log.address.rsplit(":", 1)[1]))
        with index_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as index_channel:
            index = index_pb2_grpc.IndexStub(index_channel)
            s = wait_until(lambda: (st := stats(index)).indexed_physical_offset >= end and st, "the index to catch up")
            assert s.healthy and s.connected
            assert [(d.start_physical_offset, d.end_physical_offset) for d in s.damaged_ranges] == [
                (results[i].physical_offset, results[i + 1].physical_offset) for i in sorted(damaged)]
            assert s.damaged_bytes == sum(results[i].size_bytes for i in damaged)
            found = [loc.physical_offset for loc in query(index, "t", "all", max_num=100).locators]
            assert found == [r.physical_offset for i, r in reversed(list(enumerate(results))) if i not in damaged]
            assert not query(index, "t", "k7").locators and len(query(index, "t", "k8").locators) == 1
    finally:
        assert log.stop() == 0
    restarted = commitlog(data_dir, "--segment-size-bytes", str(SEGMENT_BYTES), "--preallocate-segments", "false")
    try:
        assert restarted.wait_exit(60) == 1  # the damage is below the checkpoint, in the re-check window
        segment = data_dir / "commitlog" / f"{0:020d}"
        assert str(segment) in restarted.stderr() and "mqstore repair" in restarted.stderr()
    finally:
        restarted.stop()
