"""The commit log after a power cut: what a cut leaves of files whose creation was never made durable.

A power cut (unlike kill -9) also drops what the file system had not yet made durable: the size of a
file never fsynced, the entry of a file in a directory never fsynced. Segments created ahead of the
writer (the warmer, the roll) are such files until their creation is made durable. Start must come up,
removing every trailing empty segment (size 0, short, or only zeros) past the checkpoint's flushed
offset, and never one that holds flushed data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import threading

import pytest
from structlog.testing import capture_logs

from mqstore import fs
from mqstore.errors import FailedPrecondition
from mqstore.format import checkpoint as cpfmt
from mqstore.log.repair import check as offline_check, repair as offline_repair
from mqstore.model import DURABILITY_FLUSHED, MessageIn
from mqstore.queue.consume_queue import ConsumeQueue
from mqstore.queue.dispatch import Dispatcher
from mqstore.store_parts import build_store
from tests.support import powercut
from tests.support.waiting import WAIT_S, wait_until

pytestmark = pytest.mark.crash

_ZERO, _SHORT, _ZEROS = "size 0", "short", "full of zeros"


def _filled(config, batches: int = 8):
    store = build_store(config)
    store.start()
    store.topic_admin.create("t", 2)
    acked = []
    for b in range(batches):
        batch = [MessageIn(body=bytes([b]) * 900, queue_id=i % 2) for i in range(5)]
        acked += store.append("t", batch)
    return store, acked


def _segment_files(config):
    return sorted(p for p in config.commitlog_dir.iterdir() if p.name.isdigit())


def _leave(path, shape: str, size: int) -> None:
    """What a power cut leaves of a segment whose creation was not durable."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, {_ZERO: 0, _SHORT: size // 4, _ZEROS: size}[shape])
    finally:
        os.close(fd)


def _check_all_there(store, acked) -> None:
    for queue_id in (0, 1):
        got = store.pull("t", queue_id, 0, 1000).messages
        assert [m.record.queue_offset for m in got] == list(range(len(got)))
        assert [m.record.physical_offset for m in got] == [r.physical_offset for r in acked if r.queue_id == queue_id]


@pytest.mark.parametrize("shapes", [(_ZERO, _ZERO), (_ZERO, _SHORT, _ZERO), (_SHORT, _ZEROS), (_ZEROS, _ZERO, _ZERO)])
def test_start_removes_every_trailing_empty_segment_past_the_flushed_offset(small_config, shapes):
    config = small_config(warm_ahead_bytes=0)
    store, acked = _filled(config)
    store.stop()  # the checkpoint's flushed offset is the log's end
    size = config.segment_size_bytes
    last = _segment_files(config)[-1]
    first_new = int(last.name) + size
    for i, shape in enumerate(shapes):
        _leave(config.commitlog_dir / f"{first_new + i * size:020d}", shape, size)
    with capture_logs() as logs:
        store = build_store(config)
        store.start()
    try:
        removed = [e for e in logs if e["event"] == "segment.empty_removed"]
        assert sorted(e["path"] for e in removed) == [str(config.commitlog_dir / f"{first_new + i * size:020d}")
                                                        for i in range(len(shapes))]
        assert _segment_files(config)[-1] == last
        _check_all_there(store, acked)
        more = store.append("t", [MessageIn(body=b"x" * 900, queue_id=0) for _ in range(40)])  # rolls on
        assert store.pull("t", 0, more[-1].queue_offset).messages[0].record.physical_offset == more[-1].physical_offset
    finally:
        store.stop()


def test_segments_past_the_flushed_offset_whose_size_was_lost_under_async(small_config):
    # ASYNC: the segment being written and the one created after it were never fsynced; the cut left
    # both at size 0. Records in them were written, never flushed: they are gone, as the
    # acknowledgement (durability WRITTEN) allowed; every flushed record stays.
    config = small_config(warm_ahead_bytes=0, flush_interval_ms=600_000, checkpoint_interval_ms=600_000)
    store, acked = _filled(config, batches=4)
    store.flusher.flush_now()
    store.write_checkpoint()
    flushed = store.flusher.flushed_offset
    size = config.segment_size_bytes
    later = []
    while store.commitlog.written_offset < flushed - flushed % size + 2 * size:  # into the segment after next
        later += store.append("t", [MessageIn(body=b"w" * 900, queue_id=1)])
    store.halt()
    for path in _segment_files(config):
        if int(path.name) >= flushed - flushed % size + size:
            _leave(path, _ZERO, size)
    store = build_store(config)
    store.start()
    try:
        assert store.commitlog.written_offset >= flushed
        kept = [r for r in acked + later if r.physical_offset + r.size_bytes <= store.commitlog.written_offset]
        _check_all_there(store, kept)
        assert len(kept) >= len(acked)
    finally:
        store.stop()


def test_a_short_segment_holding_flushed_data_is_never_removed(small_config):
    config = small_config(warm_ahead_bytes=0)
    store, acked = _filled(config)
    store.stop()
    last = _segment_files(config)[-1]
    os.truncate(last, config.segment_size_bytes // 2)  # the end of the flushed data is in this file
    with pytest.raises(FailedPrecondition, match="mqstore repair"):
        build_store(config).start()
    assert last.stat().st_size == config.segment_size_bytes // 2


def test_consume_queue_files_left_empty_are_removed_and_rebuilt(small_config):
    # Consume queue files are derived: a cut that left the last files empty (the one holding the newest
    # entries too) costs a rebuild of those entries from the log, never the start.
    config = small_config(warm_ahead_bytes=0, cq_entries_per_file=8)
    store, acked = _filled(config, batches=8)  # 20 entries a queue: files 0, 160, 320 (bytes)
    store.stop()
    queue_dir = config.consumequeue_dir / "t" / "0"
    files = sorted(p for p in queue_dir.iterdir() if p.name.isdigit())
    os.truncate(files[-1], 0)
    _leave(queue_dir / f"{int(files[-1].name) + 8 * 20:020d}", _ZERO, 8 * 20)
    store = build_store(config)
    store.start()
    try:
        _check_all_there(store, acked)
    finally:
        store.stop()


# ---- creating a segment is durable, and off the append path ---------------------------------------------

def test_the_warmer_creates_the_next_segment_durably_without_holding_appends(small_config, monkeypatch):
    # The warmer makes the next segment (fallocate, then two fsyncs) while appends into the current
    # one go on; an append that needs the new segment waits for it and then uses it.
    config = small_config(warm_ahead_bytes=8 * 1024, flush_mode="SYNC")
    size = config.segment_size_bytes
    hold, held, release = threading.Event(), threading.Event(), threading.Event()
    real_fallocate = os.posix_fallocate
    synced: list[str] = []
    real_fsync = os.fsync

    def slow_fallocate(fd, offset, length):
        if hold.is_set() and threading.current_thread().name == "commitlog-warmer":
            held.set()
            release.wait(3 * WAIT_S)  # longer than the test waits for the append below
        real_fallocate(fd, offset, length)

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "posix_fallocate", slow_fallocate)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    store = build_store(config)
    store.start()
    appender = None
    try:
        store.topic_admin.create("t", 2)
        # Below half the segment the warmer's window (8 KiB ahead) stays inside this segment.
        while store.commitlog.written_offset < size // 2 - 1024:
            store.append("t", [MessageIn(body=b"a" * 400, queue_id=0)])
        hold.set()
        appended = threading.Event()

        def appends():  # all into the current segment
            while store.commitlog.written_offset < size // 2 + 512:  # the warmer's window reaches the next one
                store.append("t", [MessageIn(body=b"b" * 400, queue_id=0)])
            if held.wait(WAIT_S):
                store.append("t", [MessageIn(body=b"c" * 400, queue_id=1)])
                appended.set()

        appender = threading.Thread(target=appends)
        appender.start()
        wait_until(held.is_set, "the warmer creating the next segment")
        assert appended.wait(WAIT_S), "appends into the current segment waited for the next one's creation"
        release.set()
        appender.join(WAIT_S)
        assert not appender.is_alive()
        while store.commitlog.written_offset < size + 512:  # rolls into the segment the warmer made
            store.append("t", [MessageIn(body=b"d" * 400, queue_id=0)])
        second = config.commitlog_dir / f"{size:020d}"
        assert str(second) in synced and str(config.commitlog_dir) in synced  # the file, then its directory
        assert synced.index(str(config.commitlog_dir), synced.index(str(second))) > synced.index(str(second))
    finally:
        release.set()
        if appender is not None:
            appender.join(3 * WAIT_S)
        store.stop()


# ---- a power cut after a random workload (tests/support/powercut.py) ---------------------------------------

def _random_workload(store, rng: random.Random, batches: int) -> list:
    """Random batches into two topics (the second made halfway, so its queue directories are new);
    returns every append result."""
    results = []
    for b in range(batches):
        if b == batches // 2:
            store.topic_admin.create("u", 3)
        topic = "u" if b > batches // 2 and rng.random() < 0.5 else "t"
        count = rng.randint(1, 6)
        batch = [MessageIn(body=bytes([rng.randrange(256)]) * rng.randint(50, 1500), queue_id=rng.randrange(2))
                 for _ in range(count)]
        results += [(topic, r, m.body) for r, m in zip(store.append(topic, batch), batch, strict=True)]
    return results


@pytest.mark.parametrize("flush_mode", ["ASYNC", "SYNC"])
@pytest.mark.parametrize("mode", [powercut.ENTRIES, powercut.SIZES])
def test_a_power_cut_keeps_every_flushed_message_and_the_store_starts(small_config, flush_mode, mode):
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")  # rerun a failure with this seed
    rng = random.Random(seed)
    config = small_config(flush_mode=flush_mode, flush_min_dirty_pages=0, warm_ahead_bytes=16 * 1024,
                          cq_entries_per_file=16)
    with powercut.PowerCut(mode, config.data_dir.parent) as power:
        store = build_store(config)
        store.start()
        store.topic_admin.create("t", 2)
        results = _random_workload(store, rng, batches=rng.randint(40, 80))
        store.halt()
        print("\n".join(power.cut()))
    store = build_store(config)
    store.start()
    try:
        end = store.commitlog.written_offset
        for topic in ("t", "u"):
            for queue_id in (0, 1):
                got = store.pull(topic, queue_id, 0, 10_000, 8 << 20).messages
                sent = [(r, body) for t, r, body in results if t == topic and r.queue_id == queue_id]
                assert [m.record.queue_offset for m in got] == list(range(len(got)))
                assert [(m.record.physical_offset, m.record.body) for m in got] == \
                    [(r.physical_offset, body) for r, body in sent[:len(got)]]
                # A message acknowledged as flushed is kept, and so is every message before it.
                flushed = [i for i, (r, _) in enumerate(sent) if r.durability == DURABILITY_FLUSHED]
                assert len(got) > max(flushed, default=-1), f"{topic}/{queue_id}: a flushed message is lost"
                lost = [r.physical_offset for r, _ in sent[len(got):] if r.physical_offset + r.size_bytes <= end]
                assert not lost, f"{topic}/{queue_id}: messages the log still holds are missing: {lost}"
        store.append("t", [MessageIn(body=b"after the cut", queue_id=0)])
    finally:
        store.stop()


# ---- consume queues: their creation is made durable by the checkpoint, off the append path ---------------

@pytest.mark.parametrize("mode", [powercut.ENTRIES, powercut.SIZES])
def test_consume_queue_files_a_checkpoint_counts_on_survive_a_power_cut(small_config, mode, monkeypatch):
    # The manifest written with a checkpoint counts the entries of every queue; had a power cut lost
    # the queue files (or directories) it counts on, start would rebuild those queues from the log.
    config = small_config(checkpoint_interval_ms=600_000, warm_ahead_bytes=0, cq_entries_per_file=16)
    with powercut.PowerCut(mode, config.data_dir.parent) as power:
        store, acked = _filled(config, batches=12)
        store.topic_admin.create("u", 2)
        acked_u = store.append("u", [MessageIn(body=b"u" * 700, queue_id=1) for _ in range(20)])
        store.write_checkpoint()
        store.halt()
        power.cut()
    replayed = []
    real_replay = Dispatcher.replay
    monkeypatch.setattr(Dispatcher, "replay", lambda *a, **kw: replayed.append(real_replay(*a, **kw)) or replayed[-1])
    with capture_logs() as logs:
        store = build_store(config)
        store.start()
    try:
        assert not [e for e in logs if e["event"] == "consumequeue.rebuild"]
        assert replayed == [0], "the checkpoint's consume queues were lost: start replayed the log into them"
        _check_all_there(store, acked)
        assert store.queue_info("u", 1).max_offset == len(acked_u)
    finally:
        store.stop()


def test_creating_a_consume_queue_file_on_the_append_path_waits_for_no_fsync(small_config, monkeypatch):
    config = small_config(checkpoint_interval_ms=600_000, warm_ahead_bytes=0, cq_entries_per_file=16)
    store, _ = _filled(config, batches=1)
    synced: list[str] = []
    real_fsync = os.fsync
    this_thread = threading.get_ident()

    def recording_fsync(fd):
        # This thread's only: the appends and the checkpoint below run here; the store's own duties
        # (a first checkpoint that a loaded machine runs late) are not what is checked
        if threading.get_ident() == this_thread:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    try:
        queue_dir = config.consumequeue_dir / "t" / "0"
        before = sorted(queue_dir.iterdir())
        while sorted(queue_dir.iterdir()) == before:  # until an append reserves the queue's next file
            store.append("t", [MessageIn(body=b"n" * 100, queue_id=0)])
        assert not [p for p in synced if p.startswith(str(config.consumequeue_dir / "t"))]  # file nor directory
        store.write_checkpoint()  # makes the new file's entry durable, before the manifest counts on it
        assert str(queue_dir) in synced
        assert synced.index(str(queue_dir)) < synced.index(str(config.consumequeue_dir / "queues.manifest.tmp"))
    finally:
        store.stop()


def test_consume_queue_files_cut_at_start_stay_deleted(small_config, monkeypatch):
    # Entries cut at start (their records were past the log's end) must not come back after a power
    # cut, below entries written later: the files deleted are gone durably before anything is written.
    config = small_config(warm_ahead_bytes=0, cq_entries_per_file=8)
    store, acked = _filled(config, batches=8)
    store.halt()
    log_dir = config.commitlog_dir
    for path in sorted(p for p in log_dir.iterdir() if p.name.isdigit())[1:]:
        os.truncate(path, 0)  # past the flushed offset (the start's checkpoint: 0): removed at start
    os.remove(config.data_dir / "checkpoint")  # so that the start's own checkpoint counts
    fsynced: list[str] = []
    real_fsync_dir = fs.fsync_dir
    monkeypatch.setattr(fs, "fsync_dir", lambda d: (fsynced.append(str(d)), real_fsync_dir(d)))
    queue_dir = config.consumequeue_dir / "t" / "0"
    files_before = sorted(queue_dir.iterdir())
    store = build_store(config)
    store.start()
    try:
        assert store.queue_info("t", 0).max_offset < 8 * (len(files_before) - 1)  # a whole file was cut
        assert len(list(queue_dir.iterdir())) < len(files_before)
        assert str(queue_dir) in fsynced
    finally:
        store.stop()


def test_a_deleted_topics_queue_directories_stay_deleted(small_config, monkeypatch):
    # Brought back by a power cut, they would serve their old entries to a topic created again under
    # the same name.
    config = small_config(warm_ahead_bytes=0)
    store, _ = _filled(config, batches=2)
    fsynced: list[str] = []
    real_fsync_dir = fs.fsync_dir
    monkeypatch.setattr(fs, "fsync_dir", lambda d: (fsynced.append(str(d)), real_fsync_dir(d)))
    try:
        store.topic_admin.delete("t")
        assert not (config.consumequeue_dir / "t" / "0").exists()
        assert str(config.consumequeue_dir / "t") in fsynced
    finally:
        store.stop()


def test_the_manifest_counts_only_entries_its_checkpoint_made_durable(small_config, monkeypatch):
    # Entries dispatched while a checkpoint flushes the queues are not flushed by it: the manifest
    # written with it must not count them.
    config = small_config(checkpoint_interval_ms=600_000, warm_ahead_bytes=0)
    store, _ = _filled(config, batches=2)
    real_flush = ConsumeQueue.flush
    during: list[int] = []

    def flush_then_append(cq):
        real_flush(cq)
        if cq.topic == "t" and cq.queue_id == 0 and not during:
            during.append(store.append("t", [MessageIn(body=b"late", queue_id=0)])[0].queue_offset)

    monkeypatch.setattr(ConsumeQueue, "flush", flush_then_append)
    try:
        store.write_checkpoint()
        assert during, "an entry was dispatched during the checkpoint's flushes"
        manifest = json.loads((store.config.consumequeue_dir / "queues.manifest").read_bytes())
        counted = {(t, q): n for t, q, n in manifest["queues"]}
        assert counted[("t", 0)] <= store.queues.get("t", 0).flushed_offset == during[0]
    finally:
        store.stop()


def test_a_commit_log_that_lost_every_segment_refuses_the_start(small_config):
    config = small_config(warm_ahead_bytes=0)
    store, _ = _filled(config)
    store.stop()
    for path in _segment_files(config):
        path.unlink()  # e.g. their creation was never made durable (before segments were fsynced)
    with pytest.raises(FailedPrecondition, match="holds no segment file"):
        build_store(config).start()


def test_an_empty_log_keeps_its_position_across_restarts(small_config):
    # Retention removed every segment with data; the last one, made ahead, holds only zeros. Start keeps
    # it (it holds the log's position), and the next start finds the log where it was.
    config = small_config(warm_ahead_bytes=0)
    store, acked = _filled(config)
    store.stop()
    size = config.segment_size_bytes
    end = acked[-1].physical_offset + acked[-1].size_bytes
    for path in _segment_files(config):
        path.unlink()
    _leave(config.commitlog_dir / f"{end - end % size + size:020d}", _ZEROS, size)
    cp = cpfmt.decode((config.data_dir / "checkpoint").read_bytes())
    (config.data_dir / "checkpoint").write_bytes(cpfmt.encode(dataclasses.replace(
        cp, flushed_physical_offset=end - end % size + size, dispatched_physical_offset=end - end % size + size)))
    for _ in range(2):
        store = build_store(config)
        store.start()
        try:
            assert [p.name for p in _segment_files(config)] == [f"{end - end % size + size:020d}"]
            assert store.commitlog.written_offset == end - end % size + size
        finally:
            store.stop()


# ---- the offline tools agree with the start ------------------------------------------------------------------

def test_check_and_repair_treat_the_empty_tail_as_the_start_does(small_config):
    config = small_config(warm_ahead_bytes=0)
    store, acked = _filled(config)
    store.stop()
    size = config.segment_size_bytes
    first_new = int(_segment_files(config)[-1].name) + size
    tail = [config.commitlog_dir / f"{first_new + i * size:020d}" for i in range(3)]
    for path, shape in zip(tail, (_ZERO, _SHORT, _ZEROS), strict=True):
        _leave(path, shape, size)
    report = offline_check(config.data_dir)
    assert report.verdict == "ok" and report.will_start
    assert ", ".join(p.name for p in tail) in report.detail
    assert all(p.exists() for p in tail)  # check changes nothing
    repaired = offline_repair(config.data_dir)
    assert sorted(repaired.removed_empty_segments) == [str(p) for p in tail]
    assert repaired.resized_segments == [] and not repaired.corrupt
    assert not any(p.exists() for p in tail)
    store = build_store(config)
    store.start()
    try:
        _check_all_there(store, acked)
    finally:
        store.stop()
