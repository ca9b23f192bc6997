"""The check-back relay (mqstore.gateway.checkback) with fake CheckBack streams: one stream per topic a
reachable producer publishes, a check relayed onto that producer's outbox, a check nobody can take left
unanswered (never answered in the producer's place), and answers routed back on the stream the check
came on, or resolved directly when that stream is gone."""

from __future__ import annotations

import queue
import threading

from mqstore.clock import FakeClock
from mqstore.gateway.checkback import COMMIT, ROLLBACK, UNKNOWN, Check, CheckRelay, RecoverTransaction
from mqstore.gateway.clients import PRODUCER, ClientRegistry
from mqstore.model import StoredMessage
from tests.support.waiting import wait_until
from tests.unit.gateway.messages import stored


class FakeStream:
    def __init__(self, topic: str):
        self.topic = topic
        self.incoming: queue.Queue = queue.Queue()
        self.answers: list[tuple[int, str]] = []
        self.closed = threading.Event()

    def checks(self):
        while not self.closed.is_set():
            try:
                check = self.incoming.get(timeout=0.05)
            except queue.Empty:
                continue
            yield check

    def answer(self, check_id: int, decision: str) -> bool:
        if self.closed.is_set():
            return False
        self.answers.append((check_id, decision))
        return True

    def cancel(self) -> None:
        self.closed.set()


class FakeResolver:
    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def commit(self, transaction_id: str, topic: str) -> None:
        self.calls.append(("commit", transaction_id, topic))

    def rollback(self, transaction_id: str, topic: str) -> None:
        self.calls.append(("rollback", transaction_id, topic))


def half() -> StoredMessage:
    return stored(properties={"UNIQ_KEY": "ID1", "REAL_TOPIC": "t"}, topic="RMQ_SYS_TRANS_HALF_TOPIC")


def rig():
    reg = ClientRegistry(FakeClock(), max_clients=10, ttl_ms=60_000, outbox_limit=2)
    streams: dict[str, FakeStream] = {}

    def open_stream(topic):
        streams[topic] = FakeStream(topic)
        return streams[topic]
    resolver = FakeResolver()
    relay = CheckRelay(reg, open_stream, resolver, max_topics=10, pending_max=100, retry_max_ms=100)
    reg.on_change(relay.sync)
    return reg, streams, resolver, relay


def test_one_stream_per_topic_of_a_reachable_producer():
    reg, streams, _, relay = rig()
    try:
        reg.apply_settings("p", PRODUCER, ["t1", "t2"], "")
        assert relay.topics() == []           # no Telemetry stream yet: not reachable, nothing opened
        outbox = reg.attach("p")
        reg.apply_settings("p", PRODUCER, ["t1", "t2"], "")
        assert relay.topics() == ["t1", "t2"]
        wait_until(lambda: set(streams) == {"t1", "t2"}, "both streams open")
        reg.detach("p", outbox)
        assert relay.topics() == []
        assert all(s.closed.is_set() for s in streams.values())
    finally:
        relay.close()


def test_a_check_goes_to_a_producer_and_its_answer_back_on_the_same_stream():
    reg, streams, resolver, relay = rig()
    try:
        outbox = reg.attach("p")
        reg.apply_settings("p", PRODUCER, ["t"], "")
        wait_until(lambda: "t" in streams, "the stream")
        streams["t"].incoming.put(Check(7, "tx-1", "t", [half()]))
        command = wait_until(lambda: outbox.take(0.05), "the command on the producer's outbox")
        assert isinstance(command, RecoverTransaction) and command.transaction_id == "tx-1" and command.topic == "t"
        relay.resolve("tx-1", COMMIT, from_check=True, topic="t")
        assert streams["t"].answers == [(7, COMMIT)] and resolver.calls == []
    finally:
        relay.close()


def test_a_check_nobody_can_take_is_left_unanswered():
    reg, _, resolver, relay = rig()
    stream = FakeStream("t")
    relay.deliver(stream, Check(1, "tx-1", "t", [half()]))      # no producer of t at all
    reg.attach("other")
    reg.apply_settings("other", PRODUCER, ["elsewhere"], "")
    relay.deliver(stream, Check(2, "tx-2", "t", [half()]))      # a producer, but not of t
    assert stream.answers == [] and resolver.calls == []
    assert relay.stats()["unrouted"] == 2 and relay.stats()["pending"] == 0
    relay.close()


def test_a_full_outbox_leaves_the_check_unanswered():
    reg, _, _, relay = rig()
    outbox = reg.attach("p")
    reg.apply_settings("p", PRODUCER, ["t"], "")
    relay.close()   # no streams needed: deliver by hand
    stream = FakeStream("t")
    for i in range(3):
        relay.deliver(stream, Check(i, f"tx-{i}", "t", [half()]))
    assert [outbox.take(0).transaction_id, outbox.take(0).transaction_id] == ["tx-0", "tx-1"]
    assert relay.stats()["unrouted"] == 1 and stream.answers == []


def test_answers_without_a_live_check_resolve_directly():
    reg, _, resolver, relay = rig()
    reg.attach("p")
    reg.apply_settings("p", PRODUCER, ["t"], "")
    relay.close()
    stream = FakeStream("t")
    relay.deliver(stream, Check(3, "tx-3", "t", [half()]))
    stream.cancel()                                            # the Transaction service went away since
    relay.resolve("tx-3", ROLLBACK, from_check=True, topic="t")
    relay.resolve("tx-4", COMMIT, from_check=False, topic="t")  # the producer's own commit
    relay.resolve("tx-5", UNKNOWN, from_check=True, topic="t")  # nothing to do: asked again later
    assert resolver.calls == [("rollback", "tx-3", "t"), ("commit", "tx-4", "t")]
    assert stream.answers == []


def test_an_answer_naming_another_topic_is_not_the_checks_answer():
    """Authorization follows the transaction: an EndTransaction naming a topic the client may PUB does not
    answer a pending check of another topic on its stream (the gateway's own identity would decide it);
    it goes to the Transaction service with the topic it named, which refuses a transaction of another."""
    reg, _, resolver, relay = rig()
    reg.attach("victim")
    reg.apply_settings("victim", PRODUCER, ["secret"], "")
    relay.close()
    stream = FakeStream("secret")
    relay.deliver(stream, Check(9, "tx-9", "secret", [half()]))
    relay.resolve("tx-9", ROLLBACK, from_check=True, topic="pubt")     # the attacker's, naming its own topic
    assert stream.answers == [] and resolver.calls == [("rollback", "tx-9", "pubt")]
    assert relay.stats()["pending"] == 1                               # still the victim's to answer
    relay.resolve("tx-9", COMMIT, from_check=True, topic="secret")     # the victim's answer
    assert stream.answers == [(9, COMMIT)]
