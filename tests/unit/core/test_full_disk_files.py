"""Files on a full disk, for real on a small tmpfs (skipped where mounting is not allowed): mapped
index files are allocated before they are mapped (a sparse one would SIGBUS on its first write to an
unallocated page), the SQLite metadata answers ResourceExhausted at once, the space reserve."""

from __future__ import annotations

import os
import time

import pytest

from mqstore.clock import FakeClock
from mqstore.disk_space import SPACE_RESERVE_BYTES, SpaceReserve
from mqstore.errors import ResourceExhausted
from mqstore.format.index_file import IndexFile, file_size_bytes
from mqstore.meta.sql import MetadataStore
from tests.support.tmpfs import mounted_tmpfs

QUICK_S = 5.0  # "at once": half the metadata store's 10 s lock wait (not a speed check)


@pytest.fixture
def disk(tmp_path):
    yield from mounted_tmpfs(tmp_path / "disk", "4m")


def _allocated_bytes(path) -> int:
    return os.stat(path).st_blocks * 512


def test_index_file_is_allocated_before_it_is_mapped(disk):
    small = IndexFile.create(disk.path / "small.idx", 16, 64)
    assert _allocated_bytes(small.path) >= file_size_bytes(16, 64)
    small.close()
    too_big = disk.path / "big.idx"  # 8 MB on a 4 MiB disk
    with pytest.raises(ResourceExhausted, match="disk full"):
        IndexFile.create(too_big, 1000, 400_000)
    assert not too_big.exists()


def test_sqlite_metadata_on_a_full_disk_is_resource_exhausted_at_once(disk):
    meta = MetadataStore(f"sqlite:///{disk.path}/metadata.db", FakeClock())
    try:
        meta.create_topic("a", 1, "NORMAL", 0)
        disk.fill()
        started = time.monotonic()
        with pytest.raises(ResourceExhausted, match="disk is full"):
            for i in range(1000):  # bounded: the first write that needs a new page fails
                meta.create_topic(f"b{i}", 1, "NORMAL", 0)
                meta.commit_offsets([("g", "a", 0, i)])
        assert time.monotonic() - started < QUICK_S
        assert meta.get_topic("a").queue_count == 1  # reads go on
    finally:
        meta.close()


def test_space_reserve_is_allocated_and_given_back(disk):
    reserve = SpaceReserve(disk.path)
    assert reserve.ensure() and reserve.ensure()  # idempotent
    assert _allocated_bytes(reserve.path) >= SPACE_RESERVE_BYTES
    disk.fill()
    reserve.release()
    assert not reserve.path.exists() and disk.free_bytes() >= SPACE_RESERVE_BYTES
    disk.fill()
    assert not reserve.ensure() and not reserve.path.exists()  # no room: nothing half allocated is left
