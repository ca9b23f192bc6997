"""Which of the Consumer's Receive and Ack calls the commit log's port answers on its event loop
(mqstore.pop.at_once, mqstore_rpc.aio.at_once_when): on one node with ASYNC flush, a Receive of the hot local
files by an unordered group that has read the queue before, with no filter, and an Ack run on the loop; a
filtered Receive, an ordered group's, a group's first, a long poll with nothing ready and every call of a SYNC
flush store run in the handler pool. A Receive on the loop never long-polls there: one that finds nothing runs
again in the pool (aio.InPool), where it waits while the loop answers other calls. Real gRPC on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from commitlog_service.main import serving
from mqstore.pop import at_once
from mqstore.pop.service import PopService
from mqstore.replication.config import ReplicationConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, consumer_pb2 as cpb
from tests.integration.test_consumer_grpc import Stubs, make_config
from tests.support.waiting import WAIT_S, wait_until

pytestmark = pytest.mark.integration

LOOP = "grpc-aio-loop"  # mqstore_rpc.aio.LoopThread's thread


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, str]]:
    """(PopService method, the thread it ran on), for every receive and ack the port makes."""
    seen: list[tuple[str, str]] = []
    for name in ("receive", "ack"):
        real = getattr(PopService, name)

        def spy(self, *args, _name=name, _real=real, **kwargs):
            seen.append((_name, threading.current_thread().name))
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(PopService, name, spy)
    return seen


def _threads(calls: list[tuple[str, str]], since: int) -> list[tuple[str, bool]]:
    return [(name, thread == LOOP) for name, thread in calls[since:]]


def test_hot_receives_and_acks_run_on_the_loop_and_the_others_in_the_pool(tmp_path, calls):
    with serving(make_config(tmp_path / "data")) as (_, port):
        s = Stubs(port)
        s.topic("t", queues=1)
        s.send("t", [b"m0", b"m1"], tags="a")
        first = s.receive("t", batch_size=1)  # the group's first read of the queue: its offset on a thread
        assert [m.message.body for m in first.messages] == [b"m0"] and _threads(calls, 0) == [("receive", False)]

        mark = len(calls)
        second = s.receive("t", batch_size=8, long_poll_ms=5_000)  # a message ready: no wait
        assert [m.message.body for m in second.messages] == [b"m1"]
        handles = [m.receipt_handle for m in [*first.messages, *second.messages]]
        acked = s.ack("t", handles)
        assert [r.status for r in acked.results] == [cpb.ACK_STATUS_OK] * 2
        assert _threads(calls, mark) == [("receive", True), ("ack", True)]

        s.send("t", [b"m2", b"m3"], tags="a")
        mark = len(calls)
        filtered = s.receive("t", filter_expression="a", batch_size=1)  # a filter may walk far: pool
        large = s.receive("t", batch_size=1000)  # more than a loop's walk: pool
        assert [m.message.body for m in [*filtered.messages, *large.messages]] == [b"m2", b"m3"]
        assert _threads(calls, mark) == [("receive", False), ("receive", False)]

        s.pop.SetGroupSettings(cpb.GroupSettings(group="o", ordered=True), timeout=WAIT_S)
        s.receive("t", group="o", batch_size=1)
        mark = len(calls)
        s.receive("t", group="o", batch_size=1)  # an ordered group: pool, even once its offset is known
        assert _threads(calls, mark) == [("receive", False)]

        mark = len(calls)
        s.receive("t", group="nobody", batch_size=1, long_poll_ms=0)  # first read: pool
        s.receive("t", group="nobody", batch_size=1, long_poll_ms=0)  # its offset known now: the loop
        assert _threads(calls, mark) == [("receive", False), ("receive", True)]
        s.channel.close()


def _second_receive_and_ack(config, calls) -> list[tuple[str, bool]]:
    """Where a group's second Receive (its offsets known) and its Ack ran: (call, on the loop) each."""
    with serving(config) as (_, port):
        s = Stubs(port)
        s.topic("t", queues=1)
        s.send("t", [b"m0", b"m1"])
        s.receive("t", batch_size=1)
        mark = len(calls)
        got = s.receive("t", batch_size=1)
        s.ack("t", [m.receipt_handle for m in got.messages])
        assert [m.message.body for m in got.messages] == [b"m1"]
        s.channel.close()
        return _threads(calls, mark)


def test_a_sync_flush_stores_receives_and_acks_run_in_the_pool(tmp_path, calls):
    config = make_config(tmp_path / "data")
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, flush_mode="SYNC"))
    assert _second_receive_and_ack(config, calls) == [("receive", False), ("ack", False)]  # records wait for fsync


def test_a_receive_that_finds_nothing_on_the_loop_long_polls_in_the_pool_and_the_loop_answers_meanwhile(
        tmp_path, calls, monkeypatch):
    with serving(make_config(tmp_path / "data")) as (_, port):
        s = Stubs(port)
        s.topic("t", queues=1)
        s.receive("t", long_poll_ms=0)  # the group's offset known from here
        # The check's look said "ready" (as when another consumer takes the message between the look and the read)
        monkeypatch.setattr(at_once, "receive_at_once", lambda *args, **kwargs: True)
        mark = len(calls)
        waiting = s.pop.Receive.future(cpb.ReceiveRequest(group="g", topic="t", invisible_duration_ms=30_000,
                                                          long_poll_ms=int(WAIT_S * 1000)), timeout=WAIT_S)
        wait_until(lambda: len(calls) >= mark + 2, "the loop's try, then the pool's long poll")
        assert _threads(calls, mark) == [("receive", True), ("receive", False)]
        # The long poll holds a pool thread, not the loop: the port answers other calls meanwhile
        assert s.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=WAIT_S).segment_count >= 1
        assert not waiting.done()
        s.send("t", [b"late"])
        assert [m.message.body for m in waiting.result(WAIT_S).messages] == [b"late"]
        s.channel.close()


def test_in_a_replication_group_receives_and_acks_run_in_the_pool(tmp_path, calls):
    """Pop's records wait for the in-sync replicas of a replication group (mqstore.pop.service.POP_REPLICATION),
    even where the node's default replication is ASYNC: never on the loop there."""
    config = make_config(tmp_path / "data")
    config = dataclasses.replace(config, replication=ReplicationConfig(node_id="a", replication_heartbeat_ms=50))
    assert _second_receive_and_ack(config, calls) == [("receive", False), ("ack", False)]
