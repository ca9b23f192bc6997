"""A topic deleted and created again on a replicated commit log: the replica's consume queues are the leader's,
live, after a restart of the replica, after it was away during the delete, and after a failover onto it; in one
process on real files (two MessageStores sharing one SQLite metadata file, the replication node of each).

The leader's DeleteTopic drops the topic's consume queues and next queue offsets, and a topic created again
with the name starts above the old records (its start_physical_offset) at queue offset 0
(mqstore.store_topics). A replica copies the bytes: [records of T (1st incarnation)] [DELETED event of T]
[records of T (2nd incarnation), queue offsets from 0 again]. It must end with the leader's queues: the 2nd
incarnation's records at offsets 0.., none of the 1st readable through T; and a new leader elected from it
must append to T after the 2nd incarnation's offsets.
"""

from __future__ import annotations

import pytest

from mqstore.errors import FailedPrecondition, NotFound, NotLeader
from mqstore.failpoints import FailpointHit
from mqstore.model import MessageIn
from mqstore.replication.node import ReplicationNode
from mqstore.store import MessageStore
from tests.unit.replication.pair import copy, open_node
from tests.support.hashkeys import seeded_random

FIRST_QUEUES, SECOND_QUEUES = 2, 3
FIRST, SECOND = 12, 4  # records per queue of each incarnation: more of the first, so that offsets collide



def _append(store: MessageStore, prefix: str, queues: int, per_queue: int) -> list:
    return list(store.append("t", [MessageIn(body=f"{prefix}-{i}".encode(), queue_id=i % queues)
                                   for i in range(per_queue * queues)], replication="ASYNC"))



def _queues(store: MessageStore) -> dict[int, tuple]:
    """Every queue of t: (min offset, max offset, [(queue offset, body)]) as Pull and GetQueueInfo answer."""
    out = {}
    for queue_id in range(store.topic_admin.get("t").queue_count):
        info = store.queue_info("t", queue_id)
        held = [(m.record.queue_offset, m.record.body)
                for m in store.pull("t", queue_id, info.min_offset, max_messages=1000).messages]
        out[queue_id] = (info.min_offset, info.max_offset, held)
    return out


def _expected(prefix: str, queues: int, per_queue: int) -> dict[int, tuple]:
    return {q: (0, per_queue, [(i // queues, f"{prefix}-{i}".encode()) for i in range(per_queue * queues)
                               if i % queues == q]) for q in range(queues)}


def _check_same(leader: MessageStore, replica: MessageStore, first: list, second: list) -> None:
    expected = _expected("second", SECOND_QUEUES, SECOND)
    assert _queues(leader) == expected
    assert _queues(replica) == expected
    for store in (leader, replica):
        for r in first:  # the first incarnation's records are not the topic's any more
            with pytest.raises(NotFound):
                store.get_message(r.physical_offset)
        assert [store.get_message(r.physical_offset).record.body for r in second] == \
            [f"second-{i}".encode() for i in range(len(second))]


def _restart(store: MessageStore, node: ReplicationNode, small_config, tmp_path, name: str, crash: bool = False):
    if crash:
        store.halt()  # as kill -9: no checkpoint, the abort marker stays; the start replays from an older one
    else:
        store.stop()
    store, node = open_node(small_config, tmp_path, name)
    node.become_replica("a", "a", 1)
    return store, node


@pytest.mark.parametrize("replica_was", ["connected", "away"])
def test_a_replica_of_a_topic_deleted_and_created_again_serves_the_leaders_queues(small_config, tmp_path,
                                                                                  replica_was):
    """connected: the replica copies each step as the leader takes it; away: it copies the first incarnation,
    then everything else at once, delete and creation included. Then again after a restart of the replica,
    and after a failover onto it the new leader appends to t after the second incarnation's offsets."""
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    leader_running = True
    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        leader.topic_admin.create("t", FIRST_QUEUES)
        first = _append(leader, "first", FIRST_QUEUES, FIRST)
        copy(leader, replica)
        assert _queues(replica) == _queues(leader) == _expected("first", FIRST_QUEUES, FIRST)

        leader.topic_admin.delete("t")
        if replica_was == "connected":
            copy(leader, replica)
            with pytest.raises(NotFound):
                replica.queue_info("t", 0)
        leader.topic_admin.create("t", SECOND_QUEUES)
        if replica_was == "connected":
            copy(leader, replica)
            assert _queues(replica) == _queues(leader) == _expected("second", SECOND_QUEUES, 0)
        second = _append(leader, "second", SECOND_QUEUES, SECOND)
        copy(leader, replica)
        _check_same(leader, replica, first, second)

        replica, replica_node = _restart(replica, replica_node, small_config, tmp_path, "b")
        _check_same(leader, replica, first, second)

        leader.halt()  # kill -9 of the leader; the replica held all of its log
        leader_running = False
        replica_node.become_leader(2, frozenset({"b"}))
        third = _append(replica, "third", SECOND_QUEUES, 2)
        assert [r.queue_offset for r in third] == [SECOND + i // SECOND_QUEUES for i in range(2 * SECOND_QUEUES)]
        for queue_id, (low, high, held) in _queues(replica).items():
            assert (low, high) == (0, SECOND + 2)
            assert [body for _, body in held] == \
                [f"{prefix}-{i}".encode() for prefix, count in (("second", SECOND), ("third", 2))
                 for i in range(count * SECOND_QUEUES) if i % SECOND_QUEUES == queue_id]
    finally:
        replica.stop()
        if leader_running:
            leader.stop()


@pytest.mark.parametrize("then", ["restart", "restart_after_kill_9", "failover", "failover_before_the_creation"])
def test_a_replica_that_holds_a_delete_it_did_not_dispatch_yet_serves_and_appends_as_its_leader(
        small_config, tmp_path, then):
    """The replica holds the bytes of the delete (and of the topic created again, but for
    failover_before_the_creation) but made visible only the first incarnation (its leader's committed offset
    trailed): a restart (its start replays the rest with the topics' starts), or a kill -9 of the leader and a
    failover onto it (the new leader's queue offsets: its queues of the first incarnation are not the
    topic's), leaves it with the leader's queues; its appends to the topic take offsets after the second
    incarnation's in every queue, from 0 where it has none."""
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    leader_running = True
    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        leader.topic_admin.create("t", FIRST_QUEUES)
        first = _append(leader, "first", FIRST_QUEUES, FIRST)
        copy(leader, replica)
        shown = leader.log_end()
        leader.topic_admin.delete("t")
        second = []
        if then != "failover_before_the_creation":
            leader.topic_admin.create("t", SECOND_QUEUES)
            second = _append(leader, "second", 1, SECOND)  # queue 0 alone: the others hold none of them
        copy(leader, replica, visible_to=shown)

        if then.startswith("restart"):
            replica, replica_node = _restart(replica, replica_node, small_config, tmp_path, "b",
                                             crash=then == "restart_after_kill_9")
            assert _queues(replica) == _queues(leader) == {0: (0, SECOND, [(i, f"second-{i}".encode())
                                                                            for i in range(SECOND)]),
                                                           1: (0, 0, []), 2: (0, 0, [])}
            return
        leader.halt()  # kill -9 of the leader before it told the replica its committed offset
        leader_running = False
        replica_node.become_leader(2, frozenset({"b"}))
        if then == "failover_before_the_creation":
            replica.topic_admin.create("t", SECOND_QUEUES)
        third = _append(replica, "third", SECOND_QUEUES, 2)
        base = {0: len(second), 1: 0, 2: 0}
        assert [r.queue_offset for r in third] == [base[i % SECOND_QUEUES] + i // SECOND_QUEUES
                                                   for i in range(2 * SECOND_QUEUES)]
        expected = {q: [f"second-{i}".encode() for i in range(len(second)) if q == 0] +
                    [f"third-{i}".encode() for i in range(2 * SECOND_QUEUES) if i % SECOND_QUEUES == q]
                    for q in range(SECOND_QUEUES)}
        assert {q: (low, high, [body for _, body in held]) for q, (low, high, held) in _queues(replica).items()} == \
            {q: (0, len(bodies), bodies) for q, bodies in expected.items()}
        for r in first:
            with pytest.raises(NotFound):
                replica.get_message(r.physical_offset)
    finally:
        replica.stop()
        if leader_running:
            leader.stop()


def test_a_delete_topic_sent_to_a_replica_is_refused_and_deletes_nothing(small_config, tmp_path):
    """DeleteTopic on a replica answers NotLeader (naming the leader) before its first step: the shared
    database's row is not marked deleting (the leader would finish that delete at its next start, and the
    replica, reading the database, would stop showing the topic's records meanwhile)."""
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        leader.topic_admin.create("t", FIRST_QUEUES)
        first = _append(leader, "first", FIRST_QUEUES, 2)
        copy(leader, replica)
        with pytest.raises(NotLeader):
            replica.topic_admin.delete("t")
        assert leader.topics.meta.deleting_topics() == []
        second = _append(leader, "second", FIRST_QUEUES, 2)
        copy(leader, replica)
        assert _queues(replica) == _queues(leader)
        assert [replica.get_message(r.physical_offset).record.body for r in first + second] == \
            [f"{prefix}-{i}".encode() for prefix in ("first", "second") for i in range(2 * FIRST_QUEUES)]
        leader.stop()
        leader, leader_node = open_node(small_config, tmp_path, "a")  # its start resumes no delete of t
        assert leader.topic_admin.get("t").queue_count == FIRST_QUEUES
    finally:
        replica.stop()
        leader.stop()


@pytest.mark.parametrize("step", ["topic.delete.marked", "topic.delete.announced", "topic.delete.queues_dropped"])
def test_a_new_leader_finishes_a_delete_its_old_leader_cut_short(small_config, tmp_path, failpoint, step):
    """The leader dies in the middle of a DeleteTopic (the row in the shared database marked deleting); after
    a failover the new leader refuses a CreateTopic of the name as being deleted (it used to try to create
    it, the row being there), and a DeleteTopic of the name finishes the delete (it used to answer NotFound:
    the delete could not be finished until the new leader restarted). Then the name is free and a topic
    created again with it starts at queue offset 0."""
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        leader.topic_admin.create("t", FIRST_QUEUES)
        first = _append(leader, "first", FIRST_QUEUES, FIRST)
        copy(leader, replica)
        with failpoint.armed(step):
            with pytest.raises(FailpointHit):
                leader.topic_admin.delete("t")
        copy(leader, replica)
        leader.halt()  # kill -9 of the leader in the middle of the delete
        replica_node.become_leader(2, frozenset({"b"}))
        with pytest.raises(FailedPrecondition, match="being deleted"):
            replica.topic_admin.create("t", SECOND_QUEUES)
        replica.topic_admin.delete("t")
        assert replica.topics.deleting() == [] and replica.topics.meta.deleting_topics() == []
        replica.topic_admin.create("t", SECOND_QUEUES)
        second = _append(replica, "second", SECOND_QUEUES, SECOND)
        assert _queues(replica) == _expected("second", SECOND_QUEUES, SECOND)
        for r in first:
            with pytest.raises(NotFound):
                replica.get_message(r.physical_offset)
        assert [replica.get_message(r.physical_offset).record.body for r in second] == \
            [f"second-{i}".encode() for i in range(len(second))]
    finally:
        replica.stop()


def test_a_replica_against_a_model_of_topics_deleted_and_created_again(small_config, tmp_path):
    """Random steps from a printed seed on a leader and its replica: appends, deletes, creations of two names
    with 1 to 3 queues, copies made visible up to the leader's end or an earlier committed offset, restarts
    of the replica. Whenever the replica shows the leader's whole log, both answer as the model (each name:
    its latest topic's queues, offsets from 0). At the end the leader dies and the replica, promoted, appends
    to every queue after the model's offsets."""
    rng, _ = seeded_random("replicated_delete_model")
    leader, leader_node = open_node(small_config, tmp_path, "a")
    replica, replica_node = open_node(small_config, tmp_path, "b")
    leader_running = True
    model: dict[str, list[list[bytes]]] = {}  # name -> queue -> bodies of its latest topic
    committed = [leader.log_end()]  # record boundaries the leader had at some moment (committed offsets)
    serial = 0

    def check(store: MessageStore) -> None:
        for name, queues in model.items():
            assert store.topic_admin.get(name).queue_count == len(queues)
            for queue_id, bodies in enumerate(queues):
                pulled = store.pull(name, queue_id, 0, max_messages=1000)
                assert [(m.record.queue_offset, m.record.body) for m in pulled.messages] == list(enumerate(bodies))
                assert store.queue_info(name, queue_id).max_offset == len(bodies)
        for name in {"t", "u"} - set(model):
            with pytest.raises(NotFound):
                store.topic_admin.get(name)

    try:
        leader_node.become_leader(1, frozenset({"a"}))
        replica_node.become_replica("a", "a", 1)
        for _ in range(150):
            step = rng.choice(["append", "append", "append", "delete", "create", "copy", "copy", "restart"])
            name = rng.choice(["t", "u"])
            if step == "append" and name in model:
                count = rng.randint(1, 8)
                queue_ids = [rng.randrange(len(model[name])) for _ in range(count)]
                bodies = [f"{name}-{serial + i}".encode() for i in range(count)]
                serial += count
                leader.append(name, [MessageIn(body=b, queue_id=q) for b, q in zip(bodies, queue_ids, strict=True)],
                              replication="ASYNC")
                for b, q in zip(bodies, queue_ids, strict=True):
                    model[name][q].append(b)
            elif step == "delete" and name in model:
                leader.topic_admin.delete(name)
                del model[name]
            elif step == "create" and name not in model:
                queue_count = rng.randint(1, 3)
                leader.topic_admin.create(name, queue_count)
                model[name] = [[] for _ in range(queue_count)]
            elif step == "copy":
                shown = max(replica.visible_offset(), rng.choice(committed))
                copy(leader, replica, visible_to=rng.choice([shown, leader.log_end()]))
            elif step == "restart":
                replica, replica_node = _restart(replica, replica_node, small_config, tmp_path, "b")
            committed.append(leader.log_end())
            check(leader)
            if replica.visible_offset() == leader.log_end():
                check(replica)
        copy(leader, replica, visible_to=rng.choice([replica.visible_offset(), leader.log_end()]))
        leader.halt()
        leader_running = False
        replica_node.become_leader(2, frozenset({"b"}))
        for name, queues in model.items():
            results = replica.append(name, [MessageIn(body=f"{name}-new-{q}".encode(), queue_id=q)
                                            for q in range(len(queues))], replication="ASYNC")
            assert [r.queue_offset for r in results] == [len(bodies) for bodies in queues]
            for q, bodies in enumerate(queues):
                bodies.append(f"{name}-new-{q}".encode())
        check(replica)
    finally:
        replica.stop()
        if leader_running:
            leader.stop()
