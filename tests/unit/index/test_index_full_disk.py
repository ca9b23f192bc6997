"""The index on a full disk, for real on a small tmpfs (skipped where mounting is not allowed): the next
index file cannot be allocated, so the batch that needed it is refused (no sparse file to SIGBUS on),
queries go on, and once space is back the re-fed records are indexed."""

from __future__ import annotations

import pytest

from index_testing import BASE_MS, all_pages, record, tiny_config
from mqstore.index.store import IndexStore
from mqstore.clock import FakeClock
from mqstore.errors import ResourceExhausted
from tests.support.tmpfs import mounted_tmpfs


@pytest.fixture
def disk(tmp_path):
    yield from mounted_tmpfs(tmp_path / "disk", "4m")


def test_a_full_disk_refuses_the_next_index_file_and_indexing_resumes(disk):
    # Files of 400 KB; 64 KiB stay free: room for the pages one put touches in a sparse file (so a
    # regression fails this test instead of killing it with SIGBUS), not for a whole file.
    store = IndexStore(tiny_config(disk.path, slot_count=100_000, entry_count=8), clock=FakeClock(BASE_MS))
    store.start()
    try:
        first = [record(100 * i, [f"k{i}"]) for i in range(1, 8)]  # 7 entries: the first file is full
        store.apply(first, 800)
        disk.fill(leave_bytes=64 * 1024)
        more = [record(100 * i, [f"k{i}"]) for i in range(8, 11)]
        with pytest.raises(ResourceExhausted, match="disk full"):
            store.apply(more, 1100)
        assert all_pages(store, "T", "k3") == [300]
        assert store.convert_sealed(max_files=10) == 0  # the full file is still the writer's
        disk.free_filler()
        store.apply(more, 1100)  # the follower re-feeds from resume_physical_offset
        assert store.resume_physical_offset() == 1100
        assert store.convert_sealed(max_files=10) == 1
        for i in range(1, 11):
            assert all_pages(store, "T", f"k{i}") == [100 * i]
    finally:
        store.close()
