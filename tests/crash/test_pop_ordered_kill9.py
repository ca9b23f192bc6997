"""An ordered consumer group (mqstore.pop.ordered) through kill -9 of the CommitLog server: consumers receive
and ack (some messages left to expire, delivered again in place) while the process is killed twice and
started again on its data. The order state is pop's CK/ACK records alone, replayed at start.

Checked at every delivery: each earlier message of the message's group was acked (or its ack was sent) or
came earlier in the same batch (no group out of order), and no message whose ack answered OK comes again;
at the end every message was acked (none skipped)."""

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

TOPIC, GROUP = "steps", "ordered-g"
INVISIBLE_MS = 1_000
MESSAGE_GROUPS = 12
PER_GROUP = 25
DRAIN_S = 90


class Ledger:
    """What the consumers saw, across restarts; ``violations`` lists every breach of order or ack. Thread-safe."""

    def __init__(self, sequences: dict[bytes, tuple[str, int]]):
        self.sequences = sequences           # body -> (message group, its place in the group)
        self.lock = threading.Lock()
        self.acking: set[bytes] = set()      # an ack was sent (it may have been applied before its answer)
        self.acked: set[bytes] = set()       # an ack answered OK
        self.cut_off: set[bytes] = set()     # in an ack the kill cut off: acked for good, or delivered again
        self.violations: list[str] = []

    def delivered(self, messages) -> None:
        with self.lock:
            earlier_in_batch: set[bytes] = set()
            for m in messages:
                body = m.message.body
                group, place = self.sequences[body]
                if body in self.acked:
                    self.violations.append(f"{body!r} delivered again after its ack answered OK")
                for before in range(place):
                    prior = b"%s-%03d" % (group.encode(), before)
                    if prior not in self.acking and prior not in earlier_in_batch:
                        self.violations.append(f"{body!r} (attempt {m.delivery_attempt}) before {prior!r} was done")
                        break
                earlier_in_batch.add(body)

    def sending_ack(self, bodies) -> None:
        with self.lock:
            self.acking.update(bodies)

    def ok(self, body: bytes) -> None:
        with self.lock:
            self.acked.add(body)


class Client:
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.log = commitlog_pb2_grpc.CommitLogStub(self.channel)
        self.pop = consumer_pb2_grpc.ConsumerStub(self.channel)

    def receive(self, long_poll_ms: int = 300) -> list:
        request = cpb.ReceiveRequest(group=GROUP, topic=TOPIC, batch_size=16, invisible_duration_ms=INVISIBLE_MS,
                                     long_poll_ms=long_poll_ms)
        return list(self.pop.Receive(request, timeout=10).messages)

    def ack(self, ledger: Ledger, messages) -> None:
        ledger.sending_ack(m.message.body for m in messages)
        request = cpb.AckRequest(group=GROUP, topic=TOPIC, receipt_handles=[m.receipt_handle for m in messages])
        try:
            results = self.pop.Ack(request, timeout=10).results
        except grpc.RpcError:
            with ledger.lock:
                ledger.cut_off.update(m.message.body for m in messages)
            raise
        for m, result in zip(messages, results, strict=True):
            if result.status == cpb.ACK_STATUS_OK:
                ledger.ok(m.message.body)


def _consume(address: str, ledger: Ledger, stop: threading.Event, seed: int) -> None:
    """Receive, ack the first messages of each batch (a random prefix: the rest expire and come again in
    place), until ``stop`` or the server dies."""
    rng = random.Random(seed)
    client = Client(address)
    try:
        while not stop.is_set():
            messages = client.receive()
            ledger.delivered(messages)
            if messages:
                client.ack(ledger, messages[:rng.randint(0, len(messages))])
    except grpc.RpcError:
        return  # the server was killed
    finally:
        client.channel.close()


def _idle(client: Client) -> bool:
    """Nothing in flight (nor held) for the group and every queue read to its end."""
    stats = client.pop.Stats(cpb.PopStatsRequest(group=GROUP, topic=TOPIC), timeout=10)
    return stats.group_in_flight == 0 and all(q.pop_offset == q.max_offset for q in stats.queues if q.max_offset)


def _send(address: str) -> dict[bytes, tuple[str, int]]:
    client = Client(address)
    client.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=10)
    settings = client.pop.SetGroupSettings(cpb.GroupSettings(group=GROUP, ordered=True), timeout=10)
    assert settings.ordered
    sequences = {}
    for place in range(PER_GROUP):  # the groups interleaved, as producers of many orders would send them
        batch = []
        for g in range(MESSAGE_GROUPS):
            group = f"order{g:02d}"
            body = b"%s-%03d" % (group.encode(), place)
            sequences[body] = (group, place)
            batch.append(common_pb2.MessageInput(body=body, sharding_key=group, properties={"__SHARDINGKEY": group}))
        client.log.Append(pb.AppendRequest(topic=TOPIC, messages=batch), timeout=10)
    client.channel.close()
    return sequences


def test_kill9_keeps_every_message_group_in_order_and_skips_none(tmp_path):
    data = tmp_path / "data"
    server = commitlog(data).started()
    try:
        ledger = Ledger(_send(server.address))
        for cycle in range(2):
            stop = threading.Event()
            consumers = [threading.Thread(target=_consume, args=(server.address, ledger, stop, cycle * 10 + i))
                         for i in range(2)]
            for t in consumers:
                t.start()
            target = (cycle + 1) * len(ledger.sequences) // 4
            wait_until(lambda: len(ledger.acked) >= target, f"{target} messages acked", timeout_s=60)  # noqa: B023
            server.kill9()  # messages in flight, held and waiting
            server.stop()
            stop.set()
            for t in consumers:
                t.join(30)
            server = commitlog(data).started()
        client = Client(server.address)
        try:
            assert client.pop.GetGroupSettings(cpb.GetGroupSettingsRequest(group=GROUP), timeout=10).ordered
            deadline = time.monotonic() + DRAIN_S
            while not (set(ledger.sequences) - ledger.cut_off <= ledger.acked and _idle(client)):
                missing = set(ledger.sequences) - ledger.cut_off - ledger.acked
                assert time.monotonic() < deadline, f"{len(missing)} never delivered again: {sorted(missing)[:10]}"
                messages = client.receive(long_poll_ms=2 * INVISIBLE_MS)
                ledger.delivered(messages)
                if messages:
                    client.ack(ledger, messages)
        finally:
            client.channel.close()
    finally:
        server.stop()
    assert ledger.violations == []
