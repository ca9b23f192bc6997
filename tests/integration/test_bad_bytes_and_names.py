"""Bad bytes and bad names (issue 6): requests that do not parse, illegal topic names, appends to system
topics, reserved properties, born time 0 and oversized requests, each through real gRPC on 127.0.0.1.

One CommitLog server and one Index server (following it) serve the whole module; after each case the
servers must still answer.
"""

from __future__ import annotations

import time

import grpc
import pytest
import structlog
from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from mqstore.index.config import IndexConfig
from index_service.main import IndexServiceConfig
from index_service.main import serving as index_serving
from mqstore.config import MiB, StoreConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, index_pb2, index_pb2_grpc
from mqstore_rpc.server import ServerConfig

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 10
Code = grpc.StatusCode
NAME_PATTERN = "[%|a-zA-Z0-9_-]{1,127}"
BAD_NAMES = ["a b", "x/y", "x" * 200]
COMMITLOG = pb.DESCRIPTOR.services_by_name["CommitLog"]
INDEX = index_pb2.DESCRIPTOR.services_by_name["Index"]
GARBAGE = b"\xff\xff\xff\xff\xff"  # a varint that never ends: not any message
BAD_UTF8 = b"\xc3\x28"


def M(body: bytes = b"x", **fields) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=body, **fields)


@pytest.fixture(scope="module")
def channels(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-bytes")
    store = StoreConfig(data_dir=root / "log", segment_size_bytes=64 * 1024, preallocate_segments=False)
    with commitlog_serving(CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0))) as (_, log_port):
        index = IndexServiceConfig(index=IndexConfig(root / "index", slot_count=16, entry_count=64,
                                                     max_keys_per_message=8),
                                   server=ServerConfig(port=0, grace_s=1.0), commitlog_address=f"127.0.0.1:{log_port}")
        with index_serving(index) as (_, index_port), grpc.insecure_channel(f"127.0.0.1:{log_port}") as log_ch, \
                grpc.insecure_channel(f"127.0.0.1:{index_port}") as index_ch:
            stub = commitlog_pb2_grpc.CommitLogStub(log_ch)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=RPC_TIMEOUT_S)
            stub.Append(pb.AppendRequest(topic="t", messages=[M()]), timeout=RPC_TIMEOUT_S)
            yield log_ch, index_ch


@pytest.fixture(scope="module")
def stub(channels):
    return commitlog_pb2_grpc.CommitLogStub(channels[0])


def _assert_still_serves(channels) -> None:
    log_ch, index_ch = channels
    results = commitlog_pb2_grpc.CommitLogStub(log_ch).Append(
        pb.AppendRequest(topic="t", messages=[M(b"ok")]), timeout=RPC_TIMEOUT_S).results
    assert len(results) == 1
    index_pb2_grpc.IndexStub(index_ch).Stats(index_pb2.IndexStatsRequest(), timeout=RPC_TIMEOUT_S)


# ---- 1. request bytes that do not parse ------------------------------------------------------------

def _bad_utf8_request(method) -> bytes | None:
    """The request with invalid UTF-8 in its first string field, as raw wire bytes (a protobuf library
    in Python refuses to build it); None when the request has no string field."""
    for field in method.input_type.fields:
        if field.type == field.TYPE_STRING:
            return bytes([(field.number << 3) | 2, len(BAD_UTF8)]) + BAD_UTF8
    if method.input_type.name == "AppendRequest":  # messages[0].tags (field 2 of MessageInput)
        inner = bytes([(2 << 3) | 2, len(BAD_UTF8)]) + BAD_UTF8
        return bytes([(2 << 3) | 2, len(inner)]) + inner
    return None


def _cases():
    for service in (COMMITLOG, INDEX):
        for method in service.methods:
            yield pytest.param(service, method, GARBAGE, id=f"{method.name}-garbage")
            bad = _bad_utf8_request(method)
            if bad is not None:
                yield pytest.param(service, method, bad, id=f"{method.name}-bad-utf8")
    append = COMMITLOG.methods_by_name["Append"]
    nested = bytes([(2 << 3) | 2, 4, (2 << 3) | 2, 2]) + BAD_UTF8
    yield pytest.param(COMMITLOG, append, nested, id="Append-bad-utf8-in-message-tags")


def _call_raw(channels, service, method, raw: bytes) -> grpc.RpcError:
    channel = channels[0] if service is COMMITLOG else channels[1]
    path = f"/{service.full_name}/{method.name}"
    with pytest.raises(grpc.RpcError) as info:
        if method.client_streaming:
            channel.stream_unary(path)(iter([raw]), timeout=RPC_TIMEOUT_S)
        elif method.server_streaming:
            next(channel.unary_stream(path)(raw, timeout=RPC_TIMEOUT_S))
        else:
            channel.unary_unary(path)(raw, timeout=RPC_TIMEOUT_S)
    return info.value


@pytest.mark.parametrize("service, method, raw", list(_cases()))
def test_unparsable_request_is_invalid_argument_and_logged_once(channels, service, method, raw):
    path = f"/{service.full_name}/{method.name}"
    with structlog.testing.capture_logs() as logs:
        error = _call_raw(channels, service, method, raw)
    assert error.code() == Code.INVALID_ARGUMENT, error.details()
    assert path in error.details() and "did not parse" in error.details()
    events = [e for e in logs if e["event"] == "rpc.request_unparsable"]
    assert [(e["method"], e["log_level"]) for e in events] == [(path, "warning")]
    _assert_still_serves(channels)


def test_bad_item_later_in_an_append_stream(channels, stub):
    good = pb.AppendRequest(topic="t", messages=[M(b"first")]).SerializeToString()
    path = f"/{COMMITLOG.full_name}/AppendStream"
    before = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="t", queue_id=1), timeout=RPC_TIMEOUT_S).max_offset
    with pytest.raises(grpc.RpcError) as info:
        channels[0].stream_unary(path)(iter([good, GARBAGE]), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.INVALID_ARGUMENT and "did not parse" in info.value.details()
    _assert_still_serves(channels)
    assert stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="t", queue_id=1), timeout=RPC_TIMEOUT_S).max_offset > before


# ---- 2. illegal or overlong topic names ------------------------------------------------------------

def _name_cases():
    for name in BAD_NAMES:
        short = name if len(name) < 10 else f"{len(name)}-chars"
        yield from (pytest.param(method, request_, id=f"{method}-{short}") for method, request_ in [
            ("UpdateTopic", pb.UpdateTopicRequest(name=name, queue_count=8)),
            ("DeleteTopic", pb.DeleteTopicRequest(name=name)),
            ("DescribeTopic", pb.DescribeTopicRequest(name=name)),
            ("Append", pb.AppendRequest(topic=name, messages=[M()])),
            ("Pull", pb.PullRequest(topic=name)),
            ("GetQueueInfo", pb.GetQueueInfoRequest(topic=name)),
            ("GetOffsetByTime", pb.GetOffsetByTimeRequest(topic=name)),
            ("CommitOffset", pb.CommitOffsetRequest(group="g", topic=name)),
            ("QueryOffset", pb.QueryOffsetRequest(group="g", topic=name)),
        ])


@pytest.mark.parametrize("method, request_", list(_name_cases()))
def test_illegal_topic_name_is_invalid_argument_with_the_pattern(channels, stub, method, request_):
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, method)(request_, timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.INVALID_ARGUMENT, info.value.details()
    assert NAME_PATTERN in info.value.details()
    _assert_still_serves(channels)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_illegal_topic_name_in_a_stream_or_tail_filter(channels, stub, name):
    with pytest.raises(grpc.RpcError) as info:
        stub.AppendStream(iter([pb.AppendRequest(topic=name, messages=[M()])]), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.INVALID_ARGUMENT and NAME_PATTERN in info.value.details()
    frames = stub.Tail(pb.TailRequest(start=pb.TAIL_START_EARLIEST, topics=["t", name]), timeout=RPC_TIMEOUT_S)
    with pytest.raises(grpc.RpcError) as tail_info:
        next(frames)
    assert tail_info.value.code() == Code.INVALID_ARGUMENT and NAME_PATTERN in tail_info.value.details()
    _assert_still_serves(channels)


def test_a_legal_unknown_topic_is_still_not_found(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Pull(pb.PullRequest(topic="no-such-topic"), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.NOT_FOUND


# ---- 3. system topics are written only by their owners ----------------------------------------------

@pytest.mark.parametrize("topic, owner", [("RMQ_SYS_TRANS_HALF_TOPIC", "Transaction service"),
                                          ("RMQ_SYS_TRANS_OP_HALF_TOPIC", "Transaction service"),
                                          ("TRANS_CHECK_MAX_TIME_TOPIC", "Transaction service"),
                                          ("SCHEDULE_TOPIC_XXXX", "scheduler")])
def test_user_appends_to_system_topics_are_refused(channels, stub, topic, owner):
    request_ = pb.AppendRequest(topic=topic, messages=[M()])
    for call in (lambda: stub.Append(request_, timeout=RPC_TIMEOUT_S),
                 lambda: stub.AppendStream(iter([request_]), timeout=RPC_TIMEOUT_S)):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == Code.FAILED_PRECONDITION
        assert topic in info.value.details() and owner in info.value.details()
    queue = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic=topic, queue_id=0), timeout=RPC_TIMEOUT_S)
    assert queue.max_offset == 0
    _assert_still_serves(channels)


# ---- 4. TAGS, KEYS and UNIQ_KEY: the same rules as field or as property ---------------------------------

@pytest.mark.parametrize("message, fragment", [
    (M(tags="A", properties={"TAGS": "B"}), "differ"),
    (M(keys=["x"], properties={"KEYS": "y"}), "differ"),
    (M(keys=["a", "b"], properties={"KEYS": "a"}), "differ"),
    (M(properties={"KEYS": "a  b"}), "KEYS"),
    (M(properties={"KEYS": " a"}), "KEYS"),
    (M(properties={"KEYS": "a\tb"}), "KEYS"),
    (M(keys=["a b"]), "keys"),
    (M(properties={"TAGS": ""}), "TAGS"),
    (M(properties={"UNIQ_KEY": ""}), "UNIQ_KEY"),
    (M(properties={"UNIQ_KEY": "a b"}), "UNIQ_KEY"),
    (M(properties={"UNIQ_KEY": "a\x01"}), "UNIQ_KEY"),
], ids=["tags-vs-TAGS", "keys-vs-KEYS", "keys-vs-fewer-KEYS", "KEYS-double-space", "KEYS-leading-space",
        "KEYS-tab", "key-with-space", "empty-TAGS", "empty-UNIQ_KEY", "UNIQ_KEY-space", "UNIQ_KEY-x01"])
def test_reserved_properties_are_checked_like_their_fields(channels, stub, message, fragment):
    with pytest.raises(grpc.RpcError) as info:
        stub.Append(pb.AppendRequest(topic="t", messages=[M(b"ok"), message]), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.INVALID_ARGUMENT, info.value.details()
    assert "messages[1]" in info.value.details() and fragment in info.value.details()
    _assert_still_serves(channels)


def test_field_or_property_whichever_is_set(stub):
    messages = [M(b"p", properties={"TAGS": "PropTag", "KEYS": "k1 k2", "UNIQ_KEY": "my-id-1"}, queue_id=0),
                M(b"f", tags="PropTag", keys=["k1", "k2"], properties={"TAGS": "PropTag", "KEYS": "k1 k2"},
                  queue_id=0)]
    results = stub.Append(pb.AppendRequest(topic="t", messages=messages), timeout=RPC_TIMEOUT_S).results
    assert results[0].uniq_key == "my-id-1"
    pulled = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=results[0].queue_offset, tags=["PropTag"]),
                       timeout=RPC_TIMEOUT_S).messages
    assert [(m.body, m.tags, list(m.keys)) for m in pulled] == [(b"p", "PropTag", ["k1", "k2"]),
                                                                (b"f", "PropTag", ["k1", "k2"])]


# ---- 5. born_timestamp_ms 0 is the server's time -------------------------------------------------------

def test_born_timestamp_zero_is_server_time(stub):
    before_ms = int(time.time() * 1000)
    results = stub.Append(pb.AppendRequest(topic="t", messages=[M(b"now", queue_id=0),
                                                                M(b"given", born_timestamp_ms=1234, queue_id=0)]),
                          timeout=RPC_TIMEOUT_S).results
    pulled = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=results[0].queue_offset),
                       timeout=RPC_TIMEOUT_S).messages
    assert before_ms <= pulled[0].born_timestamp_ms <= pulled[0].store_timestamp_ms
    assert pulled[1].born_timestamp_ms == 1234


# ---- 6. request size: the batch limit first, the transport limit past 64 MiB ----------------------------

def test_a_large_normal_batch_hits_the_batch_limit_first(channels, stub):
    messages = [M(b"x" * (5 * 1024))] * 1000  # 5 MiB of bodies: over the 4 MiB batch limit
    with pytest.raises(grpc.RpcError) as info:
        stub.Append(pb.AppendRequest(topic="t", messages=messages), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert "4 MiB" in info.value.details() and "split the batch" in info.value.details()
    _assert_still_serves(channels)


def test_a_request_over_the_transport_limit_is_resource_exhausted(channels, stub):
    messages = [M(b"x" * (3 * MiB + MiB // 2))] * 20  # 70 MiB: over the 64 MiB max_message_bytes
    with pytest.raises(grpc.RpcError) as info:
        stub.Append(pb.AppendRequest(topic="t", messages=messages), timeout=RPC_TIMEOUT_S * 3)
    assert info.value.code() == Code.RESOURCE_EXHAUSTED
    assert str(64 * MiB) in info.value.details()  # grpc's own message names the limit
    _assert_still_serves(channels)
