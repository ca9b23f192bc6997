"""The Consumer service (pop consumption, consumer.proto) through real gRPC on 127.0.0.1 (port 0), real files,
the real revive duty and clock."""

from __future__ import annotations

import concurrent.futures
import pathlib
import time

import grpc
import pytest

from commitlog_service.main import CommitLogConfig, serving
from mqstore.config import StoreConfig
from mqstore.pop.config import PopConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, consumer_pb2 as cpb, consumer_pb2_grpc
from mqstore_rpc.server import ServerConfig

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 10


def make_config(data_dir: pathlib.Path, pop: PopConfig = PopConfig()) -> CommitLogConfig:  # noqa: B008 - frozen
    store = StoreConfig(data_dir=data_dir, segment_size_bytes=256 * 1024, preallocate_segments=False)
    return CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0), pop=pop)


class Stubs:
    def __init__(self, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.log = commitlog_pb2_grpc.CommitLogStub(self.channel)
        self.pop = consumer_pb2_grpc.ConsumerStub(self.channel)

    def topic(self, name: str, queues: int = 2) -> None:
        self.log.CreateTopic(pb.CreateTopicRequest(name=name, queue_count=queues), timeout=RPC_TIMEOUT_S)

    def send(self, topic: str, bodies: list[bytes], tags: str = "") -> None:
        messages = [common_pb2.MessageInput(body=b, tags=tags) for b in bodies]
        self.log.Append(pb.AppendRequest(topic=topic, messages=messages), timeout=RPC_TIMEOUT_S)

    def receive(self, topic: str, group: str = "g", timeout_s: float = RPC_TIMEOUT_S, **kw) -> cpb.ReceiveResponse:
        kw.setdefault("invisible_duration_ms", 30_000)
        return self.pop.Receive(cpb.ReceiveRequest(group=group, topic=topic, **kw), timeout=timeout_s)

    def ack(self, topic: str, handles: list[str], group: str = "g") -> cpb.AckResponse:
        return self.pop.Ack(cpb.AckRequest(group=group, topic=topic, receipt_handles=handles), timeout=RPC_TIMEOUT_S)


@pytest.fixture
def stubs(tmp_path):
    with serving(make_config(tmp_path / "data")) as (_, port):
        s = Stubs(port)
        yield s
        s.channel.close()


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_receive_with_a_tag_filter_then_ack(stubs):
    stubs.topic("orders")
    stubs.send("orders", [b"a1", b"a2"], tags="paid")
    stubs.send("orders", [b"b1"], tags="open")
    response = stubs.receive("orders", filter_expression="paid || shipped", batch_size=32)
    assert sorted(m.message.body for m in response.messages) == [b"a1", b"a2"]
    for m in response.messages:
        assert m.topic == "orders" and m.message.topic == "orders" and m.delivery_attempt == 1
        assert m.next_visible_time_ms == response.pop_time_ms + 30_000 and m.receipt_handle.startswith("v1:")
    acked = stubs.ack("orders", [m.receipt_handle for m in response.messages] + ["nonsense"])
    assert [r.status for r in acked.results] == [cpb.ACK_STATUS_OK] * 2 + [cpb.ACK_STATUS_INVALID_HANDLE]
    assert acked.durability == common_pb2.DURABILITY_WRITTEN and "nonsense" in acked.results[2].receipt_handle
    again = stubs.ack("orders", [response.messages[0].receipt_handle])
    assert again.results[0].status == cpb.ACK_STATUS_NOT_IN_FLIGHT and "acked" in again.results[0].message
    stats = stubs.pop.Stats(cpb.PopStatsRequest(group="g", topic="orders"), timeout=RPC_TIMEOUT_S)
    assert (stats.received, stats.acked, stats.filtered, stats.group_in_flight) == (2, 2, 1, 0)
    assert [q.topic for q in stats.queues] == ["orders", "orders", "%RETRY%g+orders"]


def test_receive_with_an_sql92_filter(stubs):
    stubs.topic("priced")
    messages = [common_pb2.MessageInput(body=b"%d" % i, tags="paid" if i % 2 else "open",
                                        properties={"price": str(i * 10)}) for i in range(8)]
    stubs.log.Append(pb.AppendRequest(topic="priced", messages=messages), timeout=RPC_TIMEOUT_S)
    sql = common_pb2.FILTER_TYPE_SQL92
    response = stubs.receive("priced", filter_type=sql, filter_expression="TAGS = 'paid' AND price BETWEEN 20 AND 60")
    assert sorted(m.message.body for m in response.messages) == [b"3", b"5"]
    stats = stubs.pop.Stats(cpb.PopStatsRequest(group="g", topic="priced"), timeout=RPC_TIMEOUT_S)
    assert (stats.received, stats.filtered) == (2, 6)
    with pytest.raises(grpc.RpcError) as caught:
        stubs.receive("priced", filter_type=sql, filter_expression="price BETWEEN 1 2")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "column 17: expected AND between BETWEEN's two bounds" in caught.value.details()


def test_status_codes(stubs):
    stubs.topic("t")
    stubs.send("t", [b"x"])
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: stubs.receive("t", invisible_duration_ms=0)) == invalid
    assert code_of(lambda: stubs.receive("t", group="no spaces")) == invalid
    assert code_of(lambda: stubs.receive("t", filter_expression="a ||")) == invalid
    assert code_of(lambda: stubs.receive("rmq_sys_REVIVE_LOG")) == invalid
    assert code_of(lambda: stubs.receive("missing")) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: stubs.receive("t", queue_id=7)) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: stubs.ack("t", [])) == invalid
    (m,) = stubs.receive("t").messages
    change = cpb.ChangeInvisibleDurationRequest(group="g", topic="t", receipt_handle="v1:garbage",
                                                invisible_duration_ms=5_000)
    assert code_of(lambda: stubs.pop.ChangeInvisibleDuration(change, timeout=RPC_TIMEOUT_S)) == invalid
    change.receipt_handle = m.receipt_handle
    changed = stubs.pop.ChangeInvisibleDuration(change, timeout=RPC_TIMEOUT_S)
    assert changed.receipt_handle != m.receipt_handle and changed.delivery_attempt == 1
    with pytest.raises(grpc.RpcError) as info:  # the old handle stopped working
        stubs.pop.ChangeInvisibleDuration(change, timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "in flight" in info.value.details()
    forward = cpb.ForwardToDeadLetterRequest(group="g", topic="t", receipt_handle=changed.receipt_handle)
    moved = stubs.pop.ForwardToDeadLetter(forward, timeout=RPC_TIMEOUT_S)
    assert moved.dead_letter_topic == "%DLQ%g" and moved.result.queue_offset == 0
    dead = stubs.log.Pull(pb.PullRequest(topic="%DLQ%g", offset=0), timeout=RPC_TIMEOUT_S).messages
    assert [d.body for d in dead] == [b"x"] and dead[0].properties["DLQ_ORIGIN_TOPIC"] == "t"
    assert code_of(lambda: stubs.log.Append(pb.AppendRequest(topic="%DLQ%g", messages=[common_pb2.MessageInput(
        body=b"y")]), timeout=RPC_TIMEOUT_S)) == grpc.StatusCode.FAILED_PRECONDITION


def test_an_unacked_message_wakes_a_waiting_receive_with_attempt_two_then_goes_to_the_dlq(stubs):
    stubs.topic("jobs", 1)
    stubs.send("jobs", [b"job"])
    first = stubs.receive("jobs", invisible_duration_ms=300, max_attempts=2)
    assert [m.delivery_attempt for m in first.messages] == [1]
    started = time.monotonic()
    second = stubs.receive("jobs", invisible_duration_ms=300, max_attempts=2, long_poll_ms=20_000, timeout_s=30)
    assert time.monotonic() - started < 20  # woken by the retry copy, not by the end of the poll
    (again,) = second.messages
    assert (again.delivery_attempt, again.message.topic, again.message.reconsume_times) == (2, "%RETRY%g+jobs", 1)
    assert again.message.uniq_key == first.messages[0].message.uniq_key
    assert again.message.properties["RETRY_TOPIC"] == "jobs"
    third = stubs.receive("jobs", invisible_duration_ms=300, max_attempts=2, long_poll_ms=1_500, timeout_s=30)
    assert list(third.messages) == []  # its second delivery expired unacked: dead-lettered, not redelivered

    def dead_letters():
        try:
            return stubs.log.Pull(pb.PullRequest(topic="%DLQ%g", offset=0), timeout=RPC_TIMEOUT_S).messages
        except grpc.RpcError as exc:  # NOT_FOUND until the revive duty creates it
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            return []
    deadline = time.monotonic() + 20
    while not dead_letters() and time.monotonic() < deadline:
        stubs.receive("jobs", invisible_duration_ms=300, long_poll_ms=200)  # a bounded wait, not a sleep
    assert [m.body for m in dead_letters()] == [b"job"]


def test_a_long_poll_ends_before_the_callers_deadline(stubs):
    stubs.topic("quiet", 1)
    started = time.monotonic()
    response = stubs.receive("quiet", long_poll_ms=30_000, timeout_s=1.5)
    assert list(response.messages) == [] and time.monotonic() - started < 1.5


def test_pop_and_pull_with_commit_offset_on_one_topic(stubs):
    stubs.topic("shared", 1)
    stubs.send("shared", [b"%d" % i for i in range(6)])
    popped = stubs.receive("shared", group="poppers", batch_size=4)
    assert [m.message.body for m in popped.messages] == [b"0", b"1", b"2", b"3"]
    pulled = stubs.log.Pull(pb.PullRequest(topic="shared", offset=0, max_messages=2), timeout=RPC_TIMEOUT_S)
    stubs.log.CommitOffset(pb.CommitOffsetRequest(group="pullers", topic="shared", offset=pulled.next_offset),
                           timeout=RPC_TIMEOUT_S)
    rest = stubs.receive("shared", group="poppers", batch_size=4)
    assert [m.message.body for m in rest.messages] == [b"4", b"5"]
    offset = stubs.log.QueryOffset(pb.QueryOffsetRequest(group="pullers", topic="shared"), timeout=RPC_TIMEOUT_S)
    assert offset.offset == 2
    again = stubs.log.Pull(pb.PullRequest(topic="shared", offset=2), timeout=RPC_TIMEOUT_S)
    assert [m.body for m in again.messages] == [b"2", b"3", b"4", b"5"]


def test_in_flight_cap_gives_resource_exhausted(tmp_path):
    with serving(make_config(tmp_path / "data", PopConfig(pop_max_in_flight=3))) as (_, port):
        stubs = Stubs(port)
        stubs.topic("t")
        stubs.send("t", [b"%d" % i for i in range(5)])
        assert len(stubs.receive("t", batch_size=5).messages) == 3
        with pytest.raises(grpc.RpcError) as info:
            stubs.receive("t")
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "pop_max_in_flight" in info.value.details()
        stubs.channel.close()


def test_concurrent_receivers_of_one_group_share_the_messages(stubs):
    stubs.topic("many", 4)
    bodies = [b"%d" % i for i in range(200)]
    stubs.send("many", bodies)

    def consume() -> list[bytes]:
        got = []
        while True:
            response = stubs.receive("many", batch_size=16)
            if not response.messages:
                return got
            stubs.ack("many", [m.receipt_handle for m in response.messages])
            got += [m.message.body for m in response.messages]

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = [f.result(timeout=60) for f in [pool.submit(consume) for _ in range(4)]]
    everything = [b for r in results for b in r]
    assert sorted(everything) == sorted(bodies)  # each exactly once
