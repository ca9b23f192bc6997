"""SYNC flush that does not confirm in time, a flush service that dies, and a disk that fills up
while a segment is created: each gives its own clear error, loses nothing acknowledged, and reads go on."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading

import pytest

from mqstore.errors import FlushTimeout, InvalidArgument, ResourceExhausted, Unavailable
from mqstore.log.flush import Flusher
from mqstore.log.segment import Segment
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from tests.support.waiting import WAIT_S


@pytest.fixture
def store(small_config):
    stores = []

    def make(**overrides):
        s = build_store(small_config(**overrides))
        s.start()
        s.topic_admin.create("t", 1)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.stop()


@pytest.fixture(params=["thread", "loop"])
def on(request):
    """Where a SYNC append waits for its fsync: parked on a thread (MessageStore.append, Flusher.wait_flushed)
    or awaited on an event loop (append_async, Flusher.flushed: the CommitLog's Append on its grpc.aio port)."""
    return request.param


def _append(s: MessageStore, on: str, messages: list[MessageIn]):
    if on == "thread":
        return s.append("t", messages)
    return asyncio.run(s.append_async("t", messages))


def test_sync_wait_times_out_with_a_clear_status(store, on):
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=50)
    batch = s.encoder.encode_batch(s.topic_admin.get("t"), [MessageIn(body=b"x")], s.clock.now_ms())
    written = s.commitlog.append(batch)
    idle = Flusher(s.commitlog, s.config, s.clock, on_flushed=lambda offset: None)  # never started
    idle.flushed_offset = 0
    with pytest.raises(FlushTimeout, match="50 ms") as info:
        if on == "thread":
            idle.wait_flushed(written.end)
        else:
            asyncio.run(idle.flushed(written.end))
    assert "retry may duplicate" in str(info.value) and isinstance(info.value, Unavailable)


def test_a_sync_append_returns_only_once_an_fdatasync_covers_it(store, monkeypatch, on):
    # Every fsync of the flush service is held until an append has written past what it covers, so each
    # one finishes while appends it does not cover wait: the flush must release only those it covers
    # (each waits on a lock of its own), and each of those only once the fsync is done.
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=20_000)
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    durable = [0]  # the log's end as far as a finished fdatasync covers it
    moved = threading.Condition()
    real_flush = Segment.flush

    def held_flush(seg, from_position, to_position):
        if threading.current_thread().name == "commitlog-flush":
            with moved:  # until an append wrote past this flush (it then waits for the next one)
                moved.wait_for(lambda: s.commitlog.written_offset > seg.start + to_position, 0.2)
        real_flush(seg, from_position, to_position)
        durable[0] = max(durable[0], seg.start + to_position)

    monkeypatch.setattr(Segment, "flush", held_flush)
    early: list[tuple[int, int]] = []

    def acknowledged(results) -> None:
        end = results[-1].physical_offset + results[-1].size_bytes
        if durable[0] < end:
            early.append((end, durable[0]))
        with moved:
            moved.notify_all()

    def batch(rng: random.Random) -> list[MessageIn]:
        return [MessageIn(body=b"x" * rng.randrange(1, 600)) for _ in range(rng.randrange(1, 4))]

    def producer(rng: random.Random) -> None:
        for _ in range(40):
            acknowledged(s.append("t", batch(rng)))

    async def coroutine_producer(rng: random.Random) -> None:  # six on one loop: the fsync wakes several at once
        for _ in range(40):
            acknowledged(await s.append_async("t", batch(rng)))

    async def coroutine_producers() -> None:
        await asyncio.wait_for(asyncio.gather(*(coroutine_producer(random.Random(seed + i)) for i in range(6))),
                               3 * WAIT_S)

    if on == "loop":
        asyncio.run(coroutine_producers())
    else:
        threads = [threading.Thread(target=producer, args=(random.Random(seed + i),)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3 * WAIT_S)
        assert not any(thread.is_alive() for thread in threads)
    assert early == [], f"appends acknowledged before an fdatasync covered them (end, durable): {early[:5]}"
    assert s.flusher.flushed_offset == s.commitlog.written_offset


def test_dead_flush_service_fails_sync_appends_and_reports_unhealthy(store, failpoint, on):
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=5_000)
    _append(s, on, [MessageIn(body=b"before")])
    with failpoint.armed("log.after_flush"):
        with pytest.raises(Unavailable, match="flush service failed"):
            _append(s, on, [MessageIn(body=b"after")])
        assert "commitlog-flush died: FailpointHit: log.after_flush" in s.health_problem()
    assert [m.record.body for m in s.pull("t", 0, 0).messages] == [b"before"]


def test_an_append_whose_caller_went_away_leaves_the_others_waiting_for_their_fsync(store, monkeypatch):
    # On the loop a caller that goes away cancels its append's wait: the batch stays written (as after a
    # blocking append whose client left), the flush still wakes the appends it covers, and waking the
    # cancelled one does nothing.
    s = store(flush_mode="SYNC", sync_flush_timeout_ms=20_000)
    held = threading.Event()
    real_flush = Segment.flush

    def held_flush(seg, from_position, to_position):
        if threading.current_thread().name == "commitlog-flush":
            assert held.wait(WAIT_S), "the test never let the fsync go"
        real_flush(seg, from_position, to_position)

    monkeypatch.setattr(Segment, "flush", held_flush)
    failures: list[dict] = []

    async def run() -> list:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: failures.append(context))
        before = s.commitlog.written_offset
        gone = asyncio.create_task(s.append_async("t", [MessageIn(body=b"gone")]))
        stays = asyncio.create_task(s.append_async("t", [MessageIn(body=b"stays")]))
        while s.commitlog.written_offset == before or not s.flusher._parked:  # both written, the fsync held
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)
        assert not gone.done() and not stays.done()  # neither acknowledged while its fsync is held
        gone.cancel()
        held.set()
        results = await asyncio.wait_for(stays, WAIT_S)
        with pytest.raises(asyncio.CancelledError):
            await gone
        return results

    results = asyncio.run(run())
    assert results.durability == "FLUSHED" and failures == []
    assert [m.record.body for m in s.pull("t", 0, 0).messages] == [b"gone", b"stays"]
    assert s.flusher.flushed_offset == s.commitlog.written_offset


def _delays(s: MessageStore) -> dict[str, float]:
    return {ended: s.flusher._delays.labels(ended).value for ended in ("joined", "ran_out")}


def test_a_lone_producer_never_waits_for_the_flush_delay(store, on):
    # A lone producer's fsyncs acknowledge one append each, too few for a delay: its fsync starts at once.
    # With the longest delay allowed, a single wait would show as a delay run out.
    s = store(flush_mode="SYNC", sync_flush_delay_us=100_000)
    for i in range(5):
        assert _append(s, on, [MessageIn(body=b"m%d" % i)]).durability == "FLUSHED"
    assert _delays(s) == {"joined": 0, "ran_out": 0}
    assert s.flusher._gather == 1


def _hold_the_first_fsync(monkeypatch) -> threading.Event:
    """Hold the flush thread's next fsync until the returned event is set; ``holding`` (its attribute) is
    set once it holds."""
    let_go = threading.Event()
    let_go.holding = threading.Event()
    real_flush = Segment.flush

    def flush(seg, from_position, to_position):
        if threading.current_thread().name == "commitlog-flush" and not let_go.holding.is_set():
            let_go.holding.set()
            assert let_go.wait(WAIT_S), "the test never let the fsync go"
        real_flush(seg, from_position, to_position)

    monkeypatch.setattr(Segment, "flush", flush)
    return let_go


async def _appends(s: MessageStore, n: int, first: int) -> list:
    """``n`` appends at once on this loop (each writes before it first awaits)."""
    return await asyncio.wait_for(asyncio.gather(
        *(s.append_async("t", [MessageIn(body=b"m%d" % (first + i))]) for i in range(n))), WAIT_S)


def _group_behind_a_held_fsync(s: MessageStore, monkeypatch, n: int) -> None:
    """One append's fsync is held while ``n`` more are written: the next fsync acknowledges those ``n``."""
    let_go = _hold_the_first_fsync(monkeypatch)

    async def behind() -> list:
        batch = asyncio.create_task(_appends(s, n, 1))
        while len(s.flusher._parked) < n + 1:
            await asyncio.sleep(0.005)
        let_go.set()
        return await batch

    first = threading.Thread(target=s.append, args=("t", [MessageIn(body=b"m0")]))
    first.start()
    assert let_go.holding.wait(WAIT_S)
    assert {r.durability for r in asyncio.run(behind())} == {"FLUSHED"}
    first.join(WAIT_S)
    assert s.flusher._gather == n


def test_two_producers_never_wait_for_the_flush_delay(store, monkeypatch):
    # Two appends at a time: each fsync acknowledges at most two, too few for a delay, so neither waits
    # for the other.
    s = store(flush_mode="SYNC", sync_flush_delay_us=100_000, sync_flush_timeout_ms=20_000)
    _group_behind_a_held_fsync(s, monkeypatch, 2)
    for round_ in range(5):
        assert {r.durability for r in asyncio.run(_appends(s, 2, 3 + 2 * round_))} == {"FLUSHED"}
    assert _delays(s) == {"joined": 0, "ran_out": 0}


def test_the_flush_delay_gathers_as_many_appends_as_the_last_fsync_acknowledged(store, monkeypatch):
    s = store(flush_mode="SYNC", sync_flush_delay_us=100_000, sync_flush_timeout_ms=20_000)
    flushes = s.flusher._flushes
    _group_behind_a_held_fsync(s, monkeypatch, 7)
    assert _delays(s)["ran_out"] == 0

    # So the next delay waits for seven: seven appends at once share one fsync, without waiting it out.
    before = flushes.value
    assert {r.durability for r in asyncio.run(_appends(s, 7, 8))} == {"FLUSHED"}
    assert flushes.value - before == 1 and _delays(s)["ran_out"] == 0
    group = s.flusher._flush_appends.value  # mqstore_commitlog_flush_appends: the group commits' sizes
    assert (group.count, group.sum) == (3, 1 + 7 + 7)

    # Producers that go away: each delay that runs out halves the count, so a lone producer waits out
    # two delays (7 -> 3 -> 1) and then none (under three).
    for i, ran_out in enumerate((1, 2, 2, 2)):
        assert _append(s, "loop", [MessageIn(body=b"lone%d" % i)]).durability == "FLUSHED"
        assert _delays(s)["ran_out"] == ran_out
    assert s.flusher._gather == 1
    assert [m.record.body for m in s.pull("t", 0, 0, max_messages=100).messages][:15] == \
        [b"m%d" % i for i in range(15)]


def test_a_flush_delay_out_of_range_is_refused(small_config):
    with pytest.raises(InvalidArgument, match="sync_flush_delay_us must be in"):
        small_config(flush_mode="SYNC", sync_flush_delay_us=100_001)


def test_full_disk_while_creating_a_segment_rejects_the_batch_whole(store, monkeypatch):
    s = store(segment_size_bytes=8192, warm_ahead_bytes=0)
    s.append("t", [MessageIn(body=b"a" * 3000)])

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "posix_fallocate", no_space)  # a full disk cannot be caused for real here
    end = s.commitlog.written_offset
    with pytest.raises(ResourceExhausted, match="disk full"):
        s.append("t", [MessageIn(body=b"b" * 3000), MessageIn(body=b"c" * 3000)])
    assert s.commitlog.written_offset == end and s.queue_info("t", 0).max_offset == 1
    with pytest.raises(ResourceExhausted, match="read-only"):
        s.append("t", [MessageIn(body=b"d")])
    assert s.store_info().read_only
    assert s.pull("t", 0, 0).messages[0].record.body == b"a" * 3000
    monkeypatch.undo()
    s.disk.set_usage(0.10)  # the maintenance thread's disk check: space is back
    assert s.append("t", [MessageIn(body=b"e" * 3000)])[0].queue_offset == 1
