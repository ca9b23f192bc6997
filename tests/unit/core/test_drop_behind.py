"""Drop-behind (mqstore.log.warmer): the log's flushed pages more than ``page_cache_keep_bytes`` below the flushed
offset leave the page cache, and nothing else does. Residency is read from the kernel (mincore(2) on a mapping of
the segment files), so the test fails when the pages stay; every message reads back whole afterwards (each read
checks its record's CRC)."""

from __future__ import annotations

import itertools
import os

import pytest

from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.log.segment import PAGE_SIZE
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger
from mqstore.tier.sealed import sealed_segments
from mqstore.tier.uploader import Uploader
from mqstore.tier.urls import open_store
from tests.support import page_cache
from tests.support.page_cache import resident_pages
from tests.support.waiting import wait_until


def log_residency(store) -> list[tuple[int, bool]]:
    """(physical offset, resident) of every page of the log's segments."""
    out = []
    for seg in store.commitlog.segments.segments:
        out += [(seg.start + i * PAGE_SIZE, r) for i, r in enumerate(resident_pages(seg.path))]
    return out


@pytest.fixture
def disk_dir(tmp_path):
    with page_cache.disk_dir(tmp_path) as path:
        yield path


def _config(disk_dir, **overrides) -> StoreConfig:
    base = dict(data_dir=disk_dir / "store", segment_size_bytes=1 << 20, cq_entries_per_file=64, flush_interval_ms=20,
                checkpoint_interval_ms=50, clean_interval_ms=100_000, page_cache_keep_bytes=256 << 10,
                warm_ahead_bytes=0)
    base.update(overrides)
    return StoreConfig(**base)


@pytest.fixture
def dropping_store(disk_dir):
    config = _config(disk_dir, flush_interval_ms=60_000, flush_thorough_interval_ms=60_000)
    store = build_store(config)
    store.start()
    try:
        store.topic_admin.create("t", 1)
        yield store
    finally:
        store.stop()


def _fill(store, count: int) -> list[bytes]:
    bodies = [b"%06d" % i + os.urandom(2000) for i in range(count)]
    for start in range(0, count, 50):
        store.append("t", [MessageIn(body=b) for b in bodies[start:start + 50]])
    return bodies


def test_flushed_pages_beyond_the_window_leave_the_page_cache_and_read_back(dropping_store):
    store = dropping_store
    bodies = _fill(store, 1500)  # ~3 MiB: four segments of 1 MiB
    store.flusher.flush_now()
    flushed = store.flushed_offset()
    store.warmer.drop_behind()
    dropped_to = store.warmer.dropped_to
    # in whole steps (64 KiB for a 256 KiB window), up to the window below the flushed offset
    assert flushed - (256 << 10) - store.warmer._drop_step < dropped_to <= flushed - (256 << 10)
    pages = log_residency(store)
    below = [r for at, r in pages if at + PAGE_SIZE <= dropped_to]
    window = [r for at, r in pages if dropped_to <= at and at + PAGE_SIZE <= flushed]
    assert below and not any(below), "pages below the window stayed in the page cache"
    assert window and all(window), "pages inside the window were dropped"
    got = store.pull("t", 0, 0, max_messages=len(bodies) + 1, max_bytes=64 << 20).messages
    assert [m.record.body for m in got] == bodies  # read back from the disk, each record's CRC checked


def test_nothing_unflushed_is_dropped(dropping_store, monkeypatch):
    store = dropping_store
    store.flusher.flush_now()
    flushed = store.flushed_offset()
    dropped = page_cache.record_drops(monkeypatch)  # [from, to) physical offsets the store gave back
    _fill(store, 1500)  # written, not flushed (the interval is a minute)
    store.warmer.drop_behind()
    assert dropped == [] and store.warmer.dropped_to <= max(0, flushed - (256 << 10))
    store.flusher.flush_now()
    store.warmer.drop_behind()
    assert dropped and max(end for _, end in dropped) <= store.flushed_offset() - (256 << 10)
    # contiguous from the log's start, each range inside one segment
    assert dropped[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(dropped))


def test_a_log_cut_back_below_what_was_dropped_drops_again_from_there(dropping_store):
    """A replica's truncation takes the flushed offset below ``dropped_to``: the range written again is dropped in
    its turn, not skipped."""
    store = dropping_store
    _fill(store, 1500)
    store.flusher.flush_now()
    store.warmer.drop_behind()
    assert store.warmer.dropped_to > (1 << 20)
    store.warmer._flushed_offset = lambda: 1 << 20  # as after a truncation to 1 MiB
    store.warmer.drop_behind()
    assert store.warmer.dropped_to == (1 << 20) - (256 << 10)


def test_the_duty_drops_by_itself_as_the_log_grows(disk_dir):
    """Off the test's thread: the warmer's duty, woken by appends (poke), with the flush service's own fsyncs."""
    store = build_store(_config(disk_dir))
    store.start()
    try:
        store.topic_admin.create("t", 1)
        _fill(store, 1500)
        wait_until(lambda: store.warmer.dropped_to >= store.commitlog.written_offset - (1 << 20),
                   what="the warmer to drop the log's flushed pages behind its window")
    finally:
        store.stop()


def test_a_negative_window_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="page_cache_keep_bytes"):
        StoreConfig(data_dir=tmp_path, page_cache_keep_bytes=-1)


def test_the_pages_an_upload_read_below_the_window_are_given_back_and_the_window_is_left(disk_dir, monkeypatch):
    """The tier's uploader reads each sealed segment (its checksum, its put) after drop-behind gave the pages back;
    done, it tells the warmer (``read_done``), which gives back again what the reads brought in below ``dropped_to``,
    and nothing of the window."""
    config = _config(disk_dir, flush_interval_ms=60_000, flush_thorough_interval_ms=60_000)
    store = build_store(config)
    store.start()
    (disk_dir / "tier").mkdir()
    tier = open_store(f"file://{disk_dir / 'tier'}", timeout_ms=10_000)
    try:
        uploader = Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=lambda: 0,
                            ready=lambda: True, log_min=store.log_min, interval_ms=60_000,
                            read_done=store.warmer.drop_read_back)
        store.topic_admin.create("t", 1)
        bodies = _fill(store, 1700)  # ~3.4 MiB: three sealed segments of 1 MiB, the active one past its window
        store.flusher.flush_now()
        store.warmer.drop_behind()
        dropped_to = store.warmer.dropped_to
        sealed = [(seg.base, seg.base + seg.size) for seg in sealed_segments(store)]
        assert len(sealed) == 3 and dropped_to > sealed[-1][1]
        assert not any(r for at, r in log_residency(store) if at + PAGE_SIZE <= dropped_to)
        dropped = page_cache.record_drops(monkeypatch)  # [from, to) physical offsets the store gave back
        uploader.step()  # reads the three sealed segments back into the page cache, uploads them, gives them back
        assert uploader.uploaded == 3
        below = [r for r in dropped if r[1] <= sealed[-1][1]]  # (the duty may drop a step above meanwhile)
        assert below == sealed, "each uploaded segment's pages given back once, whole (all below the window)"
        assert not any(r for at, r in log_residency(store) if at + PAGE_SIZE <= sealed[-1][1]), \
            "pages the upload read stayed in the page cache"
        store.flusher.flush_now()  # the uploader's records
        dropped.clear()
        store.warmer.drop_read_back(0, store.flushed_offset())  # from a reader of the window too: only below it
        assert dropped and max(end for _, end in dropped) <= store.warmer.dropped_to
        got = store.pull("t", 0, 0, max_messages=len(bodies) + 1, max_bytes=64 << 20).messages
        assert [m.record.body for m in got] == bodies
    finally:
        tier.close()
        store.stop()
