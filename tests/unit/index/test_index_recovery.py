"""Crash safety (failpoints armed with "raise", then reopen from disk) and damaged-file handling."""

from __future__ import annotations

import pytest

from index_testing import BASE_MS, Model, all_pages, record, tiny_config
from mqstore.index import checkpoint as ckpt
from mqstore.index import files as F
from mqstore.index.query import RangeNotIndexed
from mqstore.index.store import IndexStore
from mqstore.index.tier import IndexTierConfig, dir_url, open_tier
from mqstore.index.tier_manifest import TierManifest
from mqstore import failpoints
from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition

pytestmark = pytest.mark.crash
KEYS = [f"k{i}" for i in range(5)]


class Harness:
    def __init__(self, tmp_path, with_tier=False):
        self.tmp_path = tmp_path
        self.config = tiny_config(tmp_path, entry_count=9, max_keys_per_message=2)
        self.with_tier = with_tier
        self.model = Model()
        self.stores = []
        self.tiers = []

    def open(self) -> IndexStore:
        (self.tmp_path / "tier").mkdir(exist_ok=True)
        tier = open_tier(IndexTierConfig(tier_url=dir_url(self.tmp_path / "tier"))) if self.with_tier else None
        if tier is not None:
            self.tiers.append(tier)
        store = IndexStore(self.config, clock=FakeClock(BASE_MS + 10**9), tier=tier)
        store.start()
        self.stores.append(store)
        return store

    def feed(self, store, first, count):
        """Messages first..first+count-1 at physical offsets 100*i, two keys each."""
        records = [record(100 * i, [KEYS[i % 5], KEYS[(i * 3) % 5]]) for i in range(first, first + count)]
        store.apply(records, 100 * (first + count))
        for rec in records:
            self.model.add(rec)

    def check(self, store):
        for key in KEYS:
            assert all_pages(store, "T", key) == self.model.query("T", key, 0, 1 << 62), key

    def names(self, where="index"):
        return sorted(p.name for p in (self.tmp_path / where).iterdir())

    def close_all(self):
        for store in self.stores:
            store.close()
        for tier in self.tiers:
            tier.close()


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.close_all()


def _crash_and_reopen(h: Harness, store, failpoint, name, action):
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        action(store)
    store.checkpoint()
    return h.open()


def test_crash_after_compact_write_keeps_the_unsealed_file(harness, failpoint):
    store = harness.open()
    harness.feed(store, 1, 12)
    again = _crash_and_reopen(harness, store, failpoint, "index.compact.after_write", lambda s: s.convert_sealed())
    assert not any(n.endswith(".tmp") for n in harness.names())
    assert again.stats().files_compact_local == 0
    harness.check(again)
    assert again.convert_sealed(10) >= 2
    harness.check(again)


def test_crash_after_compact_rename_deletes_the_unsealed_file_on_start(harness, failpoint):
    store = harness.open()
    harness.feed(store, 1, 12)
    first = min(store.file_offsets())
    again = _crash_and_reopen(harness, store, failpoint, "index.compact.after_rename", lambda s: s.convert_sealed())
    assert F.cidx_name(first) in harness.names() and F.idx_name(first) not in harness.names()
    assert again.stats().files_compact_local == 1
    harness.check(again)


@pytest.mark.parametrize("point, moved", [("index.tier.started", False), ("index.tier.after_put", False),
                                          ("index.tier.finished", True)])
def test_a_crash_in_a_tier_move_loses_nothing_leaves_one_copy_and_no_orphan(tmp_path, failpoint, point, moved):
    """Before the put, between the put and FINISHED, after FINISHED: the restarted index answers the same, holds
    each file once (local, or on the tier when FINISHED was durable), and its first maintenance round deletes
    every object its manifest does not name; the move then completes under a fresh key."""
    h = Harness(tmp_path, with_tier=True)
    try:
        store = h.open()
        h.feed(store, 1, 12)
        store.convert_sealed(10)
        first = min(store.file_offsets())
        again = _crash_and_reopen(h, store, failpoint, point, lambda s: s.move_to_tier())
        assert (F.cidx_name(first) in h.names()) is not moved
        assert again.stats().files_compact_tier == int(moved)
        h.check(again)
        assert again.tidy_tier() == (0 if moved else int(point == "index.tier.after_put"))
        tier, manifest = again.tier, TierManifest.load(tmp_path / "index", again.tier.name)
        assert set(tier.keys()) == {f.key for f in manifest.finished.values()} and manifest.started == {}
        assert again.move_to_tier(10) >= 1
        manifest = TierManifest.load(tmp_path / "index", tier.name)
        assert set(tier.keys()) == {f.key for f in manifest.finished.values()}
        assert F.cidx_name(first) in manifest.finished
        assert not any(n.endswith(".cidx") for n in h.names()) and again.stats().files_compact_tier >= 1
        h.check(again)
    finally:
        h.close_all()


def test_crash_before_checkpoint_rename_keeps_the_old_one(harness, tmp_path, failpoint):
    store = harness.open()
    harness.feed(store, 1, 3)
    store.checkpoint()
    harness.feed(store, 4, 3)
    with failpoint.armed("index.checkpoint.before_rename"), pytest.raises(failpoints.FailpointHit):
        store.checkpoint()
    assert ckpt.load(tmp_path / "index" / ckpt.FILE_NAME).next_physical_offset == 400


def test_crash_after_roll_create_loses_nothing(harness, failpoint):
    store = harness.open()
    harness.feed(store, 1, 4)
    store.checkpoint()
    with failpoint.armed("index.roll.after_create"), pytest.raises(failpoints.FailpointHit):
        store.apply([record(500, [KEYS[0], KEYS[0]]), record(600, [KEYS[1]])], 700)
    again = harness.open()
    assert again.resume_physical_offset() == 500
    harness.feed(again, 5, 8)
    harness.check(again)


def test_kill_between_checkpoints_refeed_has_no_duplicates(harness):
    store = harness.open()
    harness.feed(store, 1, 5)
    store.checkpoint()
    records = [record(100 * i, [KEYS[i % 5], KEYS[(i * 3) % 5]]) for i in range(6, 9)]
    store.apply(records, 900)  # indexed, then "kill -9": no checkpoint, no close
    again = harness.open()
    assert again.resume_physical_offset() == 600
    harness.feed(again, 6, 6)  # the follower re-feeds from the checkpoint
    harness.check(again)
    entries = again.stats().entries
    assert entries == sum(len(set(v)) for v in harness.model.by_key.values())


def _damage_sealed_file(harness, store):
    """Close cleanly, then truncate the oldest file; return (start, end) of its range."""
    names = store.file_offsets()
    store.close()
    path = harness.tmp_path / "index" / F.idx_name(names[0])
    with open(path, "r+b") as f:
        f.truncate(50)
    return names[0], names[1]


def test_damaged_file_quarantined_reported_and_rebuilt(harness):
    store = harness.open()
    harness.feed(store, 1, 16)
    start, end = _damage_sealed_file(harness, store)
    again = harness.open()
    assert F.damaged_name(start, end) in harness.names()
    [rng] = again.rebuild_ranges()
    assert (rng.start_physical_offset, rng.end_physical_offset) == (start, end)
    with pytest.raises(RangeNotIndexed) as info:
        again.query("T", KEYS[0])
    assert isinstance(info.value, FailedPrecondition) and f"[{start}, {end})" in str(info.value)
    newer = again.query("T", KEYS[0], begin_ms=rng.end_timestamp_ms + 1000)  # + the 999 ms slack
    assert newer.locators
    # The follower re-feeds the range from the commit log.
    again.apply_rebuild(start, [record(100 * i, [KEYS[i % 5], KEYS[(i * 3) % 5]])
                                for i in range(1, 17) if start <= 100 * i < end])
    again.finish_rebuild(start)
    assert again.rebuild_ranges() == [] and not any(n.endswith(".damaged") for n in harness.names())
    harness.check(again)
    again.close()
    harness.check(harness.open())


def test_crash_while_renaming_a_rebuild_redoes_it(harness, failpoint):
    store = harness.open()
    harness.feed(store, 1, 16)
    start, end = _damage_sealed_file(harness, store)
    again = harness.open()
    again.apply_rebuild(start, [record(100 * i, [KEYS[i % 5]]) for i in range(1, 17)
                                if start <= 100 * i < end])
    with failpoint.armed("index.rebuild.after_rename"), pytest.raises(failpoints.FailpointHit):
        again.finish_rebuild(start)
    third = harness.open()
    assert [r.start_physical_offset for r in third.rebuild_ranges()] == [start]
    assert F.idx_name(start) not in harness.names()


def test_damaged_newest_file_needs_rebuild_up_to_the_checkpoint(harness):
    store = harness.open()
    harness.feed(store, 1, 6)
    newest = max(store.file_offsets())
    store.close()
    with open(harness.tmp_path / "index" / F.idx_name(newest), "r+b") as f:
        f.truncate(10)
    again = harness.open()
    [rng] = again.rebuild_ranges()
    assert (rng.start_physical_offset, rng.end_physical_offset) == (newest, 700)
    assert again.resume_physical_offset() == 700


def test_corrupt_checkpoint_is_kept_aside_and_the_newest_file_refed(harness, tmp_path):
    store = harness.open()
    harness.feed(store, 1, 6)
    newest = max(store.file_offsets())
    store.close()
    path = tmp_path / "index" / ckpt.FILE_NAME
    data = bytearray(path.read_bytes())
    data[9] ^= 0xFF
    path.write_bytes(bytes(data))
    again = harness.open()
    assert (tmp_path / "index" / (ckpt.FILE_NAME + ".broken")).exists()
    assert again.resume_physical_offset() == newest and again.rebuild_ranges() == []
    harness.feed(again, newest // 100, 6 - newest // 100 + 1)
    harness.check(again)


def test_torn_entry_after_checkpoint_quarantines_the_newest_file(harness, tmp_path):
    store = harness.open()
    harness.feed(store, 1, 2)
    store.checkpoint()
    harness.feed(store, 3, 1)
    newest = max(store.file_offsets())
    count = store._writer.current.file.header.index_count
    store._writer.current.file.flush()
    path = tmp_path / "index" / F.idx_name(newest)
    with open(path, "r+b") as f:  # a power loss zeroed the page of the last entries
        f.seek(40 + 4 * 4 + 20 * (count - 2) + 4)
        f.write(b"\0" * 8)
    again = harness.open()
    assert F.damaged_name(newest, 300) in harness.names()
    assert [(r.start_physical_offset, r.end_physical_offset) for r in again.rebuild_ranges()] == \
        [(newest, 300)]


def test_file_below_a_damaged_newest_file_is_not_written_again(harness):
    store = harness.open()
    harness.feed(store, 1, 12)
    newest = max(store.file_offsets())
    below = store.file_offsets()[-2]
    store.close()
    with open(harness.tmp_path / "index" / F.idx_name(newest), "r+b") as f:
        f.truncate(10)
    again = harness.open()
    harness.feed(again, 13, 6)  # the follower resumes at the checkpoint
    assert max(again.file_offsets()) >= 1300
    with again.files() as table:
        assert table.get(below).sealed
    newer = again.query("T", KEYS[3], begin_ms=BASE_MS + 1_301_000)
    assert [loc.physical_offset for loc in newer.locators] == [1800, 1600]
    [rng] = again.rebuild_ranges()
    again.apply_rebuild(rng.start_physical_offset,
                        [record(100 * i, [KEYS[i % 5], KEYS[(i * 3) % 5]]) for i in range(1, 13)
                         if rng.start_physical_offset <= 100 * i < rng.end_physical_offset])
    again.finish_rebuild(rng.start_physical_offset)
    harness.check(again)
