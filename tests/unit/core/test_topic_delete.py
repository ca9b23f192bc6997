"""DeleteTopic deletes for real (store_topics' steps), in one process on real files: a topic created
again with the name starts empty at queue offset 0, the old records are never served (Pull, GetMessage,
the consume queues rebuilt from the log at start), a delete cut short at each step is resumed at
start or by deleting again, an append in flight across the delete writes nothing, and a batch not yet
dispatched gets no consume queue entries once its topic is gone."""

from __future__ import annotations

import shutil

import pytest

from mqstore import store_offsets
from mqstore.errors import FailedPrecondition, NotFound
from mqstore.failpoints import FailpointHit
from mqstore.format import topic_event
from mqstore.model import KIND_COMPACTION, MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store


def _fill(store: MessageStore, topic: str, count: int, queues: int = 2, **create) -> list:
    store.topic_admin.create(topic, queues, **create)
    keys = create.get("kind") == KIND_COMPACTION
    return list(store.append(topic, [MessageIn(body=f"old-{i}".encode(), keys=(f"k{i}",) if keys else (),
                                               queue_id=None if keys else i % queues) for i in range(count)]))


def _bodies(store: MessageStore, topic: str, queues: int) -> list[bytes]:
    return [m.record.body for q in range(queues) for m in store.pull(topic, q, 0, max_messages=100).messages]


def _events(store: MessageStore) -> list[topic_event.TopicEvent]:
    return [topic_event.decode(m.record.body) for m in store.pull(topic_event.TOPIC, 0, 0, max_messages=100).messages]


def _check_recreated(store: MessageStore, old: list, bodies: tuple[bytes, ...] = (b"new",)) -> None:
    """``t`` was deleted and created again with one queue, holding ``bodies`` only."""
    assert [store.queue_info("t", 0).min_offset, store.queue_info("t", 0).max_offset] == [0, len(bodies)]
    assert _bodies(store, "t", 1) == list(bodies)
    for result in old:
        with pytest.raises(NotFound, match="deleted topic"):
            store.get_message(result.physical_offset)
        with pytest.raises(NotFound, match="deleted topic"):
            store.get_message_raw(result.physical_offset)
    lookups = store.get_messages([r.physical_offset for r in old])
    assert all(not found.message and "deleted topic" in found.missing for found in lookups)
    new = store.pull("t", 0, 0).messages[0]
    assert store.get_message(new.record.physical_offset).record.body == b"new"


@pytest.mark.parametrize("kind", ["NORMAL", KIND_COMPACTION])
def test_a_topic_created_again_starts_empty_at_offset_0(small_config, kind):
    config = small_config()
    store = build_store(config)
    store.start()
    old = _fill(store, "t", 20, kind=kind)
    store_offsets.commit_offset(store, "g", "t", 0, 3)
    store.topic_admin.delete("t")
    with pytest.raises(NotFound):
        store.pull("t", 0, 0)
    created = store.topic_admin.create("t", 1, kind=kind)
    assert created.start_physical_offset == store.commitlog.written_offset > old[-1].physical_offset
    result = store.append("t", [MessageIn(body=b"new", keys=("k0",))])[0]
    assert (result.queue_id, result.queue_offset) == (0, 0)
    _check_recreated(store, old)
    with pytest.raises(NotFound):
        store_offsets.query_offset(store, "g", "t", 0)  # the old topic's consumer offsets went with it
    assert [(e.topic, e.start_physical_offset) for e in _events(store)] == [("t", 0)]
    store.stop()
    bodies = (b"new",)
    for rebuild in (False, True):  # a restart, then one that rebuilds every consume queue from the log
        if rebuild:
            shutil.rmtree(config.consumequeue_dir)
        store = build_store(config)
        store.start()
        _check_recreated(store, old, bodies)
        assert store.append("t", [MessageIn(body=b"more", keys=("k0",))])[0].queue_offset == len(bodies)
        bodies += (b"more",)
        store.stop()


@pytest.mark.parametrize("step", ["topic.delete.marked", "topic.delete.announced", "topic.delete.queues_dropped"])
def test_a_delete_cut_short_at_any_step_is_resumed_at_start(small_config, failpoint, step):
    config = small_config()
    store = build_store(config)
    store.start()
    old = _fill(store, "t", 20)
    failpoint(step)
    with pytest.raises(FailpointHit):
        store.topic_admin.delete("t")
    failpoint.disarm()
    with pytest.raises(NotFound):
        store.append("t", [MessageIn(body=b"x")])
    with pytest.raises(FailedPrecondition, match="being deleted"):
        store.topic_admin.create("t", 1)
    assert "t" not in [t.name for t in store.topic_admin.list()]
    store.halt()  # a crash: no checkpoint, the abort marker stays
    store = build_store(config)
    store.start()
    try:
        assert "t" not in [t.name for t in store.topic_admin.list()] and store.topics.deleting() == []
        assert {e.topic for e in _events(store)} == {"t"}  # announced (twice when cut after step 2: harmless)
        assert not (config.consumequeue_dir / "t").exists()
        store.topic_admin.create("t", 1)
        store.append("t", [MessageIn(body=b"new")])
        _check_recreated(store, old)
    finally:
        store.stop()


def test_deleting_again_finishes_a_delete_cut_short(small_config, failpoint):
    store = build_store(small_config())
    store.start()
    try:
        _fill(store, "t", 4)
        with failpoint.armed("topic.delete.announced"):
            with pytest.raises(FailpointHit):
                store.topic_admin.delete("t")
        store.topic_admin.delete("t")
        assert store.topics.deleting() == [] and store.topic_admin.create("t", 1).name == "t"
        with pytest.raises(NotFound):
            store.topic_admin.delete("nope")
    finally:
        store.stop()


def test_an_append_in_flight_across_a_delete_writes_nothing(small_config):
    store = build_store(small_config())
    store.start()
    try:
        _fill(store, "t", 2)
        batch = store.encoder.encode_batch(store.topic_admin.get("t"), [MessageIn(body=b"late")], store.clock.now_ms())
        store.topic_admin.delete("t")
        store.topic_admin.create("t", 1)  # even with the name taken again: the batch was encoded for the old topic
        end = store.commitlog.written_offset
        with pytest.raises(NotFound, match="deleted while this append"):
            store.commitlog.append(batch)
        assert store.commitlog.written_offset == end and store.queue_info("t", 0).max_offset == 0
    finally:
        store.stop()


def test_a_batch_dispatched_after_its_topic_is_gone_gets_no_queue(small_config):
    config = small_config(flush_mode="SYNC", flush_interval_ms=60_000)
    store = build_store(config)
    store.start()
    try:
        store.topic_admin.create("t", 1)
        batch = store.encoder.encode_batch(store.topic_admin.get("t"), [MessageIn(body=b"pending")],
                                           store.clock.now_ms())
        store.commitlog.append(batch)  # written, not dispatched (SYNC: after its fsync)
        store.topic_admin.delete("t")  # its announcement's flush dispatches the pending batch
        store.dispatcher.run_pending(store.commitlog.written_offset)
        assert store.queues.get("t", 0) is None and not (config.consumequeue_dir / "t").exists()
    finally:
        store.stop()
