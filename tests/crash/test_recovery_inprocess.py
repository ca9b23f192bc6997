"""Recovery from damaged logs: torn tail vs corruption, repair, rebuilt consume queues, bad checkpoint.
(Crash tests with real killed processes are in test_kill9.py.)"""

from __future__ import annotations

import shutil

import pytest

from mqstore.errors import CorruptLog
from mqstore.format import record
from mqstore.log.recovery import repair
from mqstore.log.segment import SegmentQueue
from mqstore.model import MessageIn
from mqstore.store import MessageStore


def _filled(config, count=30, body_size=900):
    store = MessageStore(config)
    store.start()
    store.create_topic("t", 2)
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
    partial = record.encode(topic=b"t", body=b"z" * 500, properties=b"", queue_id=0, flag=0, sys_flag=0,
                            born_timestamp_ms=1, born_host=b"\0" * 4, born_port=0, store_host=b"\0" * 4,
                            store_port=0)[:200]
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(partial)
    store = MessageStore(config)
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
    store = MessageStore(config)
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
        MessageStore(config).start()
    err = info.value
    assert err.path == str(path) and err.position == pos
    assert "mqstore repair" in str(err) and str(pos) in str(err)

    segments = SegmentQueue(config.commitlog_dir, config.segment_size_bytes, preallocate=False)
    segments.load()
    report = repair(segments, config.max_write_bytes)
    segments.close()
    assert report["corrupt"] and report["end_offset"] == victim.physical_offset
    assert any(p.endswith(".broken") for p in report["broken_copies"])
    assert (path.parent / (path.name + ".broken")).exists()

    store = MessageStore(config)
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
    store = MessageStore(config)
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
    store = MessageStore(config)
    store.start()
    try:
        assert store.recovery.records_checked == len(results)
        assert store.queue_info("t", 0).max_offset == 15
    finally:
        store.stop()


def test_second_process_cannot_open_same_dir(small_config):
    config = small_config()
    store = MessageStore(config)
    store.start()
    try:
        with pytest.raises(Exception) as info:
            MessageStore(config).start()
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
    store = MessageStore(config)
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
    store.delete_topic("t")
    store.halt()
    (config.data_dir / "checkpoint").unlink()
    store = MessageStore(config)
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
    batch = b"".join(record.encode(topic=b"t", body=bytes([200 + i]) * 700, properties=b"", queue_id=0, flag=0,
                                   sys_flag=0, born_timestamp_ms=1, born_host=b"\0" * 4, born_port=0,
                                   store_host=b"\0" * 4, store_port=0) for i in range(10))
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
            MessageStore(config).start()
        return
    store = MessageStore(config)
    store.start()
    try:
        assert store.recovery.torn_bytes_cut == len(batch) * 3 // 4
        assert store.commitlog.written_offset == end
        assert store.queue_info("t", 0).max_offset == expected
    finally:
        store.stop()
