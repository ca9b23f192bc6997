"""kill -9 of the gateway and of the CommitLog service with messages in flight (in Local mode: of the commit
log process that serves the gateway), the official Python client
producing and consuming through it: every acknowledged send is received, no message acked before the
crash comes again, received-but-unacked messages come again (duplicates are counted and printed, never
a loss). And check-back across a gateway restart: a transaction left open is not given up while no
producer's Telemetry stream is back (the Python client re-opens its own only after up to 300 s); it is
asked as soon as a producer of its topic is reachable again.
"""

from __future__ import annotations

import collections
import queue

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc
from tests.support.gateway import MODES, stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.e2e, pytest.mark.slow]
WAIT_S = 120


# In Local mode the gateway is the commit log process: one victim.
@pytest.mark.parametrize("mode,victim", [("cluster", "gateway"), ("cluster", "commitlog"), ("local", "commitlog")])
def test_kill9_with_messages_in_flight_loses_nothing(tmp_path, mode, victim):
    topic = "crashy"
    with stack(tmp_path, mode=mode) as rig:
        rig.create_topic(topic, 4)
        with rig.client("python", "producer") as producer, rig.client("python", "consumer") as consumer:
            producer.call("producer", topics=[topic])
            consumer.call("consumer", group="g_crash", topic=topic, await_s=5)
            producer.call("send_stream", topic=topic, count=20, prefix="before")
            acked_before, in_flight, received = set(), set(), collections.Counter()
            first = wait_until(lambda: consumer.call("receive", max=10, invisible_s=5)["messages"], "a first batch",
                               WAIT_S, poll_s=0)
            for i, m in enumerate(first):
                received[m["message_id"]] += 1
                if i % 2 == 0:
                    consumer.call("ack", handle=m["handle"])
                    acked_before.add(m["message_id"])
                else:
                    in_flight.add(m["message_id"])
            before = len(producer.sent_ids)
            producer.begin("send_stream", topic=topic, count=60, prefix="during")
            wait_until(lambda: len(producer.sent_ids) >= before + 5, "the stream under way", WAIT_S)
            getattr(rig, victim).kill9()
            (rig.restart_gateway if victim == "gateway" else rig.restart_commitlog)()
            result = producer.reply("send_stream", timeout_s=300)
            # once the service is back, the same client sends again (after its channel's reconnect backoff)
            after = wait_until(lambda: (r := producer.call("send_stream", topic=topic, count=5, prefix="after"))
                               and r["sent"] == 5 and r, "sends through the restarted service", WAIT_S, poll_s=0.5)
        acknowledged = acknowledged_sends(rig, producer, topic)
        with rig.client("python", "consumer-after") as consumer:
            consumer.call("consumer", group="g_crash", topic=topic, await_s=5)
            wanted = acknowledged - acked_before

            def all_received():
                for m in consumer.call("receive", max=32, invisible_s=30)["messages"]:
                    received[m["message_id"]] += 1
                    consumer.call("ack", handle=m["handle"])
                return wanted <= set(received) and all(received[k] >= 2 for k in in_flight)
            wait_until(all_received, "every acknowledged message, and the unacked ones again", WAIT_S, poll_s=0)
    duplicates = sum(n - 1 for n in received.values() if n > 1)
    print(f"kill -9 of the {victim} ({mode} mode): {len(acknowledged)} sends acknowledged ({result['failed']} "
          f"refused while it was down, {after['failed']} after), all received; {duplicates} duplicate deliveries")
    assert all(received[k] == 1 for k in acked_before), "a message acked before the crash came again"


def acknowledged_sends(rig, producer, topic: str) -> set[str]:
    """The message ids whose send the client saw acknowledged (its "sent" events), checked against the store:
    every one of them is stored."""
    ids = set(producer.sent_ids)
    stored = {m.uniq_key for m in rig.visible(topic, 4)}
    missing = ids - stored
    assert not missing, f"acknowledged sends not in the store: {sorted(missing)[:5]}"
    return ids


def checks_sent(rig, transaction_id: str) -> tuple[int, str]:
    channel = grpc.insecure_channel(rig.txn.address)
    try:
        info = txn_pb2_grpc.TransactionStub(channel).Show(txn_pb2.ShowRequest(transaction_id=transaction_id),
                                                          timeout=10)
        return info.checks_sent, txn_pb2.TransactionState.Name(info.state)
    finally:
        channel.close()


@pytest.mark.parametrize("mode", MODES)
def test_check_back_after_a_gateway_restart_waits_for_a_reachable_producer(tmp_path, mode):
    topic = "orphans"
    with stack(tmp_path, mode=mode) as rig:
        rig.create_topic(topic, 1)
        with rig.client("python", "tx") as py:
            py.call("producer", topics=[topic], check_answer="UNKNOWN")
            half = py.call("half", topic=topic, body="orphan")
            assert py.next_event(WAIT_S)["message_id"] == half["message_id"]   # checked, answered UNKNOWN
            rig.gateway.kill9()
            rig.restart_gateway()
            # The Python producer still heartbeats and sends through the new gateway, but has no Telemetry
            # stream: no CheckBack stream is open for its topic, so no check is sent or counted. Observed
            # over three check intervals (2 s each).
            # (in Local mode the restart is the commit log's, which takes longer: the client's channel may be
            # in its reconnect backoff, so the send is repeated until it goes through)
            wait_until(lambda: py.call("send", topic=topic, body="after restart", expect_error=None)["ok"],
                       "a send through the restarted gateway", WAIT_S, poll_s=0.5)
            counted = checks_sent(rig, half["tx"])
            try:
                event = py.events.get(timeout=6)   # a bounded wait for an event that must not come
                pytest.fail(f"a check reached the producer without a Telemetry stream: {event}")
            except queue.Empty:
                pass
            assert checks_sent(rig, half["tx"]) == counted     # not counted, so never parked for it
            with rig.client("node", "tx") as node:   # a producer of the topic with a Telemetry stream
                node.call("producer", topics=[topic], check_answer="COMMIT")
                check = node.next_event(WAIT_S)
                assert check["message_id"] == half["message_id"]
                wait_until(lambda: checks_sent(rig, half["tx"])[1] == "TRANSACTION_STATE_COMMITTED",
                           "the commit answered by the other producer", WAIT_S)
        assert half["message_id"] in {m.uniq_key for m in rig.visible(topic, 1)}
