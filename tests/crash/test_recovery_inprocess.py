"""Recovery from damaged logs: torn tail vs corruption, repair, rebuilt consume queues, bad checkpoint.
(Crash tests with real killed processes are in test_kill9.py.)"""

from __future__ import annotations

import os
import shutil

import pytest

from mqstore import failpoints
from mqstore.errors import CorruptLog, FailedPrecondition
from mqstore.format import record
from mqstore.log.recovery import repair
from mqstore.log.repair import repair as offline_repair
from mqstore.log.segment import SegmentQueue
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from tests.support import records


def _filled(config, count=30, body_size=900):
    store = build_store(config)
    store.start()
    store.topic_admin.create("t", 2)
    results = []
    for i in range(0, count, 5):
        results += store.append("t", [MessageIn(body=bytes([i + j]) * body_size, queue_id=(i + j) % 2)
                                      for j in range(5)])
    return store, results


def _segment_for(config, physical_offset):
    seg_size = config.segment_size_bytes
    path = config.commitlog_dir / f"{physical_offset - physical_offset % seg_size:020d}"
    return path, physical_offset % seg_size


def test_torn_tail_is_cut_and_logged(small_config):
    config = small_config()
    store, results = _filled(config)
    end = store.commitlog.written_offset
    store.halt()
    # A partial record after the end: the start of a real record, then zeros (a copy cut short).
    path, pos = _segment_for(config, end)
    partial = records.encode(topic=b"t", body=b"z" * 500)[:200]
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(partial)
    store = build_store(config)
    store.start()
    try:
        assert store.recovery.torn_bytes_cut == 200
        assert store.commitlog.written_offset == end
        assert store.queue_info("t", 0).max_offset == 15
        # The store appends after the cut and reads everything back.
        store.append("t", [MessageIn(body=b"after", queue_id=0)])
        assert store.pull("t", 0, 15).messages[0].record.body == b"after"
    finally:
        store.stop()


def test_torn_last_record_rolls_back_queue(small_config):
    config = small_config()
    store, results = _filled(config)
    last = results[-1]
    store.halt()
    path, pos = _segment_for(config, last.physical_offset)
    with open(path, "r+b") as f:  # zero the second half of the last record: a torn copy
        f.seek(pos + last.size_bytes // 2)
        f.write(bytes(last.size_bytes - last.size_bytes // 2))
    store = build_store(config)
    store.start()
    try:
        assert store.commitlog.written_offset == last.physical_offset
        assert store.queue_info("t", last.queue_id).max_offset == last.queue_offset
    finally:
        store.stop()


def test_mid_file_corruption_refuses_then_repair_keeps_broken_copy(small_config):
    config = small_config()
    store, results = _filled(config, count=40)
    store.stop()
    (config.data_dir / "checkpoint").unlink()  # force a full re-check
    victim = results[3]
    path, pos = _segment_for(config, victim.physical_offset)
    with open(path, "r+b") as f:
        f.seek(pos + 100)
        f.write(b"\xff\xfe")
    with pytest.raises(CorruptLog) as info:
        build_store(config).start()
    err = info.value
    assert err.path == str(path) and err.position == pos
    assert "mqstore repair" in str(err) and str(pos) in str(err)

    segments = SegmentQueue(config.commitlog_dir, config.segment_size_bytes, preallocate=False)
    segments.load()
    report = repair(segments, config.max_write_bytes)
    segments.close()
    assert report.corrupt and report.end_offset == victim.physical_offset
    assert any(p.endswith(".broken") for p in report.broken_copies)
    assert (path.parent / (path.name + ".broken")).exists()

    store = build_store(config)
    store.start()
    try:
        kept = [r for r in results if r.physical_offset < victim.physical_offset]
        for r in kept:
            assert store.get_message(r.physical_offset).record.body == bytes([results.index(r)]) * 900
        assert store.commitlog.written_offset == victim.physical_offset
    finally:
        store.stop()


def test_consume_queues_rebuilt_when_missing(small_config):
    config = small_config()
    store, results = _filled(config)
    before = [store.queue_info("t", q) for q in range(2)]
    store.stop()
    shutil.rmtree(config.consumequeue_dir)
    store = build_store(config)
    store.start()
    try:
        assert [store.queue_info("t", q) for q in range(2)] == before
        msgs = store.pull("t", 1, 0, max_messages=100).messages
        assert [m.record.queue_offset for m in msgs] == list(range(15))
    finally:
        store.stop()


def test_bad_checkpoint_means_full_recheck(small_config):
    config = small_config()
    store, results = _filled(config)
    store.halt()
    (config.data_dir / "checkpoint").write_bytes(b"garbage")
    store = build_store(config)
    store.start()
    try:
        assert store.recovery.records_checked == len(results)
        assert store.queue_info("t", 0).max_offset == 15
    finally:
        store.stop()


def test_second_process_cannot_open_same_dir(small_config):
    config = small_config()
    store = build_store(config)
    store.start()
    try:
        with pytest.raises(Exception) as info:
            build_store(config).start()
        assert "in use" in str(info.value)
    finally:
        store.stop()


def test_one_missing_queue_is_rebuilt_from_the_log(small_config):
    config = small_config()
    store, results = _filled(config)
    store.append("t", [MessageIn(body=b"late", queue_id=0)])
    before = [store.queue_info("t", q) for q in range(2)]
    store.stop()
    shutil.rmtree(config.consumequeue_dir / "t" / "1")
    store = build_store(config)
    store.start()
    try:
        assert [store.queue_info("t", q) for q in range(2)] == before
        bodies = [m.record.body for m in store.pull("t", 1, 0, max_messages=100).messages]
        assert bodies == [r_body for r_body in (bytes([i]) * 900 for i in range(30)) if r_body[0] % 2 == 1]
    finally:
        store.stop()


def test_deleted_topic_is_not_resurrected_by_replay(small_config):
    config = small_config()
    store, _ = _filled(config)
    store.topic_admin.delete("t")
    store.halt()
    (config.data_dir / "checkpoint").unlink()
    store = build_store(config)
    store.start()
    try:
        assert store.queues.get("t", 0) is None
    finally:
        store.stop()


@pytest.mark.parametrize("checkpoint", [True, False])
def test_copy_cut_short_with_its_head_unwritten(small_config, checkpoint):
    # glibc's memcpy of a large buffer stores its first bytes last: a kill -9 in the middle of a batch
    # copy leaves zeros at the batch's start, then records, then zeros. After the checkpoint's flushed
    # offset that is a torn tail (nothing there was confirmed durable); without a checkpoint the store
    # cannot tell it from corruption and refuses to start.
    config = small_config()
    store, results = _filled(config)
    batch = b"".join(records.encode(topic=b"t", body=bytes([200 + i]) * 700) for i in range(10))
    while store.commitlog.written_offset % config.segment_size_bytes + len(batch) + 8 > config.segment_size_bytes:
        store.append("t", [MessageIn(body=b"pad" * 300, queue_id=1)])  # so that the batch fits this segment
    end = store.commitlog.written_offset
    expected = store.queue_info("t", 0).max_offset
    store.halt()
    path, pos = _segment_for(config, end)
    with open(path, "r+b") as f:
        f.seek(pos + 32)
        f.write(batch[32:len(batch) * 3 // 4])  # head not yet stored, tail not yet copied
    if not checkpoint:
        (config.data_dir / "checkpoint").unlink()
        with pytest.raises(CorruptLog):
            build_store(config).start()
        return
    store = build_store(config)
    store.start()
    try:
        assert store.recovery.torn_bytes_cut == len(batch) * 3 // 4
        assert store.commitlog.written_offset == end
        assert store.queue_info("t", 0).max_offset == expected
    finally:
        store.stop()


# ---- damage below the checkpoint's flushed offset (found by the re-check window at start) -----------

def _damage(path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def _data_segments(config, results) -> list[int]:
    """Start offsets of the segments up to the one holding the last record (the warmer may have
    created an empty one after it)."""
    size = config.segment_size_bytes
    return list(range(0, results[-1].physical_offset - results[-1].physical_offset % size + 1, size))


def test_torn_last_record_of_a_cleanly_stopped_store_is_cut(small_config):
    config = small_config()
    store, results = _filled(config)
    store.stop()
    last = results[-1]
    path, pos = _segment_for(config, last.physical_offset)
    _damage(path, pos + last.size_bytes // 2, bytes(last.size_bytes - last.size_bytes // 2))  # a file cut short
    store = build_store(config)
    store.start()
    try:
        assert store.recovery.torn_bytes_cut == last.size_bytes // 2
        assert store.commitlog.written_offset == last.physical_offset
        assert store.queue_info("t", last.queue_id).max_offset == last.queue_offset
        store.append("t", [MessageIn(body=b"after", queue_id=last.queue_id)])
        assert store.pull("t", last.queue_id, last.queue_offset).messages[0].record.body == b"after"
    finally:
        store.stop()


def _bad_totalsize(result) -> bytes:
    return record.INT32.pack(result.size_bytes * 3)  # plausible: it would swallow the next two records


@pytest.mark.parametrize("where", ["first segment", "last segment"])
@pytest.mark.parametrize("damage", ["body byte", "TOTALSIZE"])
def test_damage_below_the_checkpoint_refuses_start(small_config, where, damage):
    config = small_config()
    store, results = _filled(config, count=40)
    store.stop()
    assert len(_data_segments(config, results)) == 3  # all within the default re-check window of 3 segments
    last_segment_start = results[-1].physical_offset - results[-1].physical_offset % config.segment_size_bytes
    victim = results[3] if where == "first segment" else next(
        r for r in results if r.physical_offset > last_segment_start)
    assert victim.physical_offset + victim.size_bytes * 3 < results[-1].physical_offset
    path, pos = _segment_for(config, victim.physical_offset)
    if damage == "body byte":
        _damage(path, pos + 100, b"\xff\xfe")
    else:
        _damage(path, pos, _bad_totalsize(victim))
    with pytest.raises(CorruptLog) as info:
        build_store(config).start()
    assert info.value.path == str(path) and info.value.position == pos
    assert f"mqstore repair --data-dir {config.data_dir}" in str(info.value)


def test_a_whole_record_failing_its_crc_below_the_checkpoint_is_not_a_torn_tail(small_config):
    # Every byte of it was fsynced and is there: a flipped bit, not a write cut short. Cutting it would
    # drop an acknowledged message without a word.
    config = small_config()
    store, results = _filled(config)
    store.stop()
    path, pos = _segment_for(config, results[-1].physical_offset)
    _damage(path, pos + 200, b"\x00\xff")
    with pytest.raises(CorruptLog, match="whole"):
        build_store(config).start()


def test_damage_older_than_the_recheck_window_is_found_by_check_all(small_config):
    config = small_config()
    store, results = _filled(config, count=100)
    store.stop()
    assert len(_data_segments(config, results)) >= 6
    victim = results[3]
    path, pos = _segment_for(config, victim.physical_offset)
    _damage(path, pos + 100, b"\xff\xfe")
    store = build_store(config)
    store.start()  # the default window (3 segments) does not reach the first one
    try:
        assert store.recovery.checked_from == _data_segments(config, results)[-3]
    finally:
        store.stop()
    for overrides in (dict(check_all=True), dict(recheck_segments=100)):
        with pytest.raises(CorruptLog) as info:
            build_store(small_config(**overrides)).start()
        assert info.value.position == pos


def test_checkpoint_records_the_range_checked_at_start(small_config):
    from mqstore.format import checkpoint as cpfmt
    config = small_config(recheck_segments=2)
    store, results = _filled(config, count=100)
    store.stop()
    store = build_store(config)
    store.start()
    end = store.commitlog.written_offset
    store.stop()
    cp = cpfmt.decode((config.data_dir / "checkpoint").read_bytes())
    segment = config.segment_size_bytes
    assert cp.checked_to_physical_offset == end
    assert cp.checked_from_physical_offset == (end // segment - 1) * segment  # the last two segments
    store = build_store(small_config(check_all=True))
    store.start()
    store.stop()
    cp = cpfmt.decode((config.data_dir / "checkpoint").read_bytes())
    assert (cp.checked_from_physical_offset, cp.checked_to_physical_offset) == (0, end)


def test_recheck_window_counts_back_from_the_segment_holding_the_flushed_offset(tmp_path):
    from mqstore.log.recovery import check_start
    size = 4096
    segments = SegmentQueue(tmp_path, size, preallocate=False)
    segments.load()
    for i in range(6):
        segments.create(i * size)
    try:
        assert check_start(segments, 3 * size + 100, 3) == 1 * size
        assert check_start(segments, 3 * size, 3) == 0  # the flushed offset ends segment 2
        assert check_start(segments, 3 * size + 100, 0) == 3 * size + 100
        assert check_start(segments, 3 * size + 100, 10) == 0
        assert check_start(segments, 3 * size + 100, 3, check_all=True) == 0
        assert check_start(segments, None, 3) == 0
        assert check_start(segments, 6 * size, 1) == 5 * size
    finally:
        segments.close()


# ---- consume queues rebuilt from the log keep tag codes -------------------------------------------------

def test_rebuilt_consume_queue_keeps_tags_next_to_a_longer_name_ending_in_tags(small_config):
    config = small_config()
    store = build_store(config)
    store.start()
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"one", tags="a", properties={"MYTAGS": "v"}, queue_id=0),
                       MessageIn(body=b"two", tags="b", properties={"MYTAGS": "a"}, queue_id=0)])
    assert [m.record.body for m in store.pull("t", 0, 0, tags=["a"]).messages] == [b"one"]
    store.stop()
    shutil.rmtree(config.consumequeue_dir)
    store = build_store(config)
    store.start()
    try:
        assert [m.record.body for m in store.pull("t", 0, 0, tags=["a"]).messages] == [b"one"]
        assert [m.record.body for m in store.pull("t", 0, 0, tags=["b"]).messages] == [b"two"]
    finally:
        store.stop()


# ---- repair keeps a durable copy before it cuts ---------------------------------------------------------

def test_repair_makes_its_broken_copy_durable_before_it_cuts(small_config, monkeypatch, failpoint):
    config = small_config()
    store, results = _filled(config, count=40)
    store.stop()
    victim = results[5]
    path, pos = _segment_for(config, victim.physical_offset)
    _damage(path, pos + 100, b"\xff\xfe")
    damaged = path.read_bytes()
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with failpoint.armed("repair.after_copy"), pytest.raises(failpoints.FailpointHit):
        offline_repair(config.data_dir)  # "crashes" after the copies, before the cut
    broken = path.with_name(path.name + ".broken")
    assert broken.read_bytes() == damaged and path.read_bytes() == damaged  # copied whole; nothing cut yet
    assert f"{broken}.tmp" in synced and str(config.commitlog_dir) in synced  # the copy and its directory
    assert not list(config.commitlog_dir.glob("*.tmp"))

    report = offline_repair(config.data_dir)  # run again: it finishes, and keeps the first copy
    assert report.corrupt and report.end_offset == victim.physical_offset
    assert broken.read_bytes() == damaged
    assert path.with_name(path.name + ".broken.1").read_bytes() == damaged  # a new copy, none overwritten
    store = build_store(config)
    store.start()
    try:
        assert store.commitlog.written_offset == victim.physical_offset
    finally:
        store.stop()


def test_repair_pads_a_segment_file_cut_short(small_config):
    config = small_config()
    store, results = _filled(config, count=40)
    store.stop()
    victim = results[-3]
    path, pos = _segment_for(config, victim.physical_offset)
    os.truncate(path, pos + 100)  # the file ends inside the victim
    with pytest.raises(FailedPrecondition) as info:
        build_store(config).start()
    advice = f"mqstore repair --data-dir {config.data_dir} --segment-size-bytes {config.segment_size_bytes}"
    assert advice in str(info.value)
    report = offline_repair(config.data_dir, config.segment_size_bytes)
    assert [r.from_bytes for r in report.resized_segments] == [pos + 100]
    assert path.with_name(path.name + ".broken").stat().st_size == pos + 100
    assert path.stat().st_size == config.segment_size_bytes
    store = build_store(config)
    store.start()
    try:
        assert store.commitlog.written_offset == victim.physical_offset
        assert store.get_message(results[-4].physical_offset).record.body == results_body(results, -4)
    finally:
        store.stop()


def results_body(results, index):
    return bytes([len(results) + index]) * 900


def test_missing_last_segments_refuse_start_although_the_check_begins_earlier(small_config):
    config = small_config(preallocate_segments=False, warm_ahead_bytes=0)
    store, results = _filled(config, count=40)
    store.stop()
    last = max(p for p in config.commitlog_dir.iterdir() if p.name.isdigit())
    last.unlink()
    with pytest.raises(FailedPrecondition, match="segment files are missing"):
        build_store(config).start()
