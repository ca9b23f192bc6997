"""Drop-behind (mqstore.log.warmer): the log's flushed pages more than ``page_cache_keep_bytes`` below the flushed
offset leave the page cache, and nothing else does. Residency is read from the kernel (mincore(2) on a mapping of
the segment files), so the test fails when the pages stay; every message reads back whole afterwards (each read
checks its record's CRC)."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import mmap
import os
import pathlib
import shutil
import tempfile

import pytest

from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.log.segment import PAGE_SIZE, Segment
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from tests.support.waiting import wait_until

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _on_tmpfs(path: pathlib.Path) -> bool:
    """Whether ``path`` lies on a tmpfs, whose pages are the files themselves and cannot be dropped."""
    best, fstype = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, kind = line.split()[:3]
            if str(path).startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, fstype = point, kind
    return fstype in ("tmpfs", "ramfs")


def resident_pages(path: pathlib.Path) -> list[bool]:
    """Which pages of the file are in the page cache (mincore on a private mapping that touches none)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        buf = ctypes.c_char.from_buffer(mm)
        vec = (ctypes.c_ubyte * ((size + PAGE_SIZE - 1) // PAGE_SIZE))()
        if _libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        del buf
        return [bool(v & 1) for v in vec]
    finally:
        mm.close()


def log_residency(store) -> list[tuple[int, bool]]:
    """(physical offset, resident) of every page of the log's segments."""
    out = []
    for seg in store.commitlog.segments.segments:
        out += [(seg.start + i * PAGE_SIZE, r) for i, r in enumerate(resident_pages(seg.path))]
    return out


@pytest.fixture
def disk_dir(tmp_path):
    """A directory on a file system whose pages can leave the page cache: the test's own, or (where it is a tmpfs,
    whose pages are the files and stay) a scratch directory beside the repository, removed afterwards."""
    if not _on_tmpfs(tmp_path):
        yield tmp_path
        return
    root = pathlib.Path(__file__).resolve().parents[3]
    if _on_tmpfs(root):
        pytest.fail(f"neither {tmp_path} nor {root} is on a disk: drop-behind cannot be observed on a tmpfs")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=".drop-behind-", dir=root))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    dropped: list[tuple[int, int]] = []
    real = Segment.drop_cache

    def noted(seg, from_position, to_position):
        dropped.append((seg.start + from_position, seg.start + to_position))
        real(seg, from_position, to_position)

    monkeypatch.setattr(Segment, "drop_cache", noted)
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
