"""mqstore_rpc.commitlog_client.CommitLogClient against a real CommitLog server on 127.0.0.1 (port 0):
every call, in mqstore's plain types, and every failure as the mqstore error it stands for."""

from __future__ import annotations

import grpc
import pytest

from mqstore.config import StoreConfig
from mqstore.errors import DataLoss, InvalidArgument, NotFound, OutOfRange, Unavailable
from mqstore.model import DURABILITY_WRITTEN, MessageIn, QueueInfo, StoredMessage
from mqstore_rpc import convert
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 10


@pytest.fixture
def log(commitlog_port):
    client = CommitLogClient(f"127.0.0.1:{commitlog_port}", rpc_timeout_s=5)
    try:
        yield client, commitlog_port
    finally:
        client.close()


def test_append_then_read_back_through_every_call(log):
    client, port = log
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(pb.CreateTopicRequest(name="c", queue_count=2),
                                                              timeout=RPC_TIMEOUT_S)
    sent = [MessageIn(body=b"b%d" % i, tags="t", keys=(f"k{i}", "all"), properties={"p": str(i)}, queue_id=i % 2,
                      born_timestamp_ms=1_700_000_000_000 + i) for i in range(6)]
    results = client.append("c", sent)
    assert [(r.queue_id, r.queue_offset) for r in results] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert all(r.durability == DURABILITY_WRITTEN and len(r.msg_id) == 32 and r.uniq_key for r in results)

    got = client.get_messages([r.physical_offset for r in results])
    assert [m.record.body for m in got] == [m.body for m in sent]
    assert [(m.msg_id, m.uniq_key, m.keys, m.tags, m.record.properties["p"]) for m in got] == [
        (r.msg_id, r.uniq_key, [f"k{i}", "all"], "t", str(i)) for i, r in enumerate(results)]
    assert all(m.record.born_timestamp_ms == s.born_timestamp_ms for m, s in zip(got, sent, strict=True))

    pulled = client.pull("c", 1, 0, max_messages=10)
    assert [m.msg_id for m in pulled.messages] == [r.msg_id for r in results[1::2]]
    assert (pulled.next_offset, pulled.min_offset, pulled.max_offset) == (3, 0, 3)
    assert client.queue_info("c", 0) == QueueInfo("c", 0, 0, 3)
    info = client.store_info()
    end = results[-1].physical_offset + results[-1].size_bytes
    assert (info.min_physical_offset, info.visible_physical_offset, info.flush_mode) == (0, end, "ASYNC")
    assert client.offset_by_time("c", 0, 0) == 0

    frames = client.tail(None, max_frame_bytes=1 << 20, heartbeat_ms=50)
    try:
        first = next(iter(frames))
    finally:
        frames.cancel()
    assert (first.record_count, first.next_physical_offset, len(first.records)) == (6, end, end)


def test_a_fetched_message_converts_back_to_the_same_proto(log):
    """The index answers include_messages with the client's StoredMessage converted back: lossless."""
    client, port = log
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(pb.CreateTopicRequest(name="c", queue_count=1), timeout=RPC_TIMEOUT_S)
        [r] = client.append("c", [MessageIn(body=b"\x00\xff", keys=("a", "b"), tags="x", flag=7)])
        original = stub.GetMessage(pb.GetMessageRequest(physical_offset=r.physical_offset), timeout=RPC_TIMEOUT_S)
    [message] = client.get_messages([r.physical_offset])
    assert isinstance(message, StoredMessage)
    assert convert.stored_message(message) == original
    assert convert.host_bytes("[::1]:9") == (b"\x00" * 15 + b"\x01", 9)
    with pytest.raises(InvalidArgument):
        convert.host_bytes("nowhere")


def test_failures_are_mqstore_errors(log, tmp_path):
    client, port = log
    with pytest.raises(NotFound):
        client.append("missing", [MessageIn(body=b"x")])
    with pytest.raises(InvalidArgument):
        client.append("missing", [MessageIn(body=b"x", sys_flag=4)])  # refused before it is sent
    with pytest.raises(NotFound):
        client.queue_info("missing", 0)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(pb.CreateTopicRequest(name="one", queue_count=1),
                                                              timeout=RPC_TIMEOUT_S)
    [r, bad] = client.append("one", [MessageIn(body=b"x" * 100, keys=("k",)), MessageIn(body=b"y" * 100)])
    end = bad.physical_offset + bad.size_bytes
    with pytest.raises(OutOfRange) as beyond:
        list(client.tail(end + 1000, max_frame_bytes=1 << 20, heartbeat_ms=50))
    assert (beyond.value.min_value, beyond.value.max_value) == (0, end)
    with pytest.raises(OutOfRange):
        client.pull("one", 0, 5)
    [found, not_a_record, past_end] = client.get_messages([r.physical_offset, r.physical_offset + 1, end + 10])
    assert found.record.topic == "one" and not_a_record is None and past_end is None

    segment = StoreConfig(data_dir=tmp_path / "log").commitlog_dir / f"{0:020d}"  # commitlog_port's data
    with open(segment, "r+b") as f:  # a body byte of the second record: its CRC fails
        f.seek(bad.physical_offset + bad.size_bytes - 50)
        f.write(b"Z")
    with pytest.raises(DataLoss):
        client.get_messages([bad.physical_offset])

    down = CommitLogClient("127.0.0.1:1", rpc_timeout_s=2)
    try:
        for call in (down.store_info, lambda: down.get_messages([0]), lambda: down.append("t", [MessageIn(b"x")]),
                     lambda: list(down.tail(None, max_frame_bytes=1 << 20, heartbeat_ms=50))):
            with pytest.raises(Unavailable):
                call()
    finally:
        down.close()


def test_get_messages_moves_to_the_next_node_when_one_is_unreachable(log):
    """As every other read: a node that cannot be reached is not asked again, so a follower's retry of
    GetMessage (the Index verifying its candidates after a failover) reaches the next listed node."""
    client, port = log
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(pb.CreateTopicRequest(name="nodes", queue_count=1),
                                                              timeout=RPC_TIMEOUT_S)
    [written] = client.append("nodes", [MessageIn(body=b"kept")])
    both = CommitLogClient(f"127.0.0.1:1,127.0.0.1:{port}", rpc_timeout_s=2)  # the first listed node is down
    try:
        with pytest.raises(Unavailable):
            both.get_messages([written.physical_offset])
        assert both.address == f"127.0.0.1:{port}"
        [found] = both.get_messages([written.physical_offset])
        assert found.record.body == b"kept"
    finally:
        both.close()
