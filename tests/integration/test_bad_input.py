"""Bad input gets its exact status code and a message a person can act on; the server keeps serving.

One server serves the whole module, so every case runs against a server that has already seen the
earlier ones; after each case an Append must still succeed.
"""

from __future__ import annotations

import grpc
import pytest
import structlog

from commitlog_service.main import CommitLogConfig, serving
from mqstore import errors
from mqstore.config import StoreConfig
from mqstore_rpc.errors import INTERNAL_MESSAGE, STATUS_BY_ERROR, status_for
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ServerConfig, create_server

pytestmark = pytest.mark.integration

MAX_BODY_BYTES = 1024
MAX_STREAM_MESSAGES = 20
RPC_TIMEOUT_S = 10
Code = grpc.StatusCode


def M(body: bytes = b"x", **fields) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=body, **fields)


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    store = StoreConfig(data_dir=tmp_path_factory.mktemp("bad-input"), segment_size_bytes=64 * 1024,
                        preallocate_segments=False, max_body_bytes=MAX_BODY_BYTES,
                        max_stream_messages=MAX_STREAM_MESSAGES)
    with serving(CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0))) as (_, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            s = commitlog_pb2_grpc.CommitLogStub(channel)
            s.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=RPC_TIMEOUT_S)
            s.Append(pb.AppendRequest(topic="t", messages=[M(), M()]), timeout=RPC_TIMEOUT_S)
            yield s


# (id, method, request, expected code, a fragment the message must contain)
CASES = [
    ("oversized body", "Append", pb.AppendRequest(topic="t", messages=[M(b"x" * (MAX_BODY_BYTES + 1))]),
     Code.INVALID_ARGUMENT, str(MAX_BODY_BYTES)),
    ("empty topic on append", "Append", pb.AppendRequest(topic="", messages=[M()]), Code.INVALID_ARGUMENT, "topic"),
    ("empty topic on create", "CreateTopic", pb.CreateTopicRequest(name=""), Code.INVALID_ARGUMENT, "topic"),
    ("bad topic name", "CreateTopic", pb.CreateTopicRequest(name="a b"), Code.INVALID_ARGUMENT, "' '"),
    ("topic name too long", "CreateTopic", pb.CreateTopicRequest(name="a" * 128), Code.INVALID_ARGUMENT, "127"),
    ("1001 messages", "Append", pb.AppendRequest(topic="t", messages=[M()] * 1001), Code.INVALID_ARGUMENT, "1000"),
    ("no messages", "Append", pb.AppendRequest(topic="t"), Code.INVALID_ARGUMENT, "messages"),
    ("unknown topic on append", "Append", pb.AppendRequest(topic="nope", messages=[M()]), Code.NOT_FOUND, "nope"),
    ("unknown topic on pull", "Pull", pb.PullRequest(topic="nope"), Code.NOT_FOUND, "nope"),
    ("unknown topic on describe", "DescribeTopic", pb.DescribeTopicRequest(name="nope"), Code.NOT_FOUND, "nope"),
    ("unknown queue", "Pull", pb.PullRequest(topic="t", queue_id=7), Code.NOT_FOUND, "queue 7"),
    ("queue id outside topic", "Append", pb.AppendRequest(topic="t", messages=[M(queue_id=9)]),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("negative pull offset", "Pull", pb.PullRequest(topic="t", queue_id=0, offset=-1), Code.INVALID_ARGUMENT,
     "offset is -1; it must be 0 or more"),
    ("huge pull offset", "Pull", pb.PullRequest(topic="t", queue_id=0, offset=2**62), Code.OUT_OF_RANGE, "[0, 1]"),
    ("negative physical offset", "GetMessage", pb.GetMessageRequest(physical_offset=-1), Code.INVALID_ARGUMENT,
     "physical_offset is -1"),
    ("huge physical offset", "GetMessage", pb.GetMessageRequest(physical_offset=2**62), Code.OUT_OF_RANGE, "log"),
    ("physical offset inside a record", "GetMessage", pb.GetMessageRequest(physical_offset=1), Code.NOT_FOUND,
     "no record starts"),
    ("msg id of bad length", "GetMessage", pb.GetMessageRequest(msg_id="zz"), Code.INVALID_ARGUMENT, "32"),
    ("msg id not hex", "GetMessage", pb.GetMessageRequest(msg_id="Z" * 32), Code.INVALID_ARGUMENT, "msg_id"),
    ("missing oneof", "GetMessage", pb.GetMessageRequest(), Code.INVALID_ARGUMENT, "msg_id or physical_offset"),
    ("\\x01 in a property name", "Append", pb.AppendRequest(topic="t", messages=[M(properties={"a\x01": "b"})]),
     Code.INVALID_ARGUMENT, "\\x01"),
    ("\\x02 in a property value", "Append", pb.AppendRequest(topic="t", messages=[M(properties={"a": "b\x02"})]),
     Code.INVALID_ARGUMENT, "\\x02"),
    ("\\x01 in tags", "Append", pb.AppendRequest(topic="t", messages=[M(tags="a\x01")]), Code.INVALID_ARGUMENT,
     "tags"),
    ("properties too large", "Append", pb.AppendRequest(topic="t", messages=[M(properties={"a": "b" * 40_000})]),
     Code.INVALID_ARGUMENT, "32767"),
    ("unknown topic kind", "CreateTopic", pb.CreateTopicRequest(name="k", kind=9), Code.INVALID_ARGUMENT, "kind"),
    ("system topic create", "CreateTopic", pb.CreateTopicRequest(name="RMQ_SYS_MINE"), Code.FAILED_PRECONDITION,
     "system"),
    ("system topic delete", "DeleteTopic", pb.DeleteTopicRequest(name="RMQ_SYS_TRANS_HALF_TOPIC"),
     Code.FAILED_PRECONDITION, "system"),
    ("duplicate topic", "CreateTopic", pb.CreateTopicRequest(name="t"), Code.ALREADY_EXISTS, "'t'"),
    ("shrinking queues", "UpdateTopic", pb.UpdateTopicRequest(name="t", queue_count=1), Code.FAILED_PRECONDITION,
     "grow"),
    ("too many queues", "CreateTopic", pb.CreateTopicRequest(name="q", queue_count=5000), Code.INVALID_ARGUMENT,
     "1024"),
    ("commit past max", "CommitOffset", pb.CommitOffsetRequest(group="g", topic="t", queue_id=0, offset=99),
     Code.OUT_OF_RANGE, "99"),
    ("empty group", "CommitOffset", pb.CommitOffsetRequest(group="", topic="t", queue_id=0, offset=0),
     Code.INVALID_ARGUMENT, "group"),
    ("unknown time boundary", "GetOffsetByTime", pb.GetOffsetByTimeRequest(topic="t", boundary=7),
     Code.INVALID_ARGUMENT, "boundary"),
]


def _assert_still_serves(stub) -> None:
    results = stub.Append(pb.AppendRequest(topic="t", messages=[M(b"ok", queue_id=1)]), timeout=RPC_TIMEOUT_S).results
    assert len(results) == 1 and results[0].queue_id == 1


@pytest.mark.parametrize("method, request_, code, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_unary_request_gets_its_status(stub, method, request_, code, fragment):
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, method)(request_, timeout=RPC_TIMEOUT_S)
    assert info.value.code() == code, info.value.details()
    assert fragment in info.value.details()
    _assert_still_serves(stub)


@pytest.mark.parametrize("request_, code", [
    (pb.TailRequest(start=pb.TAIL_START_AT_OFFSET, from_physical_offset=-1), Code.INVALID_ARGUMENT),
    (pb.TailRequest(start=pb.TAIL_START_AT_OFFSET, from_physical_offset=2**62), Code.OUT_OF_RANGE),
    (pb.TailRequest(start=pb.TAIL_START_AT_OFFSET, from_physical_offset=1), Code.INVALID_ARGUMENT),
    (pb.TailRequest(start=9), Code.INVALID_ARGUMENT),
], ids=["negative", "huge", "inside a record", "unknown start"])
def test_bad_tail_request_gets_its_status(stub, request_, code):
    frames = stub.Tail(request_, timeout=RPC_TIMEOUT_S)
    with pytest.raises(grpc.RpcError) as info:
        next(frames)
    assert info.value.code() == code, info.value.details()
    _assert_still_serves(stub)


def test_append_stream_over_the_message_limit(stub):
    items = [pb.AppendRequest(topic="t", messages=[M(b"s%d" % i) for i in range(8)]) for _ in range(3)]
    with pytest.raises(grpc.RpcError) as info:
        stub.AppendStream(iter(items), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert str(MAX_STREAM_MESSAGES) in info.value.details()
    _assert_still_serves(stub)


def test_bad_item_in_a_stream_rejects_the_stream(stub):
    items = [pb.AppendRequest(topic="t", messages=[M()]), pb.AppendRequest(topic="nope", messages=[M()])]
    with pytest.raises(grpc.RpcError) as info:
        stub.AppendStream(iter(items), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.NOT_FOUND
    _assert_still_serves(stub)


def test_every_error_class_has_a_status():
    import mqstore.store  # noqa: F401  (loads every module that defines MqStoreError subclasses)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    unmapped = [cls.__qualname__ for cls in subclasses(errors.MqStoreError)
                if status_for(cls.__new__(cls)) == Code.INTERNAL]
    assert unmapped == []
    assert status_for(errors.FlushTimeout("late")) == Code.UNAVAILABLE
    assert status_for(errors.CorruptLog("bad", path="p", position=1, physical_offset=1)) == Code.DATA_LOSS
    assert set(STATUS_BY_ERROR.values()) >= {Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.OUT_OF_RANGE,
                                             Code.RESOURCE_EXHAUSTED, Code.FAILED_PRECONDITION, Code.UNAVAILABLE}


# ---- an unexpected exception is a bug: INTERNAL, logged, and the server goes on ----
# A bug cannot be caused through the real servicer on purpose, so a small service raises one.

def _raise_bug(request, context):
    raise RuntimeError("secret internal detail")


def _stream_then_bug(request, context):
    yield b"first"
    raise KeyError("secret internal detail")


def _raise_mapped(request, context):
    raise errors.OutOfRange("offset 5 is outside [0, 3]", min_value=0, max_value=3)


def _raise_huge(request, context):
    raise errors.NotFound("é" * 50_000)  # a message built from an unbounded value that escaped shown()


@pytest.fixture
def faulty_channel():
    server = create_server(ServerConfig(port=0, grace_s=0.5))
    server.grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Faulty", {
        "Bug": grpc.unary_unary_rpc_method_handler(_raise_bug),
        "StreamBug": grpc.unary_stream_rpc_method_handler(_stream_then_bug),
        "Mapped": grpc.unary_unary_rpc_method_handler(_raise_mapped),
        "Huge": grpc.unary_unary_rpc_method_handler(_raise_huge),
    }),))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield channel
    finally:
        server.stop()


def test_unexpected_exception_is_internal_logged_and_survivable(faulty_channel):
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(grpc.RpcError) as info:
            faulty_channel.unary_unary("/test.Faulty/Bug")(b"", timeout=RPC_TIMEOUT_S)
        stream = faulty_channel.unary_stream("/test.Faulty/StreamBug")(b"", timeout=RPC_TIMEOUT_S)
        assert next(stream) == b"first"
        with pytest.raises(grpc.RpcError) as stream_info:
            next(stream)
    for failure in (info.value, stream_info.value):
        assert failure.code() == Code.INTERNAL
        assert failure.details() == INTERNAL_MESSAGE and "secret" not in failure.details()
    events = [e for e in logs if e["event"] == "rpc.internal_error"]
    assert [e["method"] for e in events] == ["/test.Faulty/Bug", "/test.Faulty/StreamBug"]
    assert all(e["log_level"] == "error" and e["exc_info"] is not None for e in events)

    with pytest.raises(grpc.RpcError) as mapped:
        faulty_channel.unary_unary("/test.Faulty/Mapped")(b"", timeout=RPC_TIMEOUT_S)
    assert mapped.value.code() == Code.OUT_OF_RANGE and mapped.value.details() == "offset 5 is outside [0, 3]"
    trailers = dict(mapped.value.trailing_metadata())
    assert (trailers["mqstore-min-value"], trailers["mqstore-max-value"]) == ("0", "3")


def test_a_failed_background_duty_turns_health_not_serving():
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    problem = [""]
    server = create_server(ServerConfig(port=0, grace_s=0.5))
    server.add_service_names(["test.Faulty"])
    monitor = server.monitor_health(lambda: problem[0], interval_s=3600)  # polled by hand below
    server.start()
    server.mark_serving()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status(service: str) -> int:
                return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S).status

            assert status("") == status("test.Faulty") == health_pb2.HealthCheckResponse.SERVING
            problem[0] = "flush service failed: disk on fire"
            with structlog.testing.capture_logs() as logs:
                monitor.check_once()
            assert status("") == status("test.Faulty") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert [(e["event"], e["problem"]) for e in logs] == [("health.not_serving", problem[0])]
            problem[0] = ""
            monitor.check_once()
            assert status("") == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop()


def test_a_huge_status_message_is_cut_and_keeps_its_code(faulty_channel):
    """The last line of defence: 100 KB of message (300 KB percent-encoded) would overflow gRPC's ~8 KiB of
    headers and come back as another error; cut, it keeps its code and says it was cut."""
    with pytest.raises(grpc.RpcError) as info:
        faulty_channel.unary_unary("/test.Faulty/Huge")(b"", timeout=RPC_TIMEOUT_S)
    assert info.value.code() == Code.NOT_FOUND
    details = info.value.details()
    assert details.startswith("é" * 100) and details.endswith("(cut: the message had 100000 bytes)")
    assert len(details.encode()) < 2200
