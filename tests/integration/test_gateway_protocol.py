"""The gateway's wire contract, checked with raw apache.rocketmq.v2 stubs against a commit log, a Transaction
service and a gateway in this process (real gRPC on 127.0.0.1, port 0), the gateway in both deployments
(Cluster mode: its own server calling the commit log over gRPC; Local mode: served by the commit log's
composition, calling the store directly): statuses in ``Status.code`` with
the gRPC status OK, the receive stream's shape (exactly one status item, then the delivery time and the
messages, then the end, inside the caller's deadline), the route advertising only what works, and the
calls and message types the gateway refuses with the protocol's own codes."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import grpc
import pytest

from gateway_service.main import GatewayServiceConfig, serving as gateway_serving
from mqstore.gateway import publishing
from mqstore.gateway.config import GatewayConfig
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.server import ServerConfig
from tests.integration.txn_testing import commitlog, commitlog_with_gateway, txn_service, wait_ready
from tests.support.gateway import MODES, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
CLIENT = (("x-mq-client-id", "protocol-test"),)
TIMEOUT_S = 10
ENDPOINTS = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=8081)])


GATEWAY = GatewayConfig(long_poll_min_ms=1000, long_poll_max_ms=3000)


@contextlib.contextmanager
def cluster_gateway(tmp):
    with commitlog(tmp / "log") as (log_port, log_stub):
        create_topics(log_stub)
        with txn_service(tmp / "txn", log_port) as (txn_server, txn_stub):
            wait_ready(txn_stub)
            config = GatewayServiceConfig(gateway=GATEWAY, server=ServerConfig(port=0),
                                          commitlog_address=f"127.0.0.1:{log_port}",
                                          txn_address=f"127.0.0.1:{txn_server.port}")
            with gateway_serving(config) as (_, port):
                yield port, log_stub


@contextlib.contextmanager
def local_gateway(tmp):
    """The commit log serving the gateway itself; it is told the Transaction service's port first."""
    txn_port = free_port()
    with commitlog_with_gateway(tmp / "log", txn_port, GATEWAY) as (_, log_port, gateway_port, log_stub):
        create_topics(log_stub)
        with txn_service(tmp / "txn", log_port, port=txn_port) as (_, txn_stub):
            wait_ready(txn_stub)
            yield gateway_port, log_stub


def create_topics(log_stub) -> None:
    log_stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=3), timeout=TIMEOUT_S)
    log_stub.CreateTopic(cpb.CreateTopicRequest(name="kv", queue_count=2, kind=2), timeout=TIMEOUT_S)
    log_stub.CreateTopic(cpb.CreateTopicRequest(name="delayed", queue_count=1), timeout=TIMEOUT_S)
    log_stub.CreateTopic(cpb.CreateTopicRequest(name="fifo", queue_count=4), timeout=TIMEOUT_S)


@pytest.fixture(scope="module", params=MODES)
def rig(request, tmp_path_factory):
    """(a MessagingService stub on the gateway, a CommitLog stub on the store behind it)"""
    tmp = tmp_path_factory.mktemp(f"protocol-{request.param}")
    with (cluster_gateway if request.param == "cluster" else local_gateway)(tmp) as (port, log_stub):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield service_pb2_grpc.MessagingServiceStub(channel), log_stub
        finally:
            channel.close()


@pytest.fixture(scope="module")
def stub(rig):
    return rig[0]


def message(body: bytes, message_id: str, topic: str = "t", message_type=d.NORMAL, **system) -> d.Message:
    m = d.Message(topic=d.Resource(name=topic), body=body)
    m.system_properties.message_id = message_id
    m.system_properties.message_type = message_type
    for name, value in system.items():
        setattr(m.system_properties, name, value)
    return m


def send(stub, *messages) -> s.SendMessageResponse:
    return stub.SendMessage(s.SendMessageRequest(messages=list(messages)), metadata=CLIENT, timeout=TIMEOUT_S)


def receive(stub, group: str, *, poll_ms: int, timeout_s: float, topic: str = "t", queue_id: int = 0):
    request = s.ReceiveMessageRequest(group=d.Resource(name=group), message_queue=d.MessageQueue(
        topic=d.Resource(name=topic), id=queue_id), filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
        batch_size=32)
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    started = time.monotonic()
    items = list(stub.ReceiveMessage(request, metadata=CLIENT, timeout=timeout_s))
    return items, time.monotonic() - started


def test_a_route_names_every_queue_and_only_the_types_that_work(stub):
    r = stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="t"), endpoints=ENDPOINTS), metadata=CLIENT,
                        timeout=TIMEOUT_S)
    assert r.status.code == d.OK
    assert [q.id for q in r.message_queues] == [0, 1, 2]
    assert set(r.message_queues[0].accept_message_types) == {d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION}
    assert r.message_queues[0].broker.endpoints == ENDPOINTS
    kv = stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="kv"), endpoints=ENDPOINTS), metadata=CLIENT,
                         timeout=TIMEOUT_S)
    assert list(kv.message_queues[0].accept_message_types) == [d.NORMAL]
    missing = stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="nope"), endpoints=ENDPOINTS),
                              metadata=CLIENT, timeout=TIMEOUT_S)
    assert missing.status.code == d.TOPIC_NOT_FOUND and "nope" in missing.status.message
    no_endpoints = stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="t")), metadata=CLIENT,
                                   timeout=TIMEOUT_S)
    assert no_endpoints.status.code == d.ILLEGAL_ACCESS_POINT


def test_a_call_without_a_client_id_is_refused_in_the_status(stub):
    r = stub.Heartbeat(s.HeartbeatRequest(client_type=d.PRODUCER), timeout=TIMEOUT_S)
    assert r.status.code == d.CLIENT_ID_REQUIRED and "x-mq-client-id" in r.status.message


def test_sends_answer_per_entry_and_refuse_what_does_not_work(stub):
    ok = send(stub, message(b"a", "01AA"))
    assert ok.status.code == d.OK and [(e.status.code, e.message_id) for e in ok.entries] == [(d.OK, "01AA")]
    delayed = send(stub, message(b"b", "01AB", message_type=d.DELAY))  # no delivery_timestamp
    assert delayed.status.code == d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert "delivery_timestamp" in delayed.status.message
    lite = send(stub, message(b"b", "01AB", message_type=d.LITE))
    assert lite.status.code == d.UNSUPPORTED and "LITE" in lite.status.message
    reserved = message(b"c", "01AC")
    reserved.user_properties["UNIQ_KEY"] = "forged"
    assert send(stub, reserved).status.code == d.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert send(stub, message(b"d", "")).status.code == d.ILLEGAL_MESSAGE_ID
    assert send(stub, message(b"x" * (4 * 1024 * 1024 + 1), "01AD")).status.code == d.MESSAGE_BODY_TOO_LARGE
    mixed = send(stub, message(b"e", "01AE"), message(b"f", "01AF", topic="nope"))
    assert mixed.status.code == d.MULTIPLE_RESULTS
    assert [e.status.code for e in mixed.entries] == [d.OK, d.TOPIC_NOT_FOUND]


def test_an_empty_receive_is_one_status_item_before_the_deadline(stub):
    items, elapsed_s = receive(stub, "g_empty", poll_ms=1000, timeout_s=4, topic="kv")
    assert [i.WhichOneof("content") for i in items] == ["status"]
    assert items[0].status.code in (d.NOT_FOUND, d.BAD_REQUEST)  # kv is COMPACTION: pop refuses it
    items, elapsed_s = receive(stub, "g_empty", poll_ms=20_000, timeout_s=2.0, topic="t", queue_id=1)
    assert elapsed_s < 2.0   # the long poll ended before the caller's deadline, not at the gateway's maximum


def test_a_receive_is_status_then_time_then_messages_from_every_queue(stub):
    ids = [f"02{i:030X}" for i in range(6)]
    for i, message_id in enumerate(ids):
        assert send(stub, message(f"m{i}".encode(), message_id)).status.code == d.OK
    got, kinds = [], []
    while not set(ids) <= {m.system_properties.message_id for m in got}:
        items, _ = receive(stub, "g_shape", poll_ms=1000, timeout_s=5, queue_id=0)  # queue 0 names the topic
        kinds.append([i.WhichOneof("content") for i in items])
        got += [i.message for i in items if i.WhichOneof("content") == "message"]
    for shape in kinds:
        assert shape[0] == "status" and shape.count("status") == 1
        if len(shape) > 1:
            assert shape[1] == "delivery_timestamp" and set(shape[2:]) == {"message"}
    assert len({m.system_properties.queue_id for m in got}) > 1


def test_a_garbage_receipt_handle_is_refused_and_the_old_one_echoed(stub):
    ack = stub.AckMessage(s.AckMessageRequest(group=d.Resource(name="g"), topic=d.Resource(name="t"), entries=[
        s.AckMessageEntry(message_id="01", receipt_handle="garbage")]), metadata=CLIENT, timeout=TIMEOUT_S)
    assert ack.status.code == d.INVALID_RECEIPT_HANDLE == ack.entries[0].status.code
    request = s.ChangeInvisibleDurationRequest(group=d.Resource(name="g"), topic=d.Resource(name="t"),
                                               receipt_handle="garbage", message_id="01")
    request.invisible_duration.FromMilliseconds(10_000)
    changed = stub.ChangeInvisibleDuration(request, metadata=CLIENT, timeout=TIMEOUT_S)
    assert changed.status.code == d.INVALID_RECEIPT_HANDLE and changed.receipt_handle == "garbage"


def test_calls_the_gateway_does_not_serve_answer_not_implemented(stub):
    assert stub.UpdateOffset(s.UpdateOffsetRequest(), metadata=CLIENT, timeout=TIMEOUT_S).status.code == \
        d.NOT_IMPLEMENTED
    pulled = list(stub.PullMessage(s.PullMessageRequest(), metadata=CLIENT, timeout=TIMEOUT_S))
    assert [p.status.code for p in pulled] == [d.NOT_IMPLEMENTED]


def test_an_end_of_an_unknown_transaction_is_an_invalid_transaction_id(stub):
    r = stub.EndTransaction(s.EndTransactionRequest(topic=d.Resource(name="t"), message_id="01",
                                                    transaction_id="no-such-tx", resolution=d.COMMIT,
                                                    source=d.SOURCE_CLIENT), metadata=CLIENT, timeout=TIMEOUT_S)
    assert r.status.code == d.INVALID_TRANSACTION_ID


def test_forward_to_the_dead_letter_queue_moves_the_message_for_good(stub):
    assert send(stub, message(b"poison", "03AA", topic="t")).status.code == d.OK
    found = []
    while not found:
        items, _ = receive(stub, "g_forward", poll_ms=1000, timeout_s=5)
        found = [i.message for i in items if i.WhichOneof("content") == "message"
                 and i.message.system_properties.message_id == "03AA"]
    handle = found[0].system_properties.receipt_handle
    forwarded = stub.ForwardMessageToDeadLetterQueue(s.ForwardMessageToDeadLetterQueueRequest(
        group=d.Resource(name="g_forward"), topic=d.Resource(name="t"), receipt_handle=handle, message_id="03AA",
        delivery_attempt=1, max_delivery_attempts=1), metadata=CLIENT, timeout=TIMEOUT_S)
    assert forwarded.status.code == d.OK and "%DLQ%g_forward" in forwarded.status.message
    again = stub.ForwardMessageToDeadLetterQueue(s.ForwardMessageToDeadLetterQueueRequest(
        group=d.Resource(name="g_forward"), topic=d.Resource(name="t"), receipt_handle=handle, message_id="03AA"),
        metadata=CLIENT, timeout=TIMEOUT_S)
    assert again.status.code == d.INVALID_RECEIPT_HANDLE   # not in flight any more
    route = stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="%DLQ%g_forward"), endpoints=ENDPOINTS),
                            metadata=CLIENT, timeout=TIMEOUT_S)
    assert route.status.code == d.OK and len(route.message_queues) == 1   # the DLQ can be read like a topic...
    assert route.message_queues[0].permission == d.READ                  # ...and only pop consumption writes it
    refused = send(stub, message(b"x", "03AB", topic="%DLQ%g_forward"))
    assert refused.status.code == d.PRECONDITION_FAILED and "dead-letter" in refused.status.message


def _readers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gateway-telemetry-reader")]


@pytest.mark.parametrize("ending", ["client cancels", "client ends its writes"])
def test_a_telemetry_streams_reader_thread_ends_with_its_stream(stub, ending):
    """Each Telemetry stream's reader thread (telemetry.py) is the stream's helper: once the stream is over,
    whichever side ended it, no reader thread is left (counted by name, with a deadline)."""
    wait_until(lambda: not _readers(), "the readers of earlier streams to end")
    requests: queue.Queue = queue.Queue()
    call = stub.Telemetry(iter(requests.get, None), metadata=(("x-mq-client-id", f"reader-{len(ending)}"),),
                          timeout=TIMEOUT_S * 3)
    requests.put(s.TelemetryCommand(settings=d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(
        topics=[d.Resource(name="t")]))))
    assert next(call).HasField("settings")
    assert len(_readers()) == 1
    if ending == "client cancels":
        call.cancel()
    else:
        requests.put(None)  # the client's writes end: the reader detaches, the server ends the stream
        assert list(call) == []
    wait_until(lambda: not _readers(), "the stream's reader thread to end with its stream")


def test_a_delay_message_comes_at_its_time_with_its_delivery_timestamp(stub):
    due_ms = int(time.time() * 1000) + 700
    delayed = message(b"later", "05AA", topic="delayed", message_type=d.DELAY)
    delayed.system_properties.delivery_timestamp.FromMilliseconds(due_ms)
    assert send(stub, delayed).status.code == d.OK
    got = []

    def arrived():
        items, _ = receive(stub, "g_delay", poll_ms=1000, timeout_s=5, topic="delayed")
        got.extend(i.message for i in items if i.WhichOneof("content") == "message")
        return got
    wait_until(arrived, "the delayed message received", timeout_s=20)
    (m,) = got
    sp = m.system_properties
    assert sp.message_id == "05AA" and sp.message_type == d.DELAY
    assert sp.delivery_timestamp.ToMilliseconds() == due_ms
    assert sp.store_timestamp.ToMilliseconds() >= due_ms  # never early
    assert not any(name.startswith("TIMER_") for name in m.user_properties)


def test_a_delivery_time_past_the_limit_or_in_the_wrong_unit_is_illegal(stub):
    too_far = message(b"x", "05AB", topic="delayed", message_type=d.DELAY)
    too_far.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 4 * 86_400_000)
    answer = send(stub, too_far)
    assert answer.status.code == d.ILLEGAL_DELIVERY_TIME and "--timer-max-delay-ms" in answer.status.message
    python_client = message(b"x", "05AC", topic="delayed", message_type=d.DELAY)
    python_client.system_properties.delivery_timestamp.seconds = int(time.time() * 1000) + 10_000  # ms as seconds
    answer = send(stub, python_client)
    assert answer.status.code == d.ILLEGAL_DELIVERY_TIME and "Timestamp.seconds" in answer.status.message


def recall(stub, handle: str, topic: str = "delayed") -> s.RecallMessageResponse:
    request = s.RecallMessageRequest(topic=d.Resource(name=topic), recall_handle=handle)
    return stub.RecallMessage(request, metadata=CLIENT, timeout=TIMEOUT_S)


def test_a_recalled_delay_message_is_never_delivered_and_bad_or_late_handles_are_refused(stub):
    due_ms = int(time.time() * 1000) + 3000
    doomed = message(b"never", "05B0", topic="delayed", message_type=d.DELAY)
    doomed.system_properties.delivery_timestamp.FromMilliseconds(due_ms)
    kept = message(b"kept", "05B1", topic="delayed", message_type=d.DELAY)
    kept.system_properties.delivery_timestamp.FromMilliseconds(due_ms + 200)
    (entry,) = send(stub, doomed).entries
    (kept_entry,) = send(stub, kept).entries
    assert entry.status.code == d.OK and entry.recall_handle and kept_entry.recall_handle != entry.recall_handle
    assert not send(stub, message(b"now", "05B2")).entries[0].recall_handle  # only DELAY sends have one

    assert recall(stub, entry.recall_handle, topic="t").status.code == d.BAD_REQUEST  # another topic's handle
    assert recall(stub, "not a handle!").status.code == d.BAD_REQUEST
    assert recall(stub, "").status.code == d.BAD_REQUEST
    recalled = recall(stub, entry.recall_handle)
    assert (recalled.status.code, recalled.message_id) == (d.OK, "05B0")
    again = recall(stub, entry.recall_handle)  # idempotent, as the commit log's RecallTimer
    assert (again.status.code, again.message_id) == (d.OK, "05B0")
    unknown = publishing.recall_handle("delayed", "0" * 32, "05B9")  # well formed, names no message
    assert recall(stub, unknown).status.code == d.NOT_FOUND

    got = []

    def kept_arrived():
        items, _ = receive(stub, "g_recall", poll_ms=1000, timeout_s=5, topic="delayed")
        got.extend(i.message.system_properties.message_id for i in items if i.WhichOneof("content") == "message")
        return "05B1" in got
    wait_until(kept_arrived, "the message due after the recalled one received", timeout_s=20)
    assert "05B0" not in got  # the recalled one, due 200 ms earlier, never came
    late = recall(stub, kept_entry.recall_handle)
    assert late.status.code == d.NOT_FOUND and "due already" in late.status.message


def test_a_batch_of_fifo_messages_of_several_groups_keeps_each_groups_order_in_its_queue(rig):
    stub, log_stub = rig
    groups = [f"order-{g}" for g in range(5)]  # RocketMQ's proxy round-robins a batch over queues (#7999)
    batch = [message(f"{group}:{i}".encode(), f"06{g:02X}{i:02X}", topic="fifo", message_type=d.FIFO,
                     message_group=group) for i in range(6) for g, group in enumerate(groups)]
    answer = send(stub, *batch)
    assert answer.status.code == d.OK and [e.message_id for e in answer.entries] == \
        [m.system_properties.message_id for m in batch]
    stored: dict[str, list[tuple[int, str]]] = {}
    for queue_id in range(4):
        pulled = log_stub.Pull(cpb.PullRequest(topic="fifo", queue_id=queue_id, offset=0, max_messages=100),
                               timeout=TIMEOUT_S)
        for m in pulled.messages:
            stored.setdefault(m.properties["__SHARDINGKEY"], []).append((queue_id, m.body.decode()))
    assert set(stored) == set(groups)
    for group, landed in stored.items():
        assert len({queue_id for queue_id, _ in landed}) == 1, f"{group} spread over queues: {landed}"
        assert [body for _, body in landed] == [f"{group}:{i}" for i in range(6)]  # in the order sent
