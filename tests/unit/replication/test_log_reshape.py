"""A replica's restart of its log at another offset and the segment warmer (mqstore.log.commitlog's ``reshaping``):
a warmer step that read the written offset before the restart must not create the new log's first segment where the
old log was. Found by the suite under a CPU hog (`make test-loaded`): test_tier_join's join from the tier refused the
replica's log, which held [its old segment's start, the new start) after the restart."""

from __future__ import annotations

import os
import pathlib
import threading

from mqstore.log.segment import Segment
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


def _log_bytes(store, start: int, end: int) -> bytes:
    out = bytearray()
    for seg in store.commitlog.segments.segments:
        lo, hi = max(seg.start, start), min(seg.end, end)
        if lo < hi:
            out += seg.read(lo - seg.start, hi - lo)
    return bytes(out)


def _written_node(small_config, tmp_path, kib: int):
    """Node b, a leader of epoch 1 with ~``kib`` KiB of 1 KiB messages in 1 MiB segments, then turned replica."""
    store, node = open_node(lambda **kw: small_config(segment_size_bytes=1 << 20, **kw), tmp_path, "b")
    node.become_leader(1, frozenset({"b"}))
    store.topic_admin.create("t", 1)
    for _ in range(kib // 8):
        store.append("t", [MessageIn(body=b"x" * 900) for _ in range(8)], replication="ASYNC")
    return store, node


def test_a_diverged_tail_is_kept_as_a_copy_of_the_cut_bytes_only(small_config, tmp_path):
    """The .broken copies of a cut hold the bytes the log lost, at their positions in each segment, and nothing
    else: a copy of the whole segment took seconds and a segment of disk at every failover (1 GiB segments in
    the HA compose file), while the new leader waited for this replica (make compose-check-chaos)."""
    store, node = _written_node(small_config, tmp_path, 900)
    try:
        point = store.log_end()  # the prefix the new leader shares; what follows is the diverged tail
        for _ in range(40):  # ~320 KiB more: past the first segment's end, into the second
            store.append("t", [MessageIn(body=b"y" * 900) for _ in range(8)], replication="ASYNC")
        cut_from = store.log_end()
        assert cut_from > 1 << 20 > point
        cut = _log_bytes(store, point, cut_from)
        node.become_replica("a", "h:a", 2)
        copies = sorted(store_ops.truncate(store, point))
        assert store.log_end() == point
        assert len(copies) == 2, copies
        parts = []
        for path, seg_start in zip(copies, (0, 1 << 20), strict=True):
            data = pathlib.Path(path).read_bytes()
            assert len(data) == 1 << 20  # the segment's size, as the segment file: positions kept
            lo, hi = max(seg_start, point) - seg_start, min(seg_start + (1 << 20), cut_from) - seg_start
            assert data[:lo] == bytes(lo) and data[hi:] == bytes(len(data) - hi)  # nothing but the cut bytes
            parts.append(data[lo:hi])
            allocated = os.stat(path).st_blocks * 512
            assert allocated <= hi - lo + (64 << 10), f"{path}: {allocated} bytes on disk for {hi - lo} cut"
        assert b"".join(parts) == cut
    finally:
        store.stop()


def test_a_restarted_log_keeps_copies_only_of_what_it_held_past_the_shared_prefix(small_config, tmp_path):
    store, node = _written_node(small_config, tmp_path, 1400)
    try:
        written = store.log_end()
        keep_from = 1 << 20  # the prefix both logs share ends inside this log's second segment
        keep_from += 4096
        held = _log_bytes(store, keep_from, written)
        node.become_replica("a", "h:a", 2)
        copies = store_ops.restart_at(store, 8 << 20, keep_from=keep_from)
        assert len(copies) == 1, copies  # the first segment is all shared: no copy
        data = pathlib.Path(copies[0]).read_bytes()
        lo = keep_from - (1 << 20)
        assert data[:lo] == bytes(lo) and data[lo:written - (1 << 20)] == held
        assert store.log_min() == store.log_end() == 8 << 20
    finally:
        store.stop()


def _diverged(store, node, body_bytes: int) -> tuple[int, int]:
    """A leader of epoch 1 writes 64 messages of topic t (up to the point a new leader will share), then 64 more
    (the tail that diverges), then turns replica: (point, the log's end)."""
    node.become_leader(1, frozenset({"b"}))
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x" * body_bytes) for _ in range(64)], replication="ASYNC")
    point = store.log_end()
    store.append("t", [MessageIn(body=b"y" * body_bytes) for _ in range(64)], replication="ASYNC")
    node.become_replica("a", "h:a", 2)
    return point, store.log_end()


def test_a_cut_zeroes_what_was_written_past_it_not_the_rest_of_the_segment(small_config, tmp_path):
    """Zeroing a 1 GiB segment from the cut to its end (and flushing it) took seconds while a new leader waited
    for this replica; past the written offset the segment holds nothing to zero. A sparse segment's rest stays
    a hole (no block written), and a restart reads the log as cut."""
    size = 64 << 20

    def config(**kw):
        return small_config(segment_size_bytes=size, warm_ahead_bytes=0, **kw)
    store, node = open_node(config, tmp_path, "b")
    try:
        point, cut_from = _diverged(store, node, 900)
        store_ops.truncate(store, point)
        seg = store.commitlog.segments.segments[0]
        assert seg.read(point, cut_from - point) == bytes(cut_from - point)
        allocated = os.stat(seg.path).st_blocks * 512
        assert allocated <= cut_from + (1 << 20), f"{allocated} bytes of the {size}-byte segment written"
    finally:
        store.stop()
    store, node = open_node(config, tmp_path, "b")
    try:
        assert store.log_end() == point
    finally:
        store.stop()


def test_a_cut_zeroes_the_queue_entries_written_past_it_not_the_rest_of_their_files(small_config, tmp_path,
                                                                                    monkeypatch):
    """A replica's cut drops the consume queue entries of the records it cuts: it zeroes those entries, not each
    queue file from there to its end (6 MB a file at the default 300,000 entries, written through the mapping and
    flushed for every queue). The zeroing is counted where it happens (the page cache cannot tell: a write fault
    in a fallocated file reads the whole file ahead)."""
    zeroed: list[int] = []
    real_range = Segment.zero_range

    def zero_range(seg, start, end):
        zeroed.append(end - start)
        real_range(seg, start, end)

    def zero_from(seg, position):
        zeroed.append(seg.size - position)
        real_range(seg, position, seg.size)
    monkeypatch.setattr(Segment, "zero_range", zero_range)
    monkeypatch.setattr(Segment, "zero_from", zero_from)
    store, node = open_node(lambda **kw: small_config(cq_entries_per_file=300_000, **kw), tmp_path, "b")
    try:
        point, cut_from = _diverged(store, node, 100)
        queue = store.queues.get("t", 0)
        assert queue.max_offset == 128
        zeroed.clear()
        store_ops.truncate(store, point)
        assert queue.max_offset == 64 and queue.entry(63)[0] < point
        assert queue.entry_bytes(64, 1) in (b"", bytes(20))  # gone
        assert sum(zeroed) <= (cut_from - point) + 64 * 20, zeroed  # the log's cut bytes and 64 entries
    finally:
        store.stop()
