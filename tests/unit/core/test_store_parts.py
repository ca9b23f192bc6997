"""The storage core knows neither topic administration nor the replica side (issue 33, item 1): a bare
MessageStore serves appends and reads without them, its two hooks (``on_start``, ``dispatch_through``) are what
those parts use, and mqstore.store_parts.build_store composes both onto them (a delete cut short is resumed at
start only by a store built there)."""

from __future__ import annotations

import pytest

from mqstore.failpoints import FailpointHit
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from mqstore.store_replica import ReplicaView
from mqstore.topic_admin import TopicAdmin


def test_a_bare_store_has_neither_part_and_serves_appends_and_reads(small_config):
    store = MessageStore(small_config())
    assert not hasattr(store, "topic_admin") and not hasattr(store, "replica_view")
    store.start()
    try:
        store.topics.create("t", 1)
        store.append("t", [MessageIn(body=b"a", queue_id=0), MessageIn(body=b"b", queue_id=0)])
        assert [m.record.body for m in store.pull("t", 0, 0).messages] == [b"a", b"b"]
    finally:
        store.stop()


def test_the_start_steps_run_in_order_once_the_store_serves(small_config):
    store = MessageStore(small_config())
    seen = []
    store.on_start(lambda: seen.append(("first", store.running)))
    store.on_start(lambda: seen.append(("second", store.running)))
    store.start()
    try:
        assert seen == [("first", True), ("second", True)]
    finally:
        store.stop()


def test_every_dispatch_of_the_write_path_goes_through_the_hook(small_config):
    store = MessageStore(small_config())
    limits = []

    def dispatch_to(limit: int) -> None:
        limits.append(limit)
        store.dispatcher.run_pending(limit)

    store.dispatch_through(dispatch_to)
    store.start()
    try:
        store.topics.create("t", 1)
        entries = store.append("t", [MessageIn(body=b"a", queue_id=0)]).entries
        end = entries[-1][0] + entries[-1][1]
        assert limits and max(limits) >= end
        assert [m.record.body for m in store.pull("t", 0, 0).messages] == [b"a"]
        before_stop = len(limits)
    finally:
        store.stop()
    assert len(limits) > before_stop  # the stop dispatches what the last flush covered through it too


def test_build_store_composes_both_parts_and_resumes_a_delete_cut_short(small_config, failpoint):
    config = small_config()
    store = build_store(config)
    assert isinstance(store.topic_admin, TopicAdmin) and isinstance(store.replica_view, ReplicaView)
    store.start()
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"old", queue_id=0)])
    failpoint("topic.delete.marked")
    with pytest.raises(FailpointHit):
        store.topic_admin.delete("t")
    failpoint.disarm()
    store.halt()  # a crash: the row stays marked
    bare = MessageStore(config)  # no part hooked: the delete stays cut short
    bare.start()
    try:
        assert [t.name for t in bare.topics.deleting()] == ["t"]
    finally:
        bare.halt()
    store = build_store(config)
    store.start()
    try:
        assert store.topics.deleting() == [] and "t" not in [t.name for t in store.topic_admin.list()]
    finally:
        store.stop()
