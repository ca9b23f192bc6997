"""Under SYNC flush the segment warmer writes zeros ahead of the writer (mqstore.log.warmer): an append
that reaches a range being zeroed waits for the zeros, so they never land on a record; and a store whose
log ends inside zeroed space starts at its real end. The random test holds each chunk's zeros until the
writer could have moved into it, so it fails when an append does not wait for the claim."""

from __future__ import annotations

import random
import threading

from mqstore.log.commitlog import CommitLog
from mqstore.log.segment import Segment
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from tests.support.waiting import WAIT_S, wait_until


def _bodies(store: MessageStore, topic: str) -> list[bytes]:
    out: list[bytes] = []
    while True:
        got = store.pull(topic, 0, len(out), max_messages=100).messages
        if not got:
            return out
        out += [m.record.body for m in got]  # each read checks the record's CRC


def test_an_append_reaching_the_zeros_being_written_waits_for_them(small_config, monkeypatch):
    config = small_config(flush_mode="SYNC", segment_size_bytes=256 * 1024, warm_ahead_bytes=64 * 1024)
    hold, held, release, waiting = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    claims: list[tuple[int, int]] = []
    real_write_zeros, real_wait = Segment.write_zeros, CommitLog._wait_for_zeroing

    def slow_write_zeros(seg, from_position, to_position, zeros):
        if hold.is_set() and not claims:
            claims.append((seg.start + from_position, seg.start + to_position))
            held.set()
            release.wait(3 * WAIT_S)  # longer than the test waits for the append below
        real_write_zeros(seg, from_position, to_position, zeros)

    def noted_wait(log, end):
        waiting.set()
        real_wait(log, end)

    monkeypatch.setattr(Segment, "write_zeros", slow_write_zeros)
    monkeypatch.setattr(CommitLog, "_wait_for_zeroing", noted_wait)
    store = build_store(config)
    store.start()
    appender = None
    sent: list[bytes] = []
    try:
        store.topic_admin.create("t", 1)
        for _ in range(20):
            sent.append(b"%06d" % len(sent) + b"a" * 500)
            store.append("t", [MessageIn(body=sent[-1])])
        hold.set()  # the warmer's next chunk ahead is held, once the appends below move the window

        def appends():
            while len(sent) < 10_000 and not (held.is_set() and store.commitlog.written_offset >= claims[0][1]):
                sent.append(b"%06d" % len(sent) + b"b" * 500)
                store.append("t", [MessageIn(body=sent[-1])])

        appender = threading.Thread(target=appends)
        appender.start()
        wait_until(held.is_set, "the warmer claiming a chunk ahead")
        claim_from, claim_to = claims[0]
        wait_until(lambda: waiting.is_set() or not appender.is_alive(), "the append that reaches the claimed zeros")
        assert waiting.is_set() and appender.is_alive(), "an append wrote into the range the warmer is zeroing"
        assert store.commitlog.written_offset <= claim_from
        release.set()
        appender.join(WAIT_S)
        assert not appender.is_alive()
        assert store.commitlog.written_offset >= claim_to
        assert _bodies(store, "t") == sent
    finally:
        release.set()
        if appender is not None:
            appender.join(3 * WAIT_S)
        store.stop()
    monkeypatch.undo()
    again = build_store(config)
    again.start()
    try:
        assert _bodies(again, "t") == sent
    finally:
        again.stop()


def test_a_log_that_ends_in_zeroed_space_restarts_at_its_end_after_a_crash(small_config):
    config = small_config(flush_mode="SYNC", segment_size_bytes=64 * 1024, warm_ahead_bytes=32 * 1024)
    store = build_store(config)
    store.start()
    sent = []
    store.topic_admin.create("t", 1)
    for i in range(200):
        sent.append(b"%06d" % i + b"c" * 300)
        store.append("t", [MessageIn(body=sent[-1])])
    wait_until(lambda: store.commitlog.resident_offset >= store.commitlog.written_offset + 8 * 1024,
               "the warmer zeroing ahead of the last append")
    end = store.commitlog.written_offset
    store.halt()  # as kill -9: no final flush or checkpoint, the abort marker stays
    again = build_store(config)
    again.start()
    try:
        assert again.commitlog.written_offset == end
        assert again.recovery.torn_bytes_cut == 0
        assert _bodies(again, "t") == sent
    finally:
        again.stop()


def test_zeros_never_land_on_a_record_under_random_concurrent_appends(small_config, monkeypatch):
    # The claim protocol under load: producers append random batches (crossing segment ends) while the
    # warmer zeros ahead in small chunks, and every chunk's zeros are held until the writer has moved
    # into that chunk (or 50 ms passed): without the claim an append lands there and the zeros then
    # overwrite it. Every acknowledged record must read back, before and after a crash.
    config = small_config(flush_mode="SYNC", segment_size_bytes=64 * 1024, warm_ahead_bytes=32 * 1024)
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    moved = threading.Condition()
    zeroed: list[tuple[int, int]] = []
    real_write_zeros = Segment.write_zeros
    store = build_store(config)

    def held_write_zeros(seg, from_position, to_position, zeros):
        start = seg.start + from_position
        with moved:
            moved.wait_for(lambda: store.commitlog.written_offset > start, 0.05)
        zeroed.append((start, seg.start + to_position))
        real_write_zeros(seg, from_position, to_position, zeros)

    monkeypatch.setattr(Segment, "write_zeros", held_write_zeros)
    store.start()
    sent: dict[int, list[bytes]] = {}
    try:
        store.topic_admin.create("t", 1)

        def producer(number: int, rng: random.Random) -> None:
            mine = sent.setdefault(number, [])
            for _ in range(30):
                batch = [b"%02d-%05d-" % (number, len(mine) + i) + b"z" * rng.randrange(1, 3000)
                         for i in range(rng.randrange(1, 5))]
                store.append("t", [MessageIn(body=body) for body in batch])
                mine.extend(batch)
                with moved:
                    moved.notify_all()

        threads = [threading.Thread(target=producer, args=(n, random.Random(seed + n))) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3 * WAIT_S)
        assert not any(thread.is_alive() for thread in threads)
        assert len(zeroed) >= 10, f"the warmer zeroed only {len(zeroed)} chunks: the test exercised too little"
        assert store.commitlog.written_offset > 3 * config.segment_size_bytes, "the log crossed segment ends"
        _check(_bodies(store, "t"), sent)
        end = store.commitlog.written_offset
    finally:
        store.halt()  # as kill -9 (SYNC: every acknowledged append was fdatasynced)
    monkeypatch.undo()
    again = build_store(config)
    again.start()
    try:
        assert again.commitlog.written_offset == end
        _check(_bodies(again, "t"), sent)
    finally:
        again.stop()


def _check(read: list[bytes], sent: dict[int, list[bytes]]) -> None:
    assert sorted(read) == sorted(body for bodies in sent.values() for body in bodies)
    for number, bodies in sent.items():  # and each producer's in its order
        assert [body for body in read if body.startswith(b"%02d-" % number)] == bodies
