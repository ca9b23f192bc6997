"""Second tier: moves, ranged reads (at most two per compact file per query), retention, stats,
and the background maintainer thread."""

from __future__ import annotations

import pytest

from index_testing import BASE_MS, Model, all_pages, record, tiny_config
from mqstore.index.maintenance import IndexMaintainer
from mqstore.index.store import IndexStore
from mqstore.index.tier import DirectoryTier, FsspecTier
from mqstore.clock import FakeClock
from mqstore.errors import NotFound

KEYS = [f"k{i}" for i in range(6)]


@pytest.fixture(params=["directory", "fsspec-memory", "fsspec-file"])
def make_tier(request, tmp_path):
    """Every tier implementation: a directory, and fsspec's in-memory and local filesystems."""
    made = []

    def make(name: str):
        if request.param == "directory":
            tier = DirectoryTier(tmp_path / name)
        elif request.param == "fsspec-memory":
            tier = FsspecTier(f"memory://{tmp_path.name}-{name}")
        else:
            tier = FsspecTier(f"file://{tmp_path / name}")
        made.append(tier)
        return tier
    yield make
    for tier in made:
        if isinstance(tier, FsspecTier) and tier.fs.protocol[0] == "memory":
            tier.fs.rm(tier.root, recursive=True)


@pytest.fixture
def setup(tmp_path, make_tier):
    tier = make_tier("tier")
    clock = FakeClock(BASE_MS)
    store = IndexStore(tiny_config(tmp_path, slot_count=3, entry_count=9, max_keys_per_message=2,
                                   tier_min_age_ms=60_000), clock=clock, tier=tier)
    store.start()
    model = Model()
    records = [record(100 * i, [KEYS[i % 6]], ts_ms=BASE_MS + 1000 * i) for i in range(1, 41)]
    store.apply(records, 4100)
    for rec in records:
        model.add(rec)
    yield store, tier, clock, model
    store.close()


def test_tier_basics(tmp_path, make_tier):
    tier = make_tier("t")
    (tmp_path / "src").write_bytes(b"0123456789")
    tier.put("a.cidx", tmp_path / "src")
    assert tier.list() == ["a.cidx"] and tier.size_bytes("a.cidx") == 10
    assert tier.get_range("a.cidx", 3, 4) == b"3456"
    assert (tier.reads_total, tier.read_bytes_total) == (1, 4)
    tier.delete("a.cidx")
    assert tier.list() == []
    with pytest.raises(NotFound):
        tier.get_range("a.cidx", 0, 1)


def test_move_respects_age_and_keeps_answers(setup):
    store, tier, clock, model = setup
    before = {k: all_pages(store, "T", k) for k in KEYS}
    assert store.convert_sealed(100) == 4
    assert store.move_to_tier(100) == 0  # younger than tier_min_age_ms
    clock.advance(120_000)
    assert store.move_to_tier(100) == 4
    stats = store.stats()
    assert (stats.files_unsealed, stats.files_compact_local, stats.files_compact_tier) == (1, 0, 4)
    assert len(tier.list()) == 4
    for key in KEYS:
        assert all_pages(store, "T", key) == before[key] == model.query("T", key, 0, 1 << 62)


def test_reads_per_query_at_most_two_per_compact_file(setup):
    store, tier, clock, model = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    store.move_to_tier(100)
    for key in KEYS:
        reads_before = tier.reads_total
        result = store.query("T", key)
        compact_files = result.files_scanned - 1  # the newest file is unsealed (local mmap)
        assert result.reads == tier.reads_total - reads_before
        assert result.reads <= 2 * compact_files
    stats = store.stats()
    assert stats.max_reads_per_file <= 2
    assert stats.queries == len(KEYS) and stats.reads_per_query <= 8


def test_retention_deletes_tier_files(setup):
    store, tier, clock, _ = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    store.move_to_tier(100)
    assert store.delete_before(10**9) == 4
    assert tier.list() == []
    assert all_pages(store, "T", KEYS[0]) == [3600]  # only the newest file (3300..4000) is left


def test_maintainer_thread_converts_in_the_background(setup):
    store, tier, clock, _ = setup
    maintainer = IndexMaintainer(store)
    maintainer.start()
    try:
        maintainer.wake()
        for _ in range(50):
            assert maintainer.round_done.wait(5.0)
            maintainer.round_done.clear()
            if store.stats().files_compact_local == 4:
                break
        assert store.stats().files_compact_local == 4 and store.stats().healthy
    finally:
        maintainer.stop(5.0)


def test_failed_round_marks_unhealthy(setup, monkeypatch):
    store, _, _, _ = setup
    maintainer = IndexMaintainer(store)

    def broken(max_files=1):
        raise OSError("disk on fire")

    monkeypatch.setattr(store, "convert_sealed", broken)
    maintainer.start()
    try:
        maintainer.wake()
        assert maintainer.round_done.wait(5.0)
        stats = store.stats()
        assert not stats.healthy and "disk on fire" in stats.last_error
    finally:
        maintainer.stop(5.0)


def test_queries_run_while_writing_converting_and_moving(tmp_path):
    """Readers, the writer and maintenance at once: no errors, and the final answers are complete."""
    import threading

    clock = FakeClock(BASE_MS)
    store = IndexStore(tiny_config(tmp_path, slot_count=3, entry_count=9, max_keys_per_message=2),
                       clock=clock, tier=DirectoryTier(tmp_path / "tier"))
    store.start()
    model, errors, done = Model(), [], threading.Event()

    def reader():
        while not done.is_set():
            try:
                for key in KEYS:
                    all_pages(store, "T", key, max_num=3)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader, name=f"reader-{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        for i in range(1, 301):
            rec = record(100 * i, [KEYS[i % 6]], ts_ms=BASE_MS - 400_000 + 1000 * i)
            store.apply([rec], 100 * i + 100)
            model.add(rec)
            if i % 20 == 0:
                store.convert_sealed(10)
                store.move_to_tier(2)
    finally:
        done.set()
        for thread in threads:
            thread.join(10.0)
    assert errors == []
    for key in KEYS:
        assert all_pages(store, "T", key) == model.query("T", key, 0, 1 << 62)
    assert store.stats().files_compact_tier > 0
    store.close()


def test_tier_files_keep_one_descriptor_each_and_release_it(tmp_path, make_tier):
    import os

    before = len(os.listdir("/proc/self/fd"))
    tier = make_tier("fds")
    clock = FakeClock(BASE_MS)
    store = IndexStore(tiny_config(tmp_path, slot_count=3, entry_count=9, max_keys_per_message=2,
                                   tier_min_age_ms=60_000), clock=clock, tier=tier)
    store.start()
    store.apply([record(100 * i, [KEYS[i % 6]], ts_ms=BASE_MS + 1000 * i) for i in range(1, 41)], 4100)
    store.convert_sealed(100)
    clock.advance(120_000)
    assert store.move_to_tier(100) == 4
    for key in KEYS:
        all_pages(store, "T", key)
    store.close()
    if hasattr(tier, "close"):
        tier.close()
    assert len(os.listdir("/proc/self/fd")) <= before
