"""The CommitLog service through real gRPC on 127.0.0.1 (port 0), real files in tmp_path, small segments."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import pathlib
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from commitlog_service import read_wire
from commitlog_service.main import CommitLogConfig, serving
from commitlog_service.servicer import CommitLogServicer
from mqstore.config import StoreConfig
from mqstore.format import record, record_reader
from mqstore.format.record_reader import Record
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 64 * 1024
RPC_TIMEOUT_S = 10


def make_config(data_dir: pathlib.Path, **store_overrides) -> CommitLogConfig:
    # Consume queue files of 50,000 entries (1 MB): the default's are 5.7 MB each, allocated for real, one
    # per queue written, and this config serves many tests.
    store = StoreConfig(**{"data_dir": data_dir, "segment_size_bytes": SEGMENT_BYTES, "preallocate_segments": False,
                           "cq_entries_per_file": 50_000, **store_overrides})
    return CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0))


@pytest.fixture
def server(tmp_path):
    """The port: a grpc.aio server answering Append on its loop, every other call in its handler pool."""
    with serving(make_config(tmp_path / "data")) as (srv, port):
        yield srv, port


@pytest.fixture
def channel(server):
    _, port = server
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ch
    finally:
        ch.close()


@pytest.fixture
def stub(channel):
    return commitlog_pb2_grpc.CommitLogStub(channel)


def msg(body: bytes, **fields) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=body, **fields)


def append(stub, topic: str, messages) -> list[pb.AppendResult]:
    return list(stub.Append(pb.AppendRequest(topic=topic, messages=messages), timeout=RPC_TIMEOUT_S).results)


def create(stub, name: str, queue_count: int = 1, **fields) -> pb.Topic:
    return stub.CreateTopic(pb.CreateTopicRequest(name=name, queue_count=queue_count, **fields), timeout=RPC_TIMEOUT_S)


def decode_frame(data: bytes) -> list[Record]:
    return [view.decode() for view in record_reader.records(data)]


def test_health_serving_overall_and_per_service(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "mqstore.v1.CommitLog"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_topics_create_list_describe_update_delete(stub):
    created = create(stub, "orders", queue_count=0)
    assert (created.name, created.queue_count, created.kind) == ("orders", 4, common_pb2.TOPIC_KIND_NORMAL)
    assert created.created_ms > 0
    with pytest.raises(grpc.RpcError) as info:  # a compaction topic keeps its keys: no per-topic retention
        create(stub, "prices", 2, kind=common_pb2.TOPIC_KIND_COMPACTION, retention_ms=60_000)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "COMPACTION" in info.value.details()
    compacted = create(stub, "prices", 2, kind=common_pb2.TOPIC_KIND_COMPACTION)
    assert (compacted.kind, compacted.retention_ms) == (common_pb2.TOPIC_KIND_COMPACTION, 0)
    for update in (dict(queue_count=4), dict(retention_ms=5_000)):  # keys would move queues / expire
        with pytest.raises(grpc.RpcError) as info:
            stub.UpdateTopic(pb.UpdateTopicRequest(name="prices", **update), timeout=RPC_TIMEOUT_S)
        assert info.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)

    listed = stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT_S).topics
    assert [t.name for t in listed] == ["orders", "prices"]
    with_system = stub.ListTopics(pb.ListTopicsRequest(include_system=True), timeout=RPC_TIMEOUT_S).topics
    system = [t for t in with_system if t.kind == common_pb2.TOPIC_KIND_SYSTEM]
    assert "RMQ_SYS_TRANS_HALF_TOPIC" in {t.name for t in system}

    described = stub.DescribeTopic(pb.DescribeTopicRequest(name="orders"), timeout=RPC_TIMEOUT_S)
    assert described.topic == created
    assert [(q.queue_id, q.min_offset, q.max_offset) for q in described.queues] == [(i, 0, 0) for i in range(4)]

    grown = stub.UpdateTopic(pb.UpdateTopicRequest(name="orders", queue_count=8), timeout=RPC_TIMEOUT_S)
    assert (grown.queue_count, grown.retention_ms) == (8, 0)
    retained = stub.UpdateTopic(pb.UpdateTopicRequest(name="orders", retention_ms=5_000), timeout=RPC_TIMEOUT_S)
    assert (retained.queue_count, retained.retention_ms) == (8, 5_000)

    stub.DeleteTopic(pb.DeleteTopicRequest(name="orders"), timeout=RPC_TIMEOUT_S)
    with pytest.raises(grpc.RpcError) as info:
        stub.DescribeTopic(pb.DescribeTopicRequest(name="orders"), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_append_results_and_message_ids(stub, server):
    _, port = server
    create(stub, "t", 2)
    results = append(stub, "t", [msg(b"a", queue_id=1), msg(b"b", queue_id=1), msg(b"c", queue_id=0)])
    assert [(r.queue_id, r.queue_offset) for r in results] == [(1, 0), (1, 1), (0, 0)]
    physical = [r.physical_offset for r in results]
    assert physical == sorted(physical) and physical[0] == 0
    assert all(b.physical_offset == a.physical_offset + a.size_bytes for a, b in itertools.pairwise(results))
    for r in results:
        assert r.msg_id == record.offset_msg_id(b"\x7f\x00\x00\x01", port, r.physical_offset)
        assert r.durability == common_pb2.DURABILITY_WRITTEN
        assert len(r.uniq_key) == 32 and r.store_timestamp_ms > 0
    assert len({r.uniq_key for r in results}) == 3


def test_sharding_key_and_round_robin_routing(stub):
    create(stub, "routed", 4)
    keyed = append(stub, "routed", [msg(b"%d" % i, sharding_key="customer-42") for i in range(20)])
    assert len({r.queue_id for r in keyed}) == 1
    spread = append(stub, "routed", [msg(b"%d" % i) for i in range(8)])
    assert {r.queue_id for r in spread} == {0, 1, 2, 3}


def test_append_stream_returns_every_result_in_order(stub):
    create(stub, "s", 1)
    requests = [pb.AppendRequest(topic="s", messages=[msg(b"%d-%d" % (i, j)) for j in range(50)]) for i in range(5)]
    response = stub.AppendStream(iter(requests), timeout=RPC_TIMEOUT_S)
    assert [r.queue_offset for r in response.results] == list(range(250))
    pulled = stub.Pull(pb.PullRequest(topic="s", offset=248, max_messages=10), timeout=RPC_TIMEOUT_S)
    assert [m.body for m in pulled.messages] == [b"4-48", b"4-49"]


def test_pull_reads_back_every_field(stub):
    create(stub, "p", 1)
    sent = msg(b"payload", tags="TagA", keys=["k1", "k2"], properties={"color": "blue"}, flag=7,
               born_timestamp_ms=1_600_000_000_000)
    [result] = append(stub, "p", [sent])
    response = stub.Pull(pb.PullRequest(topic="p", queue_id=0, offset=0), timeout=RPC_TIMEOUT_S)
    assert (response.next_offset, response.min_offset, response.max_offset) == (1, 0, 1)
    [m] = response.messages
    assert (m.topic, m.queue_id, m.queue_offset, m.body, m.tags, list(m.keys), m.flag) == (
        "p", 0, 0, b"payload", "TagA", ["k1", "k2"], 7)
    assert (m.msg_id, m.uniq_key, m.physical_offset, m.size_bytes) == (
        result.msg_id, result.uniq_key, result.physical_offset, result.size_bytes)
    assert m.properties["color"] == "blue" and m.properties["TAGS"] == "TagA" and m.properties["KEYS"] == "k1 k2"
    assert m.properties["UNIQ_KEY"] == result.uniq_key
    assert m.born_timestamp_ms == 1_600_000_000_000 and m.store_timestamp_ms == result.store_timestamp_ms
    assert m.born_host.startswith("127.0.0.1:") and m.store_host.startswith("127.0.0.1:")
    assert m.body_crc == record.body_crc(b"payload")


def test_pull_with_tag_filter_skips_other_tags(stub):
    create(stub, "tagged", 1)
    append(stub, "tagged", [msg(b"%d" % i, tags="even" if i % 2 == 0 else "odd") for i in range(10)])
    response = stub.Pull(pb.PullRequest(topic="tagged", offset=0, max_messages=100, tags=["odd"]),
                         timeout=RPC_TIMEOUT_S)
    assert [m.body for m in response.messages] == [b"1", b"3", b"5", b"7", b"9"]
    assert response.next_offset == 10
    both = stub.Pull(pb.PullRequest(topic="tagged", offset=0, max_messages=3, tags=["odd", "even"]),
                     timeout=RPC_TIMEOUT_S)
    assert [m.body for m in both.messages] == [b"0", b"1", b"2"] and both.next_offset == 3


def test_pull_with_an_sql92_filter_over_both_codecs(stub, monkeypatch):
    create(stub, "priced", 1)
    append(stub, "priced", [msg(b"%d" % i, tags="even" if i % 2 == 0 else "odd",
                                properties={"price": str(i), "region": "eu" if i % 3 == 0 else "us"})
                            for i in range(12)])
    sql = common_pb2.FILTER_TYPE_SQL92
    for compiled in sorted({False, read_wire.COMPILED}):
        monkeypatch.setattr(read_wire, "COMPILED", compiled)
        response = stub.Pull(pb.PullRequest(topic="priced", max_messages=100, filter_type=sql,
                                            filter_expression="region = 'eu' AND price > 2"), timeout=RPC_TIMEOUT_S)
        assert [m.body for m in response.messages] == [b"3", b"6", b"9"] and response.next_offset == 12
        tagged = stub.Pull(pb.PullRequest(topic="priced", max_messages=100, tags=["odd"], filter_type=sql,
                                          filter_expression="TAGS = 'odd' AND price NOT IN ('1', '3')"),
                           timeout=RPC_TIMEOUT_S)
        assert [m.body for m in tagged.messages] == [b"5", b"7", b"9", b"11"]
    as_tags = stub.Pull(pb.PullRequest(topic="priced", max_messages=2, filter_expression="odd || none"),
                        timeout=RPC_TIMEOUT_S)
    assert [m.body for m in as_tags.messages] == [b"1", b"3"]
    for request, detail in [
            (pb.PullRequest(topic="priced", filter_type=sql, filter_expression="price >> 2"), "column 8: expected"),
            (pb.PullRequest(topic="priced", filter_type=sql, filter_expression=""), "empty"),
            (pb.PullRequest(topic="priced", tags=["a"], filter_expression="b"), "not both"),
            (pb.PullRequest(topic="priced", filter_type=7, filter_expression="b"), "unknown FilterType 7")]:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Pull(request, timeout=RPC_TIMEOUT_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and detail in caught.value.details()


def test_pull_long_poll_returns_when_a_message_arrives(stub):
    create(stub, "lp", 1)
    long_poll_ms = 20_000
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        started = time.monotonic()
        future = pool.submit(stub.Pull, pb.PullRequest(topic="lp", offset=0, long_poll_ms=long_poll_ms),
                             timeout=RPC_TIMEOUT_S + long_poll_ms / 1000)
        append(stub, "lp", [msg(b"wake up")])
        response = future.result(timeout=RPC_TIMEOUT_S + long_poll_ms / 1000)
    assert [m.body for m in response.messages] == [b"wake up"]
    assert time.monotonic() - started < long_poll_ms / 1000  # it did not wait out the whole poll


def test_pull_long_poll_times_out_empty(stub):
    create(stub, "idle", 1)
    started = time.monotonic()
    response = stub.Pull(pb.PullRequest(topic="idle", offset=0, long_poll_ms=200), timeout=RPC_TIMEOUT_S)
    assert list(response.messages) == [] and response.next_offset == 0
    assert time.monotonic() - started >= 0.19


def test_get_message_by_id_and_physical_offset_across_segments(stub):
    create(stub, "big", 1)
    body = b"x" * 1000
    results = []
    for batch in range(4):  # ~4 segments of 64 KiB
        results += append(stub, "big", [msg(body + b"%d" % (batch * 60 + i)) for i in range(60)])
    info = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert info.segment_count >= 4
    for r in results[::17] + [results[-1]]:
        by_id = stub.GetMessage(pb.GetMessageRequest(msg_id=r.msg_id), timeout=RPC_TIMEOUT_S)
        by_offset = stub.GetMessage(pb.GetMessageRequest(physical_offset=r.physical_offset), timeout=RPC_TIMEOUT_S)
        assert by_id == by_offset
        assert by_id.queue_offset == r.queue_offset and by_id.body == body + b"%d" % r.queue_offset


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "reference"])
def test_get_message_by_an_id_of_another_store_says_which_store_the_id_names(stub, monkeypatch, compiled):
    """An offset message id is hex(store ip, port, physical offset): an id whose ip and port are not those
    of the record at its offset was minted by another store, and the answer says so (id_store_host)
    instead of passing that record off as the message (issue 38, item 5)."""
    if compiled and not read_wire.COMPILED:
        pytest.skip("the compiled codec is not built here")
    monkeypatch.setattr(read_wire, "COMPILED", compiled)
    create(stub, "ids", 1)
    [r] = append(stub, "ids", [msg(b"mine")])
    _, port, offset = record.parse_offset_msg_id(r.msg_id)
    mine = stub.GetMessage(pb.GetMessageRequest(msg_id=r.msg_id), timeout=RPC_TIMEOUT_S)
    assert mine.id_store_host == "" and mine.body == b"mine"
    assert stub.GetMessage(pb.GetMessageRequest(msg_id=r.msg_id.lower()), timeout=RPC_TIMEOUT_S).id_store_host == ""
    for host, other_port, address in ((b"\x0a\x00\x00\x07", port, f"10.0.0.7:{port}"),
                                      (b"\x7f\x00\x00\x01", port + 1, f"127.0.0.1:{port + 1}")):
        other = record.offset_msg_id(host, other_port, offset)
        theirs = stub.GetMessage(pb.GetMessageRequest(msg_id=other), timeout=RPC_TIMEOUT_S)
        assert theirs.id_store_host == address
        theirs.ClearField("id_store_host")
        assert theirs == mine  # what this store holds there, said to be an answer to another store's id
    by_offset = stub.GetMessage(pb.GetMessageRequest(physical_offset=offset), timeout=RPC_TIMEOUT_S)
    assert by_offset.id_store_host == ""


def test_tail_from_earliest_with_topic_filter(stub):
    create(stub, "a", 1)
    create(stub, "b", 1)
    for i in range(30):
        append(stub, "a" if i % 3 else "b", [msg(b"m%d" % i)])
    expected = [b"m%d" % i for i in range(30) if i % 3]
    got: list[Record] = []
    frames = stub.Tail(pb.TailRequest(start=pb.TAIL_START_EARLIEST, topics=["a"], heartbeat_ms=50),
                       timeout=RPC_TIMEOUT_S)
    try:
        for frame in frames:
            records = decode_frame(frame.records)
            assert frame.record_count == len(records)
            got += records
            if len(got) >= len(expected):
                break
    finally:
        frames.cancel()
    assert [r.topic for r in got] == ["a"] * len(expected)
    assert [r.body for r in got] == expected
    assert frame.log_end_physical_offset >= frame.next_physical_offset > got[-1].physical_offset


def test_tail_resumes_at_offset_and_heartbeats_when_idle(stub):
    create(stub, "h", 1)
    results = append(stub, "h", [msg(b"one"), msg(b"two"), msg(b"three")])
    frames = stub.Tail(pb.TailRequest(start=pb.TAIL_START_AT_OFFSET, from_physical_offset=results[1].physical_offset,
                                      heartbeat_ms=20), timeout=RPC_TIMEOUT_S)
    seen: list[bytes] = []
    try:
        for _, frame in zip(range(100), frames, strict=False):
            seen += [r.body for r in decode_frame(frame.records)]
            if frame.record_count == 0:  # a heartbeat: caught up
                break
    finally:
        frames.cancel()
    assert seen == [b"two", b"three"]
    end = results[-1].physical_offset + results[-1].size_bytes
    assert (frame.next_physical_offset, frame.log_end_physical_offset) == (end, end)


def test_queue_info_and_offset_by_time(stub):
    create(stub, "timed", 1)
    results = []
    for i in range(5):
        results += append(stub, "timed", [msg(b"%d" % i), msg(b"%d" % i)])
    info = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="timed", queue_id=0), timeout=RPC_TIMEOUT_S)
    assert (info.topic, info.queue_id, info.min_offset, info.max_offset) == ("timed", 0, 0, 10)

    def by_time(ts: int, boundary: int) -> int:
        request = pb.GetOffsetByTimeRequest(topic="timed", queue_id=0, timestamp_ms=ts, boundary=boundary)
        return stub.GetOffsetByTime(request, timeout=RPC_TIMEOUT_S).offset

    for r in results:
        lower = by_time(r.store_timestamp_ms, pb.TIME_BOUNDARY_LOWER)
        upper = by_time(r.store_timestamp_ms, pb.TIME_BOUNDARY_UPPER)
        assert lower <= r.queue_offset <= upper
        assert results[lower].store_timestamp_ms == r.store_timestamp_ms == results[upper].store_timestamp_ms
    far_future = results[-1].store_timestamp_ms + 3_600_000
    assert by_time(0, pb.TIME_BOUNDARY_LOWER) == 0
    assert by_time(far_future, pb.TIME_BOUNDARY_LOWER) == 10
    assert by_time(far_future, pb.TIME_BOUNDARY_UPPER) == 9


def test_consumer_offsets_commit_and_query(stub):
    create(stub, "c", 2)
    append(stub, "c", [msg(b"x", queue_id=1) for _ in range(5)])
    stub.CommitOffset(pb.CommitOffsetRequest(group="g1", topic="c", queue_id=1, offset=3), timeout=RPC_TIMEOUT_S)
    query = pb.QueryOffsetRequest(group="g1", topic="c", queue_id=1)
    assert stub.QueryOffset(query, timeout=RPC_TIMEOUT_S).offset == 3
    stub.CommitOffset(pb.CommitOffsetRequest(group="g1", topic="c", queue_id=1, offset=5), timeout=RPC_TIMEOUT_S)
    assert stub.QueryOffset(query, timeout=RPC_TIMEOUT_S).offset == 5
    with pytest.raises(grpc.RpcError) as info:
        stub.QueryOffset(pb.QueryOffsetRequest(group="g1", topic="c", queue_id=0), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.CommitOffset(pb.CommitOffsetRequest(group="g1", topic="c", queue_id=1, offset=6), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_store_info(stub, server):
    _, port = server
    create(stub, "i", 1)
    results = append(stub, "i", [msg(b"x" * 100) for _ in range(3)])
    info = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)
    end = results[-1].physical_offset + results[-1].size_bytes
    assert (info.min_physical_offset, info.max_physical_offset, info.visible_physical_offset) == (0, end, end)
    assert info.flushed_physical_offset <= end
    assert (info.flush_mode, info.read_only, info.read_only_reason) == ("ASYNC", False, "")
    assert info.segment_count >= 1  # the segment warmer may have created the next one already
    assert (info.segment_size_bytes, info.store_host) == (SEGMENT_BYTES, f"127.0.0.1:{port}")
    assert stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S) == info  # nothing changed
    more = append(stub, "i", [msg(b"y")])  # the answer made once per change is made again
    grown = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert grown.max_physical_offset == more[-1].physical_offset + more[-1].size_bytes > end


def test_store_info_answers_are_made_once_per_change_of_the_figures(small_config):
    """GetStoreInfo's bytes are reused while the store's figures stay, made again when one changes. (The segment
    warmer may add a segment at any time: a look counts when the figures were the same before and after it.)"""
    store = build_store(small_config())
    store.start()
    try:
        servicer = CommitLogServicer(store, scheduler=None)
        request = pb.GetStoreInfoRequest()

        def steady() -> tuple[bytes, bytes]:
            """Two answers in a row, and the store's figures the same before, between and after them."""
            looks: list[tuple[bytes, bytes]] = []

            def look() -> bool:
                before = store.store_info()
                one = asyncio.run(servicer.GetStoreInfo(request, None))
                two = asyncio.run(servicer.GetStoreInfo(request, None))
                if store.store_info() != before:
                    return False
                assert pb.StoreInfo.FromString(one) == convert.store_info(before)
                looks.append((one, two))
                return True
            wait_until(look, "the store's figures steady over two GetStoreInfo answers")
            return looks[-1]
        first, again = steady()
        assert again is first  # the same figures: the same bytes, not made again
        store.topic_admin.create("t", 1)
        store.append("t", [MessageIn(body=b"x")])
        wait_until(lambda: store.visible_offset() >= store.log_end(), "the record visible")
        grown, _ = steady()
        assert grown is not first and pb.StoreInfo.FromString(grown).max_physical_offset == store.log_end() > 0
    finally:
        store.stop()


def test_sync_flush_mode_acknowledges_flushed(tmp_path):
    with serving(make_config(tmp_path / "data", flush_mode="SYNC")) as (_, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = commitlog_pb2_grpc.CommitLogStub(ch)
            create(stub, "durable", 1)
            results = append(stub, "durable", [msg(b"x") for _ in range(10)])
            assert {r.durability for r in results} == {common_pb2.DURABILITY_FLUSHED}
            info = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)
            assert info.flush_mode == "SYNC" and info.flushed_physical_offset >= results[-1].physical_offset


def test_messages_survive_a_restart(tmp_path):
    data_dir = tmp_path / "data"
    with serving(make_config(data_dir)) as (_, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = commitlog_pb2_grpc.CommitLogStub(ch)
            create(stub, "kept", 1)
            results = append(stub, "kept", [msg(b"before-%d" % i) for i in range(5)])
    with serving(make_config(data_dir)) as (_, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = commitlog_pb2_grpc.CommitLogStub(ch)
            after = append(stub, "kept", [msg(b"after")])
            assert after[0].queue_offset == 5
            pulled = stub.Pull(pb.PullRequest(topic="kept", offset=0, max_messages=10), timeout=RPC_TIMEOUT_S)
            assert [m.body for m in pulled.messages] == [b"before-%d" % i for i in range(5)] + [b"after"]
            old = stub.GetMessage(pb.GetMessageRequest(msg_id=results[2].msg_id), timeout=RPC_TIMEOUT_S)
            assert old.body == b"before-2"
