"""Pop consumption in a replication group (issue 17 with consumer.proto), real processes on 127.0.0.1: three
CommitLog nodes and etcd. Only the leader serves pop consumption (a replica answers FAILED_PRECONDITION naming
the leader, as for Append, and runs no pop duty); kill -9 of the leader with messages in flight: the consumer,
following the leader as the gateway does (gateway_service.pop_client on a CommitLogClient given every node),
acks on the new leader the handles the old one gave out, never sees an acked message again, and gets every
unacked one again once its invisible time has passed. An ordered group (mqstore.pop.ordered) on the same
group of nodes keeps its setting and each message group's order through the failover: its unacked messages
come again in place, in order, before the later ones of their group, while another group flows."""

from __future__ import annotations

import time

import grpc
import pytest
from gateway_service.pop_client import PopClient
from mqstore.errors import NotLeader, Unavailable

from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, common_pb2
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2 as cpb, consumer_pb2_grpc
from tests.support.ha import group_on_etcd
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.e2e]

TOPIC, GROUP = "pq", "workers"
FIFO_TOPIC, FIFO_GROUP = "pq-fifo", "ordered-workers"
# ASYNC by default: pop's own records are SYNC-replicated whatever the default (mqstore.pop.leadership).
FLAGS = ("--min-insync-replicas", "2",
         "--default-replication", "ASYNC", "--isr-max-lag-ms", "1500", "--sync-replication-timeout-ms", "3000",
         "--replication-heartbeat-ms", "100", "--pop-flush-interval-ms", "200")
FIRST_INVISIBLE_MS = 12_000  # long enough to outlast the failover: the unacked ones come back after it


@pytest.fixture
def group(tmp_path):
    with group_on_etcd(tmp_path, *FLAGS) as g:
        yield g


def _retrying(call, what: str, timeout_s: float = 60):
    """``call()`` until the new leader serves pop consumption (NotLeader/Unavailable meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except (NotLeader, Unavailable):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}") from None
            time.sleep(0.05)


def _receive(pop: PopClient, invisible_ms: int, long_poll_ms: int = 500):
    return pop.receive(GROUP, TOPIC, invisible_duration_ms=invisible_ms, filter_expression="", batch_size=32,
                       long_poll_ms=long_poll_ms, max_attempts=16, start="earliest").deliveries


def _receive_ordered(pop: PopClient, invisible_ms: int, long_poll_ms: int = 500):
    return pop.receive(FIFO_GROUP, FIFO_TOPIC, invisible_duration_ms=invisible_ms, filter_expression="", batch_size=32,
                       long_poll_ms=long_poll_ms, max_attempts=16, start="earliest").deliveries


def _append_grouped(group, node: str, bodies: list[bytes]) -> None:
    """``bodies`` of message group = their first byte (A or B), as the gateway's FIFO producer stores them."""
    messages = [common_pb2.MessageInput(body=b, sharding_key=b[:1].decode(),
                                        properties={"__SHARDINGKEY": b[:1].decode()}) for b in bodies]
    request = pb.AppendRequest(topic=FIFO_TOPIC, messages=messages, replication=pb.REPLICATION_MODE_SYNC)
    group.log(node).Append(request, timeout=10)


def _refused_naming(call, leader_address: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
    trailers = dict(err.value.trailing_metadata())
    assert (trailers["mqstore-error"], trailers["mqstore-leader"]) == ("NotLeader", leader_address)


def test_pop_runs_on_the_leader_only_and_survives_kill9_of_the_leader(group):
    group.start_all()
    leader, epoch = group.wait_leader()
    group.log(leader).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=10)
    group.log(leader).CreateTopic(pb.CreateTopicRequest(name=FIFO_TOPIC, queue_count=2), timeout=10)
    consumer_pb2_grpc.ConsumerStub(group.channels[leader]).SetGroupSettings(
        cpb.GroupSettings(group=FIFO_GROUP, ordered=True), timeout=10)
    wait_until(lambda: len(group.state(leader).in_sync) == 3, "all three nodes in sync", timeout_s=30)
    bodies = {b"msg-%03d" % i for i in range(40)}
    group.append(leader, TOPIC, sorted(bodies), pb.REPLICATION_MODE_SYNC)

    # A replica serves no pop consumption: it names the leader, and runs none of pop's duties.
    leader_address = group.procs[leader].address
    replicas = [n for n in group.procs if n != leader]
    replica_pop = consumer_pb2_grpc.ConsumerStub(group.channels[replicas[0]])
    _refused_naming(lambda: replica_pop.Receive(cpb.ReceiveRequest(group=GROUP, topic=TOPIC, batch_size=1,
                                                                   invisible_duration_ms=1000), timeout=10),
                    leader_address)
    _refused_naming(lambda: replica_pop.Ack(cpb.AckRequest(group=GROUP, topic=TOPIC, receipt_handles=["x"]),
                                            timeout=10), leader_address)
    _refused_naming(lambda: replica_pop.Stats(cpb.PopStatsRequest(), timeout=10), leader_address)
    for n in replicas:
        assert not any('"pop.started"' in line for line in group.procs[n].lines), n

    client = CommitLogClient(",".join(group.procs[n].address for n in sorted(group.procs, reverse=True)),
                             rpc_timeout_s=10)
    pop = PopClient(client)  # the gateway's way in; the first node listed is a replica
    try:
        received = {}
        wait_until(lambda: received.update((d.message.record.body, d) for d in _receive(pop, FIRST_INVISIBLE_MS))
                   or len(received) == len(bodies), "every message received once", timeout_s=30)
        assert set(received) == bodies and {d.attempt for d in received.values()} == {1}
        order = sorted(bodies)
        acked_before, acked_after, left = order[:20], order[20:30], set(order[30:])
        outcomes = pop.ack(GROUP, TOPIC, [received[b].receipt_handle for b in acked_before])
        assert {o.status for o in outcomes} == {"ok"}
        # The ordered group: A0..A4 and B0..B4 handed out in order; A0, A1 and every B acked, A2..A4 left.
        _append_grouped(group, leader, [b"%s%d" % (g, i) for i in range(5) for g in (b"A", b"B")])
        fifo: list = []
        wait_until(lambda: fifo.extend(_receive_ordered(pop, FIRST_INVISIBLE_MS)) or len(fifo) == 10,
                   "the ordered group's ten messages", timeout_s=30)
        for g in (b"A", b"B"):
            assert [d.message.record.body for d in fifo if d.message.record.body[:1] == g] == [
                b"%s%d" % (g, i) for i in range(5)]
        done = [d.receipt_handle for d in fifo if d.message.record.body in (b"A0", b"A1") or
                d.message.record.body[:1] == b"B"]
        assert {o.status for o in pop.ack(FIFO_GROUP, FIFO_TOPIC, done)} == {"ok"}

        group.kill9(leader)
        new_leader, _ = group.wait_leader(above_epoch=epoch, timeout_s=30)
        # The new leader rebuilt the in-flight set from the revive log: the old leader's handles work there.
        outcomes = _retrying(lambda: pop.ack(GROUP, TOPIC, [received[b].receipt_handle for b in acked_after]),
                             "the new leader to take acks")
        assert [o.status for o in outcomes] == ["ok"] * 10, outcomes
        assert any('"pop.leading"' in line for line in group.procs[new_leader].lines)
        # The ordered group on the new leader: still ordered; A5 waits behind A2..A4 (in flight), B5 flows.
        assert _retrying(lambda: pop.group_settings(FIFO_GROUP), "the new leader's group settings").ordered
        _append_grouped(group, new_leader, [b"A5", b"B5"])
        flowing = _retrying(lambda: _receive_ordered(pop, 30_000, long_poll_ms=2000), "ordered receives")
        assert [d.message.record.body for d in flowing] == [b"B5"]
        assert {o.status for o in pop.ack(FIFO_GROUP, FIFO_TOPIC, [flowing[0].receipt_handle])} == {"ok"}

        again: list = []
        deadline = time.monotonic() + FIRST_INVISIBLE_MS / 1000 + 60
        while {d.message.record.body for d in again} < left and time.monotonic() < deadline:
            got = _retrying(lambda: _receive(pop, 30_000, long_poll_ms=1000), "receives on the new leader")
            again += got
            if got:
                assert {o.status for o in pop.ack(GROUP, TOPIC, [d.receipt_handle for d in got])} == {"ok"}
        seen = [d.message.record.body for d in again]
        assert set(seen) == left, f"unacked messages lost: {sorted(left - set(seen))}"  # nothing unacked lost
        assert len(seen) == len(left), "a message delivered twice after the failover"
        assert {d.attempt for d in again} == {2}  # delivered again after their invisible time, attempt + 1
        assert not set(seen) & (set(acked_before) | set(acked_after))  # nothing acked comes back
        # A2..A4 expired (the old leader's invisible time): again in place, in order, then A5; nothing else.
        late: list = []
        wait_until(lambda: late.extend(_receive_ordered(pop, 30_000, long_poll_ms=1000)) or len(late) >= 4,
                   "A2..A5 on the new leader", timeout_s=FIRST_INVISIBLE_MS / 1000 + 60)
        assert [(d.message.record.body, d.attempt) for d in late] == [(b"A2", 2), (b"A3", 2), (b"A4", 2), (b"A5", 1)]
    finally:
        client.close()
