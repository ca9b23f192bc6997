"""The Tail follower, the upkeep thread and the frame decoder against an in-memory commit log
(tests/unit/index/fake_log.py) and a real IndexStore on tmp_path. No sockets, no sleeps: every wait
polls a condition with a deadline."""

from __future__ import annotations

import time

import pytest
from fake_log import FakeLog
from mqstore.index.decode import BadFrame, index_records
from mqstore.index.follower import FollowerConfig, index_follower
from mqstore.index.records import IndexRecord
from mqstore.index.store import IndexStore
from mqstore.index.upkeep import IndexUpkeep
from index_testing import seeded_random, tiny_config
from mqstore.background import Backoff
from mqstore.errors import InvalidArgument
from mqstore.format import record, record_reader
from tests.support.waiting import wait_until

FAST = FollowerConfig(heartbeat_ms=20, backoff_initial_ms=1, backoff_max_ms=20, retention_interval_ms=10,
                      rebuild_interval_ms=10)


@pytest.fixture
def store(tmp_path):
    s = IndexStore(tiny_config(tmp_path, slot_count=8, entry_count=40, max_keys_per_message=4))
    s.start()
    yield s
    s.close()


def offsets(store, topic: str, key: str) -> list[int]:
    return [loc.physical_offset for loc in store.query(topic, key, max_num=10_000).locators]


# -- decode --------------------------------------------------------------------------------------------

def test_index_records_match_the_full_decoder():
    rng, _ = seeded_random("decode")
    log = FakeLog()
    for i in range(200):
        keys = tuple(f"k{rng.randrange(50)}" for _ in range(rng.randrange(4)))
        flag = rng.choice([0, record.SYSFLAG_TX_PREPARED, record.SYSFLAG_TX_COMMIT, record.SYSFLAG_TX_ROLLBACK])
        log.append(rng.choice(["a", "topic-b", "ü"]), keys, f"U{i}" if rng.random() < 0.8 else "", sys_flag=flag,
                   body=rng.randbytes(rng.randrange(3000)))
    data = b"".join(s.data for s in log.stored)
    got = index_records(data)
    expected = []
    for view in record_reader.records(data):
        r = view.decode()
        keys = r.properties.get(record.PROPERTY_KEYS, "")
        expected.append(IndexRecord(r.physical_offset, r.store_timestamp_ms, r.topic,
                                    tuple(k for k in keys.split(" ") if k),
                                    r.properties.get(record.PROPERTY_UNIQ_KEY, ""),
                                    r.tx_type == record.SYSFLAG_TX_ROLLBACK))
    assert got == expected and any(r.is_rollback for r in got)


def test_a_damaged_frame_is_refused():
    log = FakeLog()
    for i in range(3):
        log.append("t", ("k",), f"U{i}", body=b"x" * 100)
    data = bytearray(b"".join(s.data for s in log.stored))
    with pytest.raises(BadFrame):
        index_records(bytes(data[:-5]), 0)  # the last record cut short
    data[len(log.stored[0].data) + 100] ^= 0xFF  # a body byte of the second record: CRC
    with pytest.raises(BadFrame, match="CRC"):
        index_records(bytes(data), 0)


def test_backoff_doubles_up_to_the_cap_and_resets():
    b = Backoff(0.05, 0.3)  # the follower's: FollowConfig's backoff_initial_ms, backoff_max_ms in seconds
    assert [b.next_s() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    b.reset()
    assert b.next_s() == 0.05
    with pytest.raises(InvalidArgument):
        FollowerConfig(backoff_initial_ms=10, backoff_max_ms=5)


# -- the follower --------------------------------------------------------------------------------------

def test_follows_from_the_earliest_record_and_keeps_up(store):
    log = FakeLog()
    first = [log.append("t", (f"k{i % 5}", "all"), f"U{i}") for i in range(30)]
    follower = index_follower(store, log, FAST)
    follower.start()
    try:
        wait_until(lambda: store.resume_physical_offset() == log.end(), "the first records")
        more = [log.append("t", ("all",), f"V{i}") for i in range(20)]
        wait_until(lambda: store.resume_physical_offset() == log.end(), "the records appended later")
        state = wait_until(lambda: (s := follower.state()).connected and s, "connected")
        assert state.log_end_physical_offset == log.end() and state.healthy and state.reconnects == 0
    finally:
        follower.stop()
    assert not follower.state().alive and not follower.state().connected
    assert offsets(store, "t", "all") == [s.physical_offset for s in reversed(first + more)]
    assert offsets(store, "t", "k3") == [s.physical_offset for s in reversed(first) if "k3" in s.keys]


def test_broken_streams_resume_without_skipping_or_duplicating(store):
    rng, _ = seeded_random("follower-breaks")
    log = FakeLog(frame_records=3)
    follower = index_follower(store, log, FAST)
    follower.start()
    appended = []
    try:
        for round_ in range(15):
            appended += [log.append("t", (f"r{round_}", "all"), f"U{round_}-{i}") for i in range(rng.randrange(1, 12))]
            log.break_after_frames = rng.randrange(3)
            wait_until(lambda: store.resume_physical_offset() == log.end(), f"round {round_}")
    finally:
        follower.stop()
    assert follower.state().reconnects >= 1
    assert offsets(store, "t", "all") == [s.physical_offset for s in reversed(appended)]
    assert store.stats().entries == 3 * len(appended)  # UNIQ_KEY, r<round>, all: nothing twice


def test_a_head_deleted_by_retention_is_skipped_and_reported(store):
    log = FakeLog()
    gone = [log.append("t", ("all",), f"G{i}") for i in range(10)]
    log.delete_head(gone[6].physical_offset)  # retention ran before the index started
    kept = gone[6:] + [log.append("t", ("all",), f"K{i}") for i in range(5)]
    store.apply([], gone[2].physical_offset)  # the index had read the first two (nothing to index)
    follower = index_follower(store, log, FAST)
    follower.start()
    try:
        wait_until(lambda: store.resume_physical_offset() == log.end(), "the kept records")
    finally:
        follower.stop()
    assert follower.state().skipped_bytes == gone[6].physical_offset - gone[2].physical_offset
    assert offsets(store, "t", "all") == [s.physical_offset for s in reversed(kept)]


def test_a_new_index_starts_at_the_earliest_record_and_offset_0_is_an_offset(tmp_path):
    log = FakeLog()
    gone = [log.append("t", ("all",), f"G{i}") for i in range(6)]
    log.delete_head(gone[3].physical_offset)  # retention ran before the index started
    config = tiny_config(tmp_path / "new", slot_count=8, entry_count=40, max_keys_per_message=4)
    new = IndexStore(config)
    new.start()
    assert new.resume_physical_offset() is None and new.checkpoint() is None  # nothing to resume from
    new.close()
    new = IndexStore(config)
    new.start()
    at_zero = IndexStore(tiny_config(tmp_path / "zero", slot_count=8, entry_count=40, max_keys_per_message=4))
    at_zero.start()
    at_zero.apply([], 0)  # it has read the log up to offset 0: nothing, but from there
    followers = [index_follower(new, log, FAST), index_follower(at_zero, log, FAST)]
    try:
        for follower, store in zip(followers, (new, at_zero), strict=True):
            follower.start()
            wait_until(lambda store=store: store.resume_physical_offset() == log.end(), "the kept records")
    finally:
        for follower in followers:
            follower.stop()
        new.close()
        at_zero.close()
    assert log.tail_starts[:2] == [None, 0]
    assert followers[0].state().skipped_bytes == 0  # it never claimed the deleted records
    assert followers[1].state().skipped_bytes == gone[3].physical_offset  # it did: they are reported


def test_stop_ends_a_stream_blocked_waiting_for_records(store):
    log = FakeLog()
    follower = index_follower(store, log, FollowerConfig(heartbeat_ms=60_000))
    follower.start()
    wait_until(lambda: log.tails_opened, "the stream to open")
    started = time.monotonic()
    follower.stop(timeout_s=5)
    assert not follower.state().alive and time.monotonic() - started < 5


# -- the upkeep thread ---------------------------------------------------------------------------------

def test_retention_deletes_index_files_the_log_no_longer_needs(store):
    log = FakeLog()
    for i in range(60):  # 3 keys per message, 39 entries per file: many files
        log.append("t", (f"k{i}", "all"), f"U{i}")
    follower = index_follower(store, log, FAST)
    follower.start()
    try:
        wait_until(lambda: store.resume_physical_offset() == log.end(), "everything indexed")
    finally:
        follower.stop()
    files_before = store.stats().files_unsealed
    log.delete_head(log.stored[40].physical_offset)
    IndexUpkeep(store, log, FAST).run_once()
    assert store.stats().files_unsealed < files_before
    assert offsets(store, "t", "all")[-1] <= log.stored[0].physical_offset  # what the log holds is indexed
