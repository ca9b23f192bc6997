"""Two gateways over one store (issue 34, item 3: ``make run-ha`` and docker-compose.ha.yml run two): the
official Python client given both endpoints (``host1:port;host2:port``) keeps sending through the other
when the one it uses is killed with kill -9 (a send in flight at the kill may fail after the client's own
attempts, reported to its caller), and a transactional producer on one gateway gets its
check-back while the other gateway holds a producer's Telemetry stream too.

The Python client makes one gRPC channel of both addresses (``ipv4:a,b``, sorted; gRPC's pick_first: the
first that connects), so all its calls go to the lowest address until it fails; the gateway's QueryRoute
answers with the endpoints the client sent (both), so its sends stay on that channel."""

from __future__ import annotations

import pytest

from tests.support.gateway import stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.e2e, pytest.mark.slow]
WAIT_S = 120
SENDS = 200


def test_sends_go_on_through_the_other_gateway_after_a_kill_9(tmp_path):
    topic = "twice"
    with stack(tmp_path, mode="cluster") as rig:
        rig.create_topic(topic, 4)
        other = rig.another_gateway()
        gateways = {rig.endpoint: rig.gateway, other.address: other}
        used = min(gateways)  # the client's channel sorts the addresses and connects to the first
        with rig.client("python", "producer", endpoint=";".join(gateways)) as producer:
            producer.call("producer", topics=[topic])
            producer.begin("send_stream", topic=topic, count=SENDS, prefix="during")
            wait_until(lambda: len(producer.sent_ids) >= 10, "sends under way", WAIT_S)
            gateways[used].kill9()
            killed_at = len(producer.sent_ids)
            result = producer.reply("send_stream", timeout_s=300)
            after = producer.call("send_stream", topic=topic, count=10, prefix="after")
        stored = {m.uniq_key for m in rig.visible(topic, 4)}
    print(f"kill -9 of gateway {used} after {killed_at} sends: {result}, then {after}")
    assert killed_at < SENDS, "the kill came after the last send"
    # The send in flight at the kill may fail after the client's own attempts: they are spent in its channel's
    # reconnection to the other address, which a busy machine can stretch past them (seen once in a suite run:
    # 199 sent, 1 failed, the failure reported to the caller). One such send, no more: every other goes through.
    assert result["failed"] <= 1 and result["sent"] + result["failed"] == SENDS, \
        "sends failed beyond the one in flight at the kill"
    assert (after["sent"], after["failed"]) == (10, 0)
    assert set(producer.sent_ids) <= stored and len(set(producer.sent_ids)) == result["sent"] + 10


def test_a_producer_on_one_gateway_gets_its_check_back_while_another_gateway_is_connected(tmp_path):
    """Gateway A holds a transactional producer (of another topic); the producer on gateway B leaves a
    transaction open: the check reaches it through B, the one gateway with a producer of its topic (the
    Transaction service offers a check only to CheckBack streams of its group, and a gateway keeps one
    open only for topics its own producers publish)."""
    with stack(tmp_path, mode="cluster") as rig:
        rig.create_topic("on_a", 1)
        rig.create_topic("on_b", 1)
        b = rig.another_gateway()
        with rig.client("python", "a", endpoint=rig.endpoint) as on_a, \
                rig.client("python", "b", endpoint=b.address) as on_b:
            on_a.call("producer", topics=["on_a"], check_answer="COMMIT")
            on_b.call("producer", topics=["on_b"], check_answer="COMMIT")
            half_a = on_a.call("half", topic="on_a", body="left open on A")
            half_b = on_b.call("half", topic="on_b", body="left open on B")
            check_b = on_b.next_event(WAIT_S)
            check_a = on_a.next_event(WAIT_S)
            committed = wait_until(lambda: {m.uniq_key for m in rig.visible("on_b", 1)}, "B's commit", WAIT_S)
    assert (check_b["message_id"], check_b["topic"]) == (half_b["message_id"], "on_b")
    assert (check_a["message_id"], check_a["topic"]) == (half_a["message_id"], "on_a")
    assert committed == {half_b["message_id"]}


def test_a_consumer_receives_and_acks_through_the_other_gateway_after_a_kill_9(tmp_path):
    """A SimpleConsumer given both endpoints: a message received through the gateway that is then killed is
    acked through the other (a receipt handle is the store's, not a gateway's), and the rest arrive there."""
    topic, count = "twice_pop", 20
    with stack(tmp_path, mode="cluster") as rig:
        rig.create_topic(topic, 2)
        other = rig.another_gateway()
        gateways = {rig.endpoint: rig.gateway, other.address: other}
        both = ";".join(gateways)
        with rig.client("python", "producer", endpoint=both) as producer, \
                rig.client("python", "consumer", endpoint=both) as consumer:
            producer.call("producer", topics=[topic])
            assert producer.call("send_stream", topic=topic, count=count, prefix="m")["sent"] == count
            consumer.call("consumer", group="g_twice", topic=topic, await_s=2)
            held = wait_until(lambda: consumer.call("receive", max=4, invisible_s=60)["messages"], "a first batch",
                              WAIT_S, poll_s=0)
            gateways[min(gateways)].kill9()
            for m in held:
                consumer.call("ack", handle=m["handle"])
            received = {m["body"] for m in held}

            def rest() -> bool:
                for m in consumer.call("receive", max=8, invisible_s=60, expect_error=None).get("messages", []):
                    received.add(m["body"])
                    consumer.call("ack", handle=m["handle"])
                return len(received) >= count
            wait_until(rest, "every message through the other gateway", WAIT_S, poll_s=0)
    assert received == {f"m-{i}" for i in range(count)}


def test_a_check_shown_to_a_producer_of_the_same_topic_on_the_other_gateway_does_not_keep_it_from_its_own(
        tmp_path):
    """Both gateways hold a producer of the topic (its producer group): the Transaction service offers the
    checks round robin to both CheckBack streams, as RocketMQ's broker to any producer of the group. The
    producer on A does not know B's transaction (UNKNOWN): the check goes to B next, whose producer commits."""
    with stack(tmp_path, mode="cluster") as rig:
        rig.create_topic("shared", 1)
        b = rig.another_gateway()
        with rig.client("python", "a", endpoint=rig.endpoint) as on_a, \
                rig.client("python", "b", endpoint=b.address) as on_b:
            on_a.call("producer", topics=["shared"], check_answer="UNKNOWN")
            on_b.call("producer", topics=["shared"], check_answer="COMMIT")
            half = on_b.call("half", topic="shared", body="prepared through B")
            check = on_b.next_event(WAIT_S)
            committed = wait_until(lambda: {m.uniq_key for m in rig.visible("shared", 1)}, "the commit", WAIT_S)
    assert check["message_id"] == half["message_id"]
    assert committed == {half["message_id"]}
