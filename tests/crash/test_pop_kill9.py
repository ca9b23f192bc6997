"""Crash tests of pop consumption with real processes: kill -9 of the CommitLog server while consumers
receive and ack, and crashes at the named failpoints of consumer.proto's durability notes. Nothing is
lost: every message is acked in the end; duplicates (a message delivered again after an ack answered
OK) are counted and reported."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2 as cpb, consumer_pb2_grpc
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]

TOPIC = "work"
INVISIBLE_MS = 1_000
DRAIN_S = 90


class Ledger:
    """What the consumers saw, across restarts. A duplicate is a delivery of a message after an ack of it
    answered OK, or a second delivery with the same attempt number (a copy made twice); a redelivery of an
    unacked message (attempt + 1) is the contract, not a duplicate. Thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.deliveries = 0
        self.seen: set[tuple[bytes, int]] = set()
        self.acked: set[bytes] = set()
        self.unanswered: set[bytes] = set()  # in an ack the kill cut off: acked for good, or delivered again
        self.duplicates: list[tuple[bytes, int]] = []

    def delivered(self, body: bytes, attempt: int) -> None:
        with self.lock:
            self.deliveries += 1
            if body in self.acked or (body, attempt) in self.seen:
                self.duplicates.append((body, attempt))
            self.seen.add((body, attempt))

    def ok(self, body: bytes) -> None:
        with self.lock:
            self.acked.add(body)

    def cut_off(self, bodies) -> None:
        with self.lock:
            self.unanswered.update(bodies)


class Client:
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.log = commitlog_pb2_grpc.CommitLogStub(self.channel)
        self.pop = consumer_pb2_grpc.ConsumerStub(self.channel)

    def receive(self, batch: int = 32, long_poll_ms: int = 300) -> list:
        request = cpb.ReceiveRequest(group="g", topic=TOPIC, batch_size=batch, invisible_duration_ms=INVISIBLE_MS,
                                     long_poll_ms=long_poll_ms)
        return list(self.pop.Receive(request, timeout=10).messages)

    def ack(self, messages) -> list:
        request = cpb.AckRequest(group="g", topic=TOPIC, receipt_handles=[m.receipt_handle for m in messages])
        return list(self.pop.Ack(request, timeout=10).results)


def _start(data_dir, *extra, failpoints: str = ""):
    env = {"MQSTORE_FAILPOINTS": failpoints} if failpoints else {}
    return commitlog(data_dir, *extra, env=env).started()


def _consume(address: str, ledger: Ledger, stop: threading.Event, seed: int, ack_ratio: float = 0.8) -> None:
    """Receive and ack (some left unacked, to be redelivered) until ``stop`` or the server dies."""
    rng = random.Random(seed)
    client = Client(address)
    try:
        while not stop.is_set():
            try:
                messages = client.receive()
                for m in messages:
                    ledger.delivered(m.message.body, m.delivery_attempt)
                chosen = [m for m in messages if rng.random() < ack_ratio]
                if chosen:
                    try:
                        results = client.ack(chosen)
                    except grpc.RpcError:
                        ledger.cut_off(m.message.body for m in chosen)
                        raise
                    for m, result in zip(chosen, results, strict=True):
                        if result.status == cpb.ACK_STATUS_OK:
                            ledger.ok(m.message.body)
            except grpc.RpcError:
                return  # the server was killed
    finally:
        client.channel.close()


def _drain(address: str, ledger: Ledger, expected: set[bytes]) -> None:
    """Receive and ack everything until every message has been acked once (those of an ack the kill cut off
    may have been acked by it: they are done when nothing is in flight and no receive finds them)."""
    client = Client(address)
    deadline = time.monotonic() + DRAIN_S
    try:
        while not (expected - ledger.unanswered <= ledger.acked and _idle(client)):
            missing = expected - ledger.unanswered - ledger.acked
            assert time.monotonic() < deadline, f"{len(missing)} messages never acked again: {sorted(missing)[:10]}"
            messages = client.receive(long_poll_ms=2 * INVISIBLE_MS)
            for m in messages:
                ledger.delivered(m.message.body, m.delivery_attempt)
            if messages:
                for m, result in zip(messages, client.ack(messages), strict=True):
                    assert result.status == cpb.ACK_STATUS_OK, result
                    ledger.ok(m.message.body)
    finally:
        client.channel.close()


def _idle(client: Client) -> bool:
    """Nothing in flight for the group: every message is acked, or waits to be received."""
    stats = client.pop.Stats(cpb.PopStatsRequest(group="g", topic=TOPIC), timeout=10)
    return stats.group_in_flight == 0 and all(q.pop_offset == q.max_offset for q in stats.queues if q.max_offset)


def _send(address: str, count: int) -> set[bytes]:
    client = Client(address)
    client.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=4), timeout=10)
    bodies = [b"w%05d" % i for i in range(count)]
    for start in range(0, count, 100):
        client.log.Append(pb.AppendRequest(topic=TOPIC, messages=[common_pb2.MessageInput(body=b)
                                                                  for b in bodies[start:start + 100]]), timeout=10)
    client.channel.close()
    return set(bodies)


def test_kill9_with_messages_in_flight_loses_nothing(tmp_path):
    data = tmp_path / "data"
    ledger = Ledger()
    server = _start(data)
    try:
        expected = _send(server.address, 600)
        for cycle in range(3):
            stop = threading.Event()
            consumers = [threading.Thread(target=_consume, args=(server.address, ledger, stop, cycle * 10 + i))
                         for i in range(3)]
            for t in consumers:
                t.start()
            target = (cycle + 1) * len(expected) // 5
            wait_until(lambda: len(ledger.acked) >= target, f"{target} messages acked", timeout_s=60)  # noqa: B023
            server.kill9()  # messages in flight: received, some acked, some not
            server.stop()  # closes its pipes
            stop.set()
            for t in consumers:
                t.join(30)
            server = _start(data)
        _drain(server.address, ledger, expected)
    finally:
        server.stop()
    print(f"deliveries={ledger.deliveries} messages={len(expected)} duplicates={len(ledger.duplicates)} "
          f"in acks cut off by a kill={len(ledger.unanswered)} (of which delivered again: "
          f"{len(ledger.unanswered & ledger.acked)})")
    assert expected - ledger.unanswered <= ledger.acked
    assert ledger.duplicates == []  # an OK ack is durable; a kill inside a revive step is the only other window


@pytest.mark.parametrize("failpoint, unacked", [
    ("pop.receive.after_ck", "the receive's CK is durable: its messages come back after their invisible time"),
    ("pop.revive.after_copy", "the retry copies are written, their ACK record is not"),
    ("pop.ack.after_record", "the ACK record is durable: the acked messages never come back"),
])
def test_a_crash_at_each_step_loses_nothing(tmp_path, failpoint, unacked):
    data = tmp_path / "data"
    ledger = Ledger()
    unanswered: list = []  # the ack the crash cut off, if any
    server = _start(data, failpoints=f"{failpoint}=exit")
    try:
        expected = _send(server.address, 40)
        client = Client(server.address)
        try:
            while True:  # until the failpoint ends the process: receive, let half expire, ack the rest
                messages = client.receive(batch=8)
                for m in messages:
                    ledger.delivered(m.message.body, m.delivery_attempt)
                unanswered = messages[::2]
                if unanswered:
                    for m, result in zip(unanswered, client.ack(unanswered), strict=True):
                        if result.status == cpb.ACK_STATUS_OK:
                            ledger.ok(m.message.body)
                unanswered = []
        except grpc.RpcError:
            pass
        finally:
            client.channel.close()
        assert server.wait_exit() == 137, unacked
        server.stop()  # closes its pipes
        server = _start(data)
        cut_off = {m.message.body for m in unanswered}
        if failpoint == "pop.ack.after_record":
            assert cut_off, "the crash came inside an ack"
            for body in cut_off:
                ledger.ok(body)  # its record is durable: these must never come back (a delivery is a duplicate)
        _drain(server.address, ledger, expected)
    finally:
        server.stop()
    print(f"{failpoint}: deliveries={ledger.deliveries} duplicates={len(ledger.duplicates)}")
    assert expected <= ledger.acked
    assert ledger.duplicates == []
