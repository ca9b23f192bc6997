"""A replica's consume queues are its leader's, byte for byte (physical offset, size and tag code of every entry,
the same offsets), when it shows its copy in steps that end anywhere (ReplicaView.visible_to at the committed
offsets its leader sends, not at the copy's data messages), and after a crash of the replica in the middle of a
replay (some queues written, others not, the dispatched offset not moved): the start replays from its
checkpoint and the copy goes on. In one process on real files (tests/unit/replication/pair.py), small consume
queue files so that runs cross them; the replay writes a queue's run as soon as it has it
(mqstore.queue.replay, SegmentRuns.take), which this holds to the leader's own dispatch."""

from __future__ import annotations

import random

import pytest

from mqstore.format import cq_unit
from mqstore.model import MessageIn
from mqstore.queue.consume_queue import ConsumeQueue
from mqstore.replication import store_ops
from mqstore.store import MessageStore
from tests.unit.replication.pair import copy, open_node

QUEUES = 4


class Crash(Exception):
    pass


def _append(store: MessageStore, rng: random.Random, count: int) -> None:
    store.append("t", [MessageIn(body=rng.randbytes(rng.randrange(1, 300)), queue_id=rng.randrange(QUEUES),
                                 properties={"TAGS": rng.choice(["a", "b", "é"])} if rng.random() < 0.8 else {})
                       for _ in range(count)], replication="ASYNC")


def _entries(store: MessageStore) -> dict[tuple[str, int], tuple[int, int, bytes]]:
    """Every consume queue of t: (min offset, max offset, its entries' bytes)."""
    out = {}
    for key, cq in sorted(store.queues.queues.items()):
        if key[0] != "t":
            continue
        data, at = b"", cq.min_offset
        while at < cq.max_offset:
            chunk = cq.entry_bytes(at, cq.max_offset - at)
            data, at = data + chunk, at + len(chunk) // cq_unit.ENTRY_SIZE
        out[key] = (cq.min_offset, cq.max_offset, data)
    return out


def _copy_in_steps(leader: MessageStore, replica: MessageStore, rng: random.Random) -> None:
    """The leader's log in chunks of random sizes, each shown up to a committed offset that trails it."""
    ends = []
    while replica.log_end() < leader.log_end():
        chunk, nxt = store_ops.chunk(leader, replica.log_end(), rng.randrange(1, 4096))
        store_ops.apply(replica, replica.log_end(), chunk, nxt)
        ends.append(nxt)
        replica.replica_view.visible_to(rng.choice(ends))


@pytest.mark.parametrize("seed", range(3))
def test_a_replicas_queues_are_the_leaders_byte_for_byte(small_config, tmp_path, seed):
    rng = random.Random(seed)
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        leader.topic_admin.create("t", QUEUES)
        for _ in range(6):
            _append(leader, rng, rng.randrange(1, 120))
            _copy_in_steps(leader, replica, rng)
        replica.replica_view.visible_to(leader.log_end())
        held = _entries(replica)
        assert held == _entries(leader)
        assert sum(high - low for low, high, _ in held.values()) > 200
    finally:
        replica.stop()
        leader.stop()


@pytest.mark.parametrize("queues_written", [0, 1, 3])
def test_a_replica_crashed_in_the_middle_of_a_replay_ends_with_the_leaders_queues(small_config, tmp_path,
                                                                                   monkeypatch, queues_written):
    rng = random.Random(queues_written)
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        leader.topic_admin.create("t", QUEUES)
        _append(leader, rng, 150)
        copy(leader, replica)
        _append(leader, rng, 150)
        copy(leader, replica, visible_to=0)  # copied, not shown yet
        shown_before = replica.dispatcher.dispatched_offset
        written = []
        put_packed = ConsumeQueue.put_packed

        def crash_after_some(cq, first_offset, data, physical_end):
            if len(written) == queues_written:
                raise Crash()
            written.append(cq.queue_id)
            put_packed(cq, first_offset, data, physical_end)

        monkeypatch.setattr(ConsumeQueue, "put_packed", crash_after_some)
        with pytest.raises(Crash):
            replica.replica_view.visible_to(leader.log_end())
        monkeypatch.undo()
        assert len(written) == queues_written and replica.dispatcher.dispatched_offset == shown_before
        replica.halt()  # kill -9 in the middle of the replay: some queues written, the checkpoint older

        replica, replica_node = open_node(small_config, tmp_path, "b")
        replica_node.become_replica("a", "a", 1)
        _append(leader, rng, 100)
        copy(leader, replica)
        assert _entries(replica) == _entries(leader)
    finally:
        replica.stop()
        leader.stop()
