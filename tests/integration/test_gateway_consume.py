"""Simple consumers of the official RocketMQ 5 clients (Python 5.1.2, Node 1.0.8), unchanged, through the
gateway onto mqstore's pop consumption: receive and ack with tag filters and SQL92 subscriptions, every
queue of a multi-queue topic (the Node client names only queue 0), redelivery after the invisible time
with the attempt count, a stale receipt handle refused, ChangeInvisibleDuration, the dead-letter topic
after max attempts, and an ordered (FIFO) group fed by the FIFO producer (the Python client's, and the Node
client's on both ends): every message group in order, a stalled one holding up only itself.

The gateway runs with --max-delivery-attempts 3 (advertised to the clients in their settings)."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import consumer_pb2, consumer_pb2_grpc
from tests.support.gateway import CLIENTS, MODES, RPC_TIMEOUT_S, stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]
MAX_ATTEMPTS = 3
WAIT_S = 60


@pytest.fixture(scope="module", params=MODES)
def rig(request, tmp_path_factory):
    with stack(tmp_path_factory.mktemp(f"gateway-{request.param}"), mode=request.param,
               gateway_args=("--max-delivery-attempts", str(MAX_ATTEMPTS))) as s:
        yield s


@pytest.fixture(scope="module")
def producer(rig):
    with rig.client("python", "producer") as client:
        client.call("producer", topics=[])
        yield client


def produce(producer, topic: str, count: int, **fields) -> list[dict]:
    return [producer.call("send", topic=topic, body=f"{topic}-{i}", **fields) for i in range(count)]


def receive_all(consumer, expected: int, **fields) -> list[dict]:
    """Receive until ``expected`` messages came (each receive long-polls; bounded by the deadline)."""
    got: list[dict] = []

    def more():
        got.extend(consumer.call("receive", **fields)["messages"])
        return len(got) >= expected
    wait_until(more, f"{expected} messages", WAIT_S, poll_s=0)
    return got


@pytest.mark.parametrize("kind", CLIENTS)
def test_receive_and_ack_with_a_tag_filter(rig, producer, kind):
    topic = f"tags_{kind}"
    rig.create_topic(topic, 2)
    wanted = produce(producer, topic, 6, tag="wanted", keys=["k1", "k2"])
    produce(producer, topic, 4, tag="other")
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=f"g_tags_{kind}", topic=topic, tag="wanted || none", await_s=5)
        got = receive_all(consumer, 6, max=16, invisible_s=30)
        assert sorted(m["message_id"] for m in got) == sorted(w["message_id"] for w in wanted)
        for m in got:
            assert (m["tag"], m["keys"], m["attempt"], m["corrupted"]) == ("wanted", ["k1", "k2"], 1, False)
            assert m["body"].startswith(topic) and m["receipt_handle"]
            consumer.call("ack", handle=m["handle"])
        assert consumer.call("receive", max=16, invisible_s=30)["messages"] == []   # acked, and the rest filtered


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_sql92_subscription_receives_what_its_expression_selects(rig, producer, kind):
    topic = f"sql_{kind}"
    rig.create_topic(topic, 2)
    sent = [producer.call("send", topic=topic, body=f"{topic}-{i}", tag="paid" if i % 2 else "open",
                          properties={"region": "eu" if i % 3 == 0 else "us", "price": str(i * 10)})
            for i in range(12)]
    wanted = sorted(sent[i]["message_id"] for i in range(12) if i % 2 and i % 3 == 0 or i * 10 >= 100)
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=f"g_sql_{kind}", topic=topic, await_s=5,
                      sql="(TAGS = 'paid' AND region = 'eu') OR price >= 100 AND missing IS NULL")
        got = receive_all(consumer, len(wanted), max=16, invisible_s=30)
        assert sorted(m["message_id"] for m in got) == wanted
        assert {m["properties"].get("region") for m in got} == {"eu", "us"}
    with rig.client(kind, "consumer") as consumer:  # ILLEGAL_FILTER_EXPRESSION, as the client reports it
        consumer.call("consumer", group=f"g_sql_bad_{kind}", topic=topic, await_s=1, sql="price >")
        refused = consumer.call("receive", expect_error=True, max=16, invisible_s=30)
        assert "column 8" in refused["error"], refused


@pytest.mark.parametrize("kind", CLIENTS)
def test_every_queue_of_a_multi_queue_topic_is_received(rig, producer, kind):
    topic = f"multi_{kind}"
    rig.create_topic(topic, 8)
    sent = produce(producer, topic, 24)
    assert len({m.queue_id for m in rig.visible(topic, 8)}) > 1
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=f"g_multi_{kind}", topic=topic, await_s=5)
        got = receive_all(consumer, 24, max=32, invisible_s=30)
        for m in got:
            consumer.call("ack", handle=m["handle"])
    assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_unacked_message_comes_again_with_the_next_attempt(rig, producer, kind):
    topic = f"redeliver_{kind}"
    rig.create_topic(topic, 2)
    sent = produce(producer, topic, 1, tag="t", keys=["again"])
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=f"g_redeliver_{kind}", topic=topic, await_s=5)
        first = receive_all(consumer, 1, max=4, invisible_s=1)[0]
        second = receive_all(consumer, 1, max=4, invisible_s=30)[0]   # after the 1 s invisible time
        assert first["message_id"] == second["message_id"] == sent[0]["message_id"]
        assert (first["attempt"], second["attempt"]) == (1, 2)
        assert (second["tag"], second["keys"], second["body"]) == ("t", ["again"], first["body"])
        assert second["topic"] == topic
        consumer.call("ack", handle=second["handle"])
        assert consumer.call("receive", max=4, invisible_s=30)["messages"] == []


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_stale_receipt_handle_is_refused_and_the_new_one_works(rig, producer, kind):
    topic = f"stale_{kind}"
    rig.create_topic(topic, 1)
    produce(producer, topic, 1)
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=f"g_stale_{kind}", topic=topic, await_s=5)
        got = receive_all(consumer, 1, max=4, invisible_s=30)[0]
        old_handle = got["receipt_handle"]
        new_handle = consumer.call("change", handle=got["handle"], invisible_s=30)["receipt_handle"]
        assert new_handle and new_handle != old_handle
        refused = consumer.call("ack", handle=got["handle"], receipt_handle=old_handle, expect_error=True)
        assert "40013" in refused["error"] or "INVALID_RECEIPT_HANDLE" in refused["error"] or \
            refused.get("code") == 40013, refused
        garbage = consumer.call("ack", handle=got["handle"], receipt_handle="not-a-handle", expect_error=True)
        assert "40013" in garbage["error"] or garbage.get("code") == 40013, garbage
        consumer.call("ack", handle=got["handle"], receipt_handle=new_handle)


@pytest.mark.parametrize("kind", CLIENTS)
def test_change_invisible_duration_brings_a_message_back_sooner(rig, producer, kind):
    """Received invisible for 10 minutes, then changed to 1 s: it comes again within seconds, and the
    delivery attempt counts it (the change alone does not)."""
    topic = f"change_{kind}"
    rig.create_topic(topic, 1)
    sent = produce(producer, topic, 1)
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=f"g_change_{kind}", topic=topic, await_s=5)
        got = receive_all(consumer, 1, max=4, invisible_s=600)[0]
        consumer.call("change", handle=got["handle"], invisible_s=1)
        again = receive_all(consumer, 1, max=4, invisible_s=30)[0]
        assert again["message_id"] == sent[0]["message_id"]
        assert (got["attempt"], again["attempt"]) == (1, 2)
        consumer.call("ack", handle=again["handle"])


@pytest.mark.parametrize("kind", CLIENTS)
def test_the_dead_letter_topic_after_max_attempts(rig, producer, kind):
    topic, group = f"dlq_{kind}", f"g_dlq_{kind}"
    rig.create_topic(topic, 1)
    sent = produce(producer, topic, 1, tag="poison")
    attempts = []
    with rig.client(kind, "consumer") as consumer:
        consumer.call("consumer", group=group, topic=topic, await_s=5)
        for _ in range(MAX_ATTEMPTS):
            attempts += [m["attempt"] for m in receive_all(consumer, 1, max=4, invisible_s=1)]
        dead = wait_until(lambda: visible_if_created(rig, f"%DLQ%{group}"), "the dead-letter copy", WAIT_S)
        assert consumer.call("receive", max=4, invisible_s=30)["messages"] == []
    assert attempts == list(range(1, MAX_ATTEMPTS + 1))
    assert [m.uniq_key for m in dead] == [sent[0]["message_id"]]
    assert dead[0].tags == "poison" and dead[0].properties["DLQ_ORIGIN_TOPIC"] == topic


def visible_if_created(rig, topic: str) -> list:
    """The messages of a topic pop consumption creates on first use; none while it does not exist."""
    try:
        return rig.visible(topic, 1)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return []


def test_a_python_push_consumer_consumes_and_a_failure_comes_again(rig, producer):
    """The Python PushConsumer: QueryAssignment, receives with auto_renew, a failed consumption nacked
    (ChangeInvisibleDuration) and delivered again with the next attempt."""
    topic = "push_python"
    rig.create_topic(topic, 2)
    sent = {s["message_id"]: f"{topic}-{i}" for i, s in enumerate(produce(producer, topic, 3))}
    with rig.client("python", "push") as consumer:
        done = consumer.call("push", group="g_push", topic=topic, fail=[f"{topic}-1"], expect=3, wait_s=WAIT_S)
        consumed = [consumer.events.get_nowait() for _ in range(consumer.events.qsize())]
    assert done["complete"], done
    consumed = [e for e in consumed if e.get("event") == "consumed"]
    assert {e["message_id"] for e in consumed} == set(sent)
    again = [(e["attempt"], e["failed"]) for e in consumed if e["body"] == f"{topic}-1"]
    assert again[:2] == [(1, True), (2, False)]


# Cluster mode only (it waits out 8 s of invisible time): the order is the commit log's, the same code in both
# modes, and the push test below covers both modes' fifo.
@pytest.mark.parametrize("rig", ["cluster"], indirect=True)
def test_an_ordered_group_keeps_each_message_group_in_order_and_a_stalled_one_holds_up_only_itself(rig, producer):
    topic, group = "fifo_order", "g_fifo_python"
    rig.create_topic(topic, 2)
    channel = rig.channel()
    try:
        consumer_pb2_grpc.ConsumerStub(channel).SetGroupSettings(
            consumer_pb2.GroupSettings(group=group, ordered=True), timeout=RPC_TIMEOUT_S)
    finally:
        channel.close()

    def send(places):
        for place in places:
            for g in ("A", "B", "C"):
                producer.call("send", topic=topic, body=f"{g}{place}", group=g)

    def by_group(messages):
        out: dict[str, list] = {}
        for m in messages:
            assert m["group"] == m["body"][0]
            out.setdefault(m["group"], []).append(m)
        return out

    send(range(3))
    with rig.client("python", "fifo") as consumer:
        consumer.call("consumer", group=group, topic=topic, await_s=5)
        first = by_group(receive_all(consumer, 9, max=32, invisible_s=8))
        assert {g: [m["body"] for m in ms] for g, ms in first.items()} == {
            g: [f"{g}{i}" for i in range(3)] for g in "ABC"}  # each group in its order (several in a batch)
        for m in first["B"] + first["C"]:  # A's consumer stalls: it acks nothing
            consumer.call("ack", handle=m["handle"])
        send(range(3, 5))
        flowing = receive_all(consumer, 4, max=32, invisible_s=30)
        assert sorted(m["body"] for m in flowing) == ["B3", "B4", "C3", "C4"]  # A waits; B and C go on
        for m in flowing:
            consumer.call("ack", handle=m["handle"])
        again = receive_all(consumer, 5, max=32, invisible_s=30)  # after A0's invisible time: in place, in order
        assert [(m["body"], m["attempt"]) for m in again] == [("A0", 2), ("A1", 2), ("A2", 2), ("A3", 1), ("A4", 1)]
        assert [m["message_id"] for m in again[:3]] == [m["message_id"] for m in first["A"]]
        for m in again:
            consumer.call("ack", handle=m["handle"])


@pytest.mark.parametrize("rig", ["cluster"], indirect=True)  # Cluster mode only: the same commit log code in both
def test_node_fifo_producer_and_simple_consumer_of_an_ordered_group_keep_every_message_group_in_order(rig):
    """The Node client on both ends (its Producer with message groups, its SimpleConsumer on an ordered group):
    every group in the order sent, and a group whose messages are not acked holds up only itself (its
    redelivery in place is the Python test's above: the same commit log code)."""
    topic, group = "fifo_node", "g_fifo_node"
    rig.create_topic(topic, 2)
    channel = rig.channel()
    try:
        consumer_pb2_grpc.ConsumerStub(channel).SetGroupSettings(
            consumer_pb2.GroupSettings(group=group, ordered=True), timeout=RPC_TIMEOUT_S)
    finally:
        channel.close()
    with rig.client("node", "fifo") as client:
        client.call("producer", topics=[topic])

        def send(places):
            for place in places:
                for g in ("A", "B", "C", "D"):
                    client.call("send", topic=topic, body=f"{g}{place}", group=g)
        send(range(3))
        client.call("consumer", group=group, topic=topic, await_s=5)
        first: dict[str, list] = {}
        for m in receive_all(client, 12, max=32, invisible_s=30):
            assert m["group"] == m["body"][0]
            first.setdefault(m["group"], []).append(m)
        assert {g: [m["body"] for m in ms] for g, ms in first.items()} == {
            g: [f"{g}{i}" for i in range(3)] for g in "ABCD"}  # each group in its order
        for m in first["B"] + first["C"] + first["D"]:  # A's consumer stalls: it acks nothing
            client.call("ack", handle=m["handle"])
        send(range(3, 5))
        flowing = receive_all(client, 6, max=32, invisible_s=30)
        assert sorted(m["body"] for m in flowing) == ["B3", "B4", "C3", "C4", "D3", "D4"]  # A waits; the rest go on
        for g in "BCD":
            assert [m["body"] for m in flowing if m["group"] == g] == [f"{g}3", f"{g}4"]


def test_a_python_push_consumer_of_an_ordered_group_is_told_fifo_and_consumes_each_group_in_order(rig, producer):
    """subscription.fifo reaches the official client: its PushConsumer switches to its FIFO consumption
    (each message group in its own sequential task)."""
    topic, group = "fifo_push", "g_fifo_push"
    rig.create_topic(topic, 2)
    channel = rig.channel()
    try:
        consumer_pb2_grpc.ConsumerStub(channel).SetGroupSettings(
            consumer_pb2.GroupSettings(group=group, ordered=True), timeout=RPC_TIMEOUT_S)
    finally:
        channel.close()
    for place in range(4):
        for g in ("P", "Q"):
            producer.call("send", topic=topic, body=f"{g}{place}", group=g)
    with rig.client("python", "push-fifo") as consumer:
        done = consumer.call("push", group=group, topic=topic, expect=8, wait_s=WAIT_S)
        consumed = [consumer.events.get_nowait() for _ in range(consumer.events.qsize())]
    assert done["complete"] and done["fifo"] is True, done
    bodies = [e["body"] for e in consumed if e.get("event") == "consumed"]
    for g in ("P", "Q"):
        assert [b for b in bodies if b.startswith(g)] == [f"{g}{i}" for i in range(4)]
