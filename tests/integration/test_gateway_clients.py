"""The official RocketMQ 5 clients, unchanged and pinned (Python 5.1.2 and Node 1.0.8), against the real
CommitLog, Transaction and gateway services on free ports: produce with tags and keys, FIFO groups,
transactions committed and rolled back, check-back answered COMMIT, ROLLBACK and UNKNOWN, and delayed messages
(and their recall).

Each client runs in a subprocess (tests/support/gateway.py). What a client sends is checked in the
store itself (Pull through the CommitLog API): the message id it got back is the stored UNIQ_KEY, its
tag and keys are the stored TAGS and KEYS.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc
from tests.support.gateway import ALL_LOCAL, CLIENTS, MODES, NODE_DIR, ROOT, client_command, stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]
WAIT_S = 60
# A stack trace on stderr: a Node one ("    at fn (file.js:1:2)") or a Python one.
STACK_TRACE = re.compile(r"^\s+at \S.*:\d+:\d+\)?$|^Traceback \(most recent call last\)", re.M)


@pytest.fixture(scope="module", params=(*MODES, ALL_LOCAL))  # ALL_LOCAL: the SDKs' transactions on the Local
def rig(request, tmp_path_factory):                            # Transaction port (grpc.aio), found by default
    with stack(tmp_path_factory.mktemp(f"gateway-{request.param}"), mode=request.param) as s:
        yield s


def by_uniq_key(rig, topic: str, queues: int = 4) -> dict:
    return {m.uniq_key: m for m in rig.visible(topic, queues)}


@pytest.mark.parametrize("kind", CLIENTS)
def test_produce_with_tags_and_keys_lands_in_the_store(rig, kind):
    topic = f"produce_{kind}"
    rig.create_topic(topic, 4)
    with rig.client(kind) as client:
        client.call("producer", topics=[topic])
        sent = [client.call("send", topic=topic, body=f"body-{i}", tag=f"tag{i % 2}", keys=[f"key{i}", "common"],
                            properties={"color": "blue"}) for i in range(8)]
    stored = by_uniq_key(rig, topic)
    assert set(stored) == {s["message_id"] for s in sent}
    for i, s in enumerate(sent):
        m = stored[s["message_id"]]
        assert (m.body, m.tags, sorted(m.keys)) == (f"body-{i}".encode(), f"tag{i % 2}", sorted([f"key{i}", "common"]))
        assert m.properties["color"] == "blue"
        assert m.queue_offset == s["offset"]
    # the gateway chose the queues (the Node client names queue 0 for every send)
    assert len({m.queue_id for m in stored.values()}) > 1


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_message_group_keeps_its_messages_in_one_queue(rig, kind):
    topic = f"fifo_{kind}"
    rig.create_topic(topic, 4)
    with rig.client(kind) as client:
        client.call("producer", topics=[topic])
        sent = [client.call("send", topic=topic, body=f"{group}-{i}", group=group)
                for i in range(4) for group in ("g-a", "g-b", "g-c")]
    stored = by_uniq_key(rig, topic)
    assert set(stored) == {s["message_id"] for s in sent}
    for group in ("g-a", "g-b", "g-c"):
        mine = sorted((m for m in stored.values() if m.body.startswith(group.encode())), key=lambda m: m.queue_offset)
        assert len({m.queue_id for m in mine}) == 1
        assert [m.body for m in mine] == [f"{group}-{i}".encode() for i in range(4)]
        assert all(m.properties["__SHARDINGKEY"] == group for m in mine)


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_delayed_message_is_received_at_its_time_and_a_recalled_one_never(rig, kind):
    topic = f"delay_{kind}"
    rig.create_topic(topic, 1)
    with rig.client(kind) as client:
        client.call("producer", topics=[topic])
        if kind == "python":  # 5.1.2 puts msg.delivery_timestamp into Timestamp.seconds: seconds work
            when = dict(delivery_timestamp=int(time.time()) + 2)
            refused = client.call("send", topic=topic, body="ms", delivery_timestamp=int(time.time() * 1000) + 2000,
                                  expect_error=True)  # milliseconds, as its docs say: the unit mistake is named
            assert "Timestamp.seconds" in refused["error"]
        else:
            when = dict(delay_ms=1500)
        doomed = client.call("send", topic=topic, body="recalled", **when)  # due first, never delivered
        sent = client.call("send", topic=topic, body="later", **when)
        recalled = client.call("recall", topic=topic, recall_handle=doomed["recall_handle"])
        assert recalled["message_id"] == doomed["message_id"]
        client.call("consumer", group=f"g_delay_{kind}", topic=topic, await_s=5)
        got = wait_until(lambda: client.call("receive", max=4)["messages"], "the delayed message", WAIT_S)
        too_late = client.call("recall", topic=topic, recall_handle=sent["recall_handle"], expect_error=True)
    assert "due already" in too_late["error"]  # NOT_FOUND, which both clients raise
    assert [m["message_id"] for m in got] == [sent["message_id"]] and got[0]["body"] == "later"
    (stored,) = by_uniq_key(rig, topic, 1).values()
    due = int(stored.properties["TIMER_DELIVER_MS"])
    assert got[0]["delivery_timestamp"] == due and stored.store_timestamp_ms >= due  # reported, and never early


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_unknown_topic_is_refused(rig, kind):
    with rig.client(kind) as client:
        client.call("producer", topics=[])
        reply = client.call("send", topic="no_such_topic", body="x", expect_error=True)
    assert "no_such_topic" in reply["error"] or "40402" in reply["error"] or "route" in reply["error"]


@pytest.mark.parametrize("kind", CLIENTS)
def test_transactions_commit_and_rollback(rig, kind):
    topic = f"txn_{kind}"
    rig.create_topic(topic, 2)
    with rig.client(kind) as client:
        client.call("producer", topics=[topic], check_answer="UNKNOWN")
        committed = client.call("half", topic=topic, body="to-commit", tag="paid")
        rolled_back = client.call("half", topic=topic, body="to-roll-back")
        assert committed["tx"] and rolled_back["tx"]
        assert by_uniq_key(rig, topic, 2) == {}        # halves are invisible
        client.call("end", tx=committed["tx"], decision="commit")
        client.call("end", tx=rolled_back["tx"], decision="rollback")
        stored = wait_until(lambda: by_uniq_key(rig, topic, 2), "the committed message", WAIT_S)
    assert list(stored) == [committed["message_id"]]
    assert (stored[committed["message_id"]].body, stored[committed["message_id"]].tags) == (b"to-commit", "paid")


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("answer", ["COMMIT", "ROLLBACK"])
def test_check_back_reaches_the_producer_over_telemetry(rig, kind, answer):
    """A half left open is checked back through the producer's Telemetry stream; the checker's answer
    (an EndTransaction from the check) resolves it."""
    topic = f"check_{kind}_{answer.lower()}"
    rig.create_topic(topic, 1)
    with rig.client(kind) as client:
        client.call("producer", topics=[topic], check_answer=answer)
        half = client.call("half", topic=topic, body="orphan")
        check = client.next_event(WAIT_S)
        assert (check["event"], check["message_id"], check["topic"], check["body"]) == (
            "check", half["message_id"], topic, "orphan")
        if answer == "COMMIT":
            stored = wait_until(lambda: by_uniq_key(rig, topic, 1), "the message committed by check-back", WAIT_S)
            assert list(stored) == [half["message_id"]]
        else:
            wait_until(lambda: txn_state(rig, half["tx"]) == "ROLLED_BACK", "the rollback by check-back", WAIT_S)
            assert by_uniq_key(rig, topic, 1) == {}


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_unknown_answer_leaves_the_transaction_open_and_it_is_asked_again(rig, kind):
    topic = f"unknown_{kind}"
    rig.create_topic(topic, 1)
    with rig.client(kind) as client:
        client.call("producer", topics=[topic], check_answer="UNKNOWN")
        half = client.call("half", topic=topic, body="undecided")
        first = client.next_event(WAIT_S)
        assert first["message_id"] == half["message_id"]
        client.call("answer", check_answer="COMMIT")
        again = client.next_event(WAIT_S)   # the Transaction service asks again: it was not resolved
        assert again["message_id"] == half["message_id"]
        stored = wait_until(lambda: by_uniq_key(rig, topic, 1), "the message committed on the second check", WAIT_S)
    assert list(stored) == [half["message_id"]]


def txn_state(rig, transaction_id: str) -> str:
    channel = grpc.insecure_channel(rig.txn_address)
    try:
        info = txn_pb2_grpc.TransactionStub(channel).Show(txn_pb2.ShowRequest(transaction_id=transaction_id),
                                                          timeout=10)
        return txn_pb2.TransactionState.Name(info.state).removeprefix("TRANSACTION_STATE_")
    finally:
        channel.close()


@pytest.mark.parametrize("kind", CLIENTS)
def test_the_readmes_quickstart_examples_run_as_written(rig, kind, tmp_path):
    """README.md's "RocketMQ 5 clients" section runs examples/gateway/quickstart.{py,js}: each sends three
    messages and receives and acks them through the gateway."""
    topic = f"quickstart_{kind}"
    rig.create_topic(topic, 2)
    interpreter = client_command(kind, rig.endpoint)[0]
    script = ROOT / "examples" / "gateway" / ("quickstart.py" if kind == "python" else "quickstart.js")
    env = {**os.environ, "HOME": str(tmp_path), "NODE_PATH": str(NODE_DIR / "node_modules")}
    done = subprocess.run([interpreter, str(script), rig.endpoint, topic], capture_output=True, text=True, env=env,
                          timeout=WAIT_S * 2, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert STACK_TRACE.search(done.stderr) is None, done.stderr[-3000:]  # a clean run: no stack trace at shutdown
    sent = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("sent ")]
    received = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("received ")]
    assert len(sent) == 3 and set(received) == set(sent)
    assert set(by_uniq_key(rig, topic, 2)) == set(sent)
