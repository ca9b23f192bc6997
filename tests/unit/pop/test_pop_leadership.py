"""PopLeadership (mqstore.pop.leadership) on a real MessageStore whose write gate a test switches between
replica and leader: pop consumption is served only while the node leads, only once its copied log is
visible, and each leadership rebuilds the in-flight set from the revive log (handles of an earlier
leadership work; nothing acked comes back). The duty's steps are called by the test."""

from __future__ import annotations

import pytest

from mqstore.errors import NotLeader, Unavailable
from mqstore.model import MessageIn
from mqstore.pop.config import PopConfig
from mqstore.pop.leadership import PopLeadership
from mqstore.replication.node import SingleNode
from mqstore.store_parts import build_store


class SwitchedGate(SingleNode):
    """A store's write gate whose role the test sets: the leader of ``epoch``, or a replica of ``leader``."""

    def __init__(self):
        self.epoch, self.leader = 0, "10.0.0.1:50051"

    def check_writable(self) -> None:
        if not self.epoch:
            raise NotLeader("a replica", leader_address=self.leader)

    def begin_append(self, sync: bool) -> None:
        self.check_writable()


@pytest.fixture
def node(small_config, fake_clock):
    store = build_store(small_config(), fake_clock)
    store.start()
    gate, visible = SwitchedGate(), {"ready": False}
    store.topic_admin.create("t", 1)  # before the gate: the test's setup, as the old leader did
    store.gate = gate
    pop = PopLeadership(store, PopConfig(pop_flush_interval_ms=50), leading_epoch=lambda: gate.epoch,
                        ready=lambda: visible["ready"])
    yield store, gate, visible, pop
    pop.close()
    store.stop()


def receive(pop: PopLeadership, count: int):
    return pop.current().receive("g", "t", invisible_duration_ms=60_000, batch_size=count).deliveries


def test_pop_follows_the_leadership_and_each_new_leader_rebuilds_its_in_flight_set(node):
    store, gate, visible, pop = node
    pop.step()
    with pytest.raises(NotLeader) as refused:  # a replica: the leader is named, as for an Append
        pop.current()
    assert refused.value.leader_address == gate.leader

    gate.epoch = 1
    store.append("t", [MessageIn(body=b"m%d" % i) for i in range(3)])
    pop.step()
    with pytest.raises(Unavailable, match="rebuilding its in-flight set"):  # copied log not visible yet
        pop.current()
    visible["ready"] = True
    pop.step()
    first = pop.current()
    delivered = {d.message.record.body: d for d in receive(pop, 3)}
    assert sorted(delivered) == [b"m0", b"m1", b"m2"]
    assert [o.status for o in first.ack("g", "t", [delivered[b"m0"].receipt_handle]).outcomes] == ["ok"]

    gate.epoch = 0  # deposed
    pop.step()
    assert not first.started  # halted: its revive duty stopped, nothing stored in its name any more
    with pytest.raises(NotLeader):
        pop.current()

    gate.epoch = 2  # leads again (another epoch): a PopService rebuilt from the revive log
    pop.step()
    second = pop.current()
    assert second is not first and len(second.inflight) == 2  # m1 and m2; m0 was acked
    outcomes = second.ack("g", "t", [delivered[b"m1"].receipt_handle, delivered[b"m0"].receipt_handle])
    assert [o.status for o in outcomes.outcomes] == ["ok", "not_in_flight"]
    assert receive(pop, 3) == []  # nothing acked, nothing in flight is delivered again
    assert pop.leaderships == 2


def test_a_new_epoch_without_a_visible_gap_still_rebuilds(node):
    """Leading epoch 1, then epoch 2 between two steps (deposed and elected again unseen): the PopService
    of epoch 1 is not kept, its memory may be stale."""
    store, gate, visible, pop = node
    gate.epoch, visible["ready"] = 1, True
    pop.step()
    first = pop.current()
    gate.epoch = 2
    pop.step()
    assert not first.started and pop.current() is not first
