"""A record that fails its checks does not stop the index: the frame's other records are indexed, the
bad range is reported (FollowerState, Stats) and the follower goes on after it, also when the record's
TOTALSIZE is what was damaged. Frames from the fake log (tests/unit/index/fake_log.py) and from a real
MessageStore's Tail (whose framing around damage is part of what is tested)."""

from __future__ import annotations

import pytest
from fake_log import FakeLog
from mqstore import tailing
from mqstore.index.decode import decode_frame
from mqstore.index.follower import index_follower
from mqstore.index.store import IndexStore
from index_testing import tiny_config
from mqstore.format import record
from mqstore.model import TAIL_EARLIEST, MessageIn
from mqstore.store_parts import build_store
from test_follower import FAST, offsets, wait_until


@pytest.fixture
def store(tmp_path):
    s = IndexStore(tiny_config(tmp_path / "index", slot_count=8, entry_count=40, max_keys_per_message=4))
    s.start()
    yield s
    s.close()


def _frame(log: FakeLog, first: int = 0, count: int = 100) -> tuple[bytes, int]:
    chosen = log.stored[first:first + count]
    return b"".join(s.data for s in chosen), chosen[-1].physical_offset + len(chosen[-1].data)


@pytest.mark.parametrize("damage", [
    (100, b"\xff\xfe"),                                   # a body byte: only the CRC fails
    (0, None),                                            # TOTALSIZE x3: it would swallow the next two
    (0, record.INT32.pack(7)),                            # TOTALSIZE below any record
    (28, record.INT64.pack(99)),                          # PHYSICALOFFSET names another place
    (84, record.INT32.pack(2)),                           # BODYLENGTH
])
def test_decode_frame_skips_exactly_the_damaged_record(damage):
    log = FakeLog()
    stored = [log.append("t", (f"k{i}",), f"U{i}", body=bytes([i]) * 120) for i in range(6)]
    bad = stored[2]
    position, data = damage
    log.damage(bad, position, data if data is not None else record.INT32.pack(3 * len(bad.data)))
    for first in (0, 2):  # the bad record in the middle of a frame, and first in it
        frame, nxt = _frame(log, first)
        decoded = decode_frame(frame, nxt)
        expected = [s.physical_offset for s in stored[first:] if s is not bad]
        assert [r.physical_offset for r in decoded.records] == expected
        [gap] = decoded.damaged
        assert (gap.start_physical_offset, gap.end_physical_offset) == (bad.physical_offset, stored[3].physical_offset)


def test_decode_frame_with_the_last_record_damaged_skips_to_the_frame_end():
    log = FakeLog()
    stored = [log.append("t", ("k",), f"U{i}") for i in range(3)]
    log.damage(stored[2], 0, record.INT32.pack(5))
    frame, nxt = _frame(log)
    decoded = decode_frame(frame, nxt)
    assert len(decoded.records) == 2
    assert [(d.start_physical_offset, d.end_physical_offset) for d in decoded.damaged] == [
        (stored[2].physical_offset, nxt)]


def test_the_follower_indexes_around_a_damaged_record_and_reports_it(store):
    log = FakeLog(frame_records=4)
    stored = [log.append("t", ("all", f"k{i}"), f"U{i}", body=b"x" * 200) for i in range(20)]
    log.damage(stored[5], 100, b"\xff")  # its body: CRC
    log.damage(stored[13], 0, record.INT32.pack(3 * len(stored[13].data)))  # its TOTALSIZE
    follower = index_follower(store, log, FAST)
    follower.start()
    try:
        wait_until(lambda: store.resume_physical_offset() == log.end(), "the records after the damage")
    finally:
        follower.stop()
    state = follower.state()
    assert state.healthy and state.last_error == ""
    assert [(d.start_physical_offset, d.end_physical_offset) for d in state.damaged_ranges] == [
        (stored[5].physical_offset, stored[6].physical_offset),
        (stored[13].physical_offset, stored[14].physical_offset)]
    assert state.damaged_bytes == len(stored[5].data) + len(stored[13].data)
    good = [s for i, s in enumerate(stored) if i not in (5, 13)]
    assert offsets(store, "t", "all") == [s.physical_offset for s in reversed(good)]
    assert offsets(store, "t", "k5") == [] and offsets(store, "t", "k6") == [stored[6].physical_offset]


@pytest.mark.parametrize("at, data", [
    (100, lambda size: b"\xff\xfe"),                      # body: CRC
    (0, lambda size: record.INT32.pack(0)),                # TOTALSIZE: none
    (0, lambda size: record.INT32.pack(1 << 30)),          # TOTALSIZE: beyond the segment
    (0, lambda size: record.INT32.pack(size // 2)),        # TOTALSIZE: into its own body
    (0, lambda size: record.INT32.pack(size * 3)),         # TOTALSIZE: swallowing two records
    (28, lambda size: record.INT64.pack(5)),               # PHYSICALOFFSET
])
def test_frames_of_a_real_tail_decode_around_a_damaged_record(small_config, at, data):
    log_store = build_store(small_config())
    log_store.start()
    try:
        log_store.topic_admin.create("t", 1)
        results = list(log_store.append("t", [MessageIn(body=bytes([i]) * 300, keys=(f"k{i}",), queue_id=0)
                                              for i in range(30)]))  # two segments of 16 KiB
        bad = results[7]
        size = log_store.config.segment_size_bytes
        path = log_store.config.commitlog_dir / f"{bad.physical_offset - bad.physical_offset % size:020d}"
        with open(path, "r+b") as f:
            f.seek(bad.physical_offset % size + at)
            f.write(data(bad.size_bytes))
        records, damaged = [], []
        for frame in tailing.tail(log_store, TAIL_EARLIEST, 0, [], 2048, 10, lambda: True):
            if not frame.record_count:
                break
            decoded = decode_frame(frame.records, frame.next_physical_offset)
            records += decoded.records
            damaged += decoded.damaged
    finally:
        log_store.stop()
    assert [r.physical_offset for r in records] == [r.physical_offset for r in results if r is not bad]
    assert [(d.start_physical_offset, d.end_physical_offset) for d in damaged] == [
        (bad.physical_offset, results[8].physical_offset)]
