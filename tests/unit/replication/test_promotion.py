"""A replica promoted to leader continues every queue's offsets after the records it copied, in one process
on real files (two MessageStores sharing one SQLite metadata file, the replication node of each).

A replica copies its leader's bytes at once but makes them visible (consume queue entries) only up to the
committed offset its leader last told it, which trails the bytes: the data message that carries a batch
carries the committed offset from before the replica acknowledged it, and the next one (a heartbeat) comes
``replication_heartbeat_ms`` later. A leader killed in between leaves its successor holding records that
are not in its consume queues yet. The new leader's appends must still take the queue offsets after them
(each record carries its queue offset; the consume queue entries of the copied records go in once the new
in-sync set holds them): before the fix the next queue offsets came from the consume queues alone, so the
first append after a failover took offsets 0.. again, a consume queue got two records per offset (the
second dropped) and the Compactor, which drops a queue offset it holds already, lost every record
appended to the new leader (tests/crash/test_compactor_failover.py).
"""

from __future__ import annotations

import pytest

from mqstore.model import MessageIn
from mqstore.store import MessageStore
from tests.unit.replication.pair import copy, open_node

QUEUES = 2
FIRST = 10  # per queue, appended to the old leader



def _append(store: MessageStore, topic: str, prefix: str, per_queue: int) -> list:
    return list(store.append(topic, [MessageIn(body=f"{prefix}-{i}".encode(), queue_id=i % QUEUES)
                                     for i in range(per_queue * QUEUES)], replication="ASYNC"))



def _queue(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    return [(m.record.queue_offset, m.record.body) for m in store.pull(topic, queue_id, 0, max_messages=1000).messages]


@pytest.mark.parametrize("visible", ["none", "half", "all"])
def test_a_new_leader_appends_after_the_queue_offsets_it_copied_but_did_not_show_yet(small_config, tmp_path,
                                                                                     visible):
    old, old_node = open_node(small_config, tmp_path, "a")
    new, new_node = open_node(small_config, tmp_path, "b")
    old_running = True
    try:
        old_node.become_leader(1, frozenset({"a"}))
        new_node.become_replica("a", "a", 1)
        old.topic_admin.create("t", QUEUES)  # created after the replica started: it learns of it from the database
        first = _append(old, "t", "old", FIRST // 2)
        middle = first[-1].physical_offset + first[-1].size_bytes
        first += _append(old, "t", "old", FIRST - FIRST // 2)
        copy(old, new, {"none": 0, "half": middle, "all": old.log_end()}[visible])
        old.halt()  # kill -9 of the old leader before its next heartbeat
        old_running = False

        new_node.become_leader(2, frozenset({"b"}))
        second = _append(new, "t", "new", FIRST)
        assert [r.queue_offset for r in second] == [FIRST + i // QUEUES for i in range(FIRST * QUEUES)]
        for queue_id in range(QUEUES):
            held = _queue(new, "t", queue_id)
            assert [offset for offset, _ in held] == list(range(2 * FIRST))
            assert [body for _, body in held] == [f"{prefix}-{i}".encode() for prefix, count in
                                                  (("old", FIRST // 2), ("old", FIRST - FIRST // 2), ("new", FIRST))
                                                  for i in range(count * QUEUES) if i % QUEUES == queue_id]
            assert new.queue_info("t", queue_id).max_offset == 2 * FIRST
    finally:
        new.stop()
        if old_running:
            old.stop()
