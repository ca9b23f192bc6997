"""A replica's restart of its log at another offset and the segment warmer (mqstore.log.commitlog's ``reshaping``):
a warmer step that read the written offset before the restart must not create the new log's first segment where the
old log was. Found by the suite under a CPU hog (`make test-loaded`): test_tier_join's join from the tier refused the
replica's log, which held [its old segment's start, the new start) after the restart."""

from __future__ import annotations

import threading

from mqstore.model import MessageIn
from mqstore.replication import store_ops
from tests.unit.replication.pair import open_node


def test_a_warmer_step_racing_a_restart_creates_no_segment_below_the_new_start(small_config, tmp_path, monkeypatch):
    store, node = open_node(small_config, tmp_path, "b")
    try:
        node.become_leader(1, frozenset({"b"}))  # to write the log it will hold when it restarts as a replica
        store.topic_admin.create("t", 1)
        for _ in range(3):
            store.append("t", [MessageIn(body=b"x" * 1000) for _ in range(8)], replication="ASYNC")
        node.become_replica("a", "h:a", 2)
        size = store.config.segment_size_bytes
        new_start = (store.log_end() // size + 10) * size  # a leader's first segment, far past this log's end
        segments = store.commitlog.segments
        delete_from = segments.delete_from
        steps: list[threading.Thread] = []

        def deleted_then_warmed(offset):
            gone = delete_from(offset)
            # the warmer's step at this moment: it read (or reads now) the written offset of the log just deleted
            step = threading.Thread(target=store.warmer._warm, name="warm-step")
            step.start()
            steps.append(step)
            step.join(0.5)  # done at once unless it waits for the restart to end
            return gone

        monkeypatch.setattr(segments, "delete_from", deleted_then_warmed)
        store_ops.restart_at(store, new_start)
        monkeypatch.undo()
        for step in steps:
            step.join(10)
            assert not step.is_alive()
        assert store.log_min() == store.log_end() == new_start
        assert min(seg.start for seg in store.commitlog.segments.segments) == new_start
    finally:
        store.stop()
