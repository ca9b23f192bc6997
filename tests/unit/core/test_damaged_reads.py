"""Known damage must not stall readers: a record damaged while the store runs (written through the
file, which the store's shared mapping sees) is named by Pull so that a consumer can skip it, and Tail
frames stay aligned on the records around it even when its TOTALSIZE is what was damaged."""

from __future__ import annotations

import pytest

from mqstore import tailing
from mqstore.errors import DataLoss, InvalidArgument
from mqstore.format import record, record_reader
from mqstore.model import TAIL_AT_OFFSET, TAIL_EARLIEST, MessageIn
from mqstore.store_parts import build_store


@pytest.fixture
def store(small_config):
    s = build_store(small_config())
    s.start()
    s.topic_admin.create("t", 1)
    yield s
    s.stop()


def _damage(store, physical_offset: int, position_in_record: int, data: bytes) -> None:
    size = store.config.segment_size_bytes
    path = store.config.commitlog_dir / f"{physical_offset - physical_offset % size:020d}"
    with open(path, "r+b") as f:
        f.seek(physical_offset % size + position_in_record)
        f.write(data)


def _append(store, count: int, tags: str = "") -> list:
    return list(store.append("t", [MessageIn(body=bytes([i]) * 300, queue_id=0, tags=tags) for i in range(count)]))


def test_pull_serves_the_good_messages_before_a_damaged_record_then_names_it(store):
    results = _append(store, 10)
    bad = results[4]
    _damage(store, bad.physical_offset, 100, b"\xff\xfe")  # a body byte: the CRC fails
    page = store.pull("t", 0, 0, max_messages=100)
    assert [m.record.queue_offset for m in page.messages] == [0, 1, 2, 3] and page.next_offset == 4
    with pytest.raises(DataLoss) as info:
        store.pull("t", 0, 4, max_messages=100)
    assert (info.value.queue_offset, info.value.physical_offset) == (4, bad.physical_offset)
    assert "queue offset 5" in str(info.value)  # where to read on to skip it
    assert [m.record.queue_offset for m in store.pull("t", 0, 5, max_messages=100).messages] == [5, 6, 7, 8, 9]
    with pytest.raises(DataLoss) as info:
        store.get_message(bad.physical_offset)
    assert info.value.physical_offset == bad.physical_offset and info.value.queue_offset is None


def test_pull_with_a_tag_filter_names_the_damaged_record_after_the_skipped_ones(store):
    other = _append(store, 3, tags="x")
    results = _append(store, 3, tags="a")
    _damage(store, results[0].physical_offset, 100, b"\xff\xfe")
    with pytest.raises(DataLoss) as info:
        store.pull("t", 0, 0, max_messages=100, tags=["a"])
    assert info.value.queue_offset == results[0].queue_offset == len(other)
    page = store.pull("t", 0, len(other) + 1, tags=["a"])
    assert [m.record.queue_offset for m in page.messages] == [4, 5]
    assert [m.record.queue_offset for m in store.pull("t", 0, 0, tags=["x"]).messages] == [0, 1, 2]


def _tail_all(store, start=TAIL_EARLIEST, offset=0):
    """Every frame up to the visible end (no waiting: stops at the first heartbeat)."""
    frames = []
    for frame in tailing.tail(store, start, offset, [], 1 << 20, 10, lambda: True):
        if not frame.record_count:
            return frames
        frames.append(frame)
        if len(frames) > 100:
            raise AssertionError("more frames than records")
    return frames


def _frames_cover_the_log(store, frames) -> None:
    """Unfiltered frames are contiguous: the log's bytes [next - len, next), back to back."""
    position = store.commitlog.min_offset
    for frame in frames:
        first = frame.next_physical_offset - len(frame.records)
        assert first == position, "no gap, no overlap"
        assert frame.records == store.commitlog.read(first, len(frame.records))
        position = frame.next_physical_offset
    assert position == store.visible_offset()


@pytest.mark.parametrize("totalsize, alone", [
    (lambda size: size // 2, True),     # the next "record" would start inside this one's body
    (lambda size: 0, True),             # no record at all
    (lambda size: 1 << 30, True),       # beyond the segment
    (lambda size: size + 5, True),      # a few bytes into the next record
    (lambda size: size * 3, False),     # on a record boundary: framed whole; readers resynchronise inside
])
def test_tail_stays_aligned_around_a_damaged_totalsize(store, totalsize, alone):
    results = _append(store, 8)
    bad = results[3]
    _damage(store, bad.physical_offset, 0, record.INT32.pack(totalsize(bad.size_bytes)))
    frames = _tail_all(store)
    _frames_cover_the_log(store, frames)
    lone = [f for f in frames if f.next_physical_offset - len(f.records) == bad.physical_offset
            and f.next_physical_offset == results[4].physical_offset]
    assert bool(lone) == alone


def test_tail_frames_the_good_records_around_one_that_names_another_offset(store):
    results = _append(store, 5)
    _damage(store, results[2].physical_offset, 28, record.INT64.pack(12345))  # its PHYSICALOFFSET
    frames = _tail_all(store)
    _frames_cover_the_log(store, frames)
    assert frames[0].next_physical_offset == results[2].physical_offset  # the good ones before it
    assert (frames[1].next_physical_offset - len(frames[1].records), frames[1].next_physical_offset) == (
        results[2].physical_offset, results[3].physical_offset)  # alone
    assert record_reader.decode(frames[2].records, 0).physical_offset == results[3].physical_offset


def test_tail_frames_end_before_a_blank_record(store):
    results = _append(store, 40)  # about 3 segments of 16 KiB: two blank records
    size = store.config.segment_size_bytes
    previous_next, count = 0, 0
    for frame in _tail_all(store):
        first = frame.next_physical_offset - len(frame.records)
        assert frame.records == store.commitlog.read(first, len(frame.records))
        if first != previous_next:  # only a blank record is skipped: from it to the segment's end
            assert record_reader.is_blank(store.commitlog.read(previous_next, 8), 0) and first % size == 0
        previous_next = frame.next_physical_offset
        count += frame.record_count
    assert count == len(results) and previous_next == store.visible_offset()


def test_tail_can_start_at_a_record_damaged_since_a_reader_stopped_there(store):
    results = _append(store, 5)
    _damage(store, results[2].physical_offset, 0, record.INT32.pack(7))  # its TOTALSIZE
    frames = _tail_all(store, TAIL_AT_OFFSET, results[2].physical_offset)
    assert (frames[0].next_physical_offset - len(frames[0].records), frames[0].next_physical_offset) == (
        results[2].physical_offset, results[3].physical_offset)
    assert frames[-1].next_physical_offset == store.visible_offset()
    with pytest.raises(InvalidArgument):  # still: an offset inside a record is refused
        _tail_all(store, TAIL_AT_OFFSET, results[1].physical_offset + 10)


@pytest.mark.parametrize("topic", ["a\x00b", "..", ".", "../outside", "a/b", ""])
def test_a_queue_of_a_topic_no_directory_can_be_is_data_loss_and_makes_nothing(tmp_path, topic):
    """A replay that reads a damaged record's topic as one that was never appendable (a NUL byte, a path) stops with
    DataLoss naming it, not with the file system's ValueError, and makes no directory: "../outside" would be one
    beside the table's."""
    from mqstore.queue.dispatch import QueueTable
    root = tmp_path / "consumequeue"
    root.mkdir()
    table = QueueTable(root, 16)
    with pytest.raises(DataLoss, match="damaged"):
        table.get_or_create(topic, 0)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["consumequeue"]
    assert table.queues == {}
    table.get_or_create("fine", 0)  # the table keeps working
    assert (root / "fine" / "0").is_dir()
