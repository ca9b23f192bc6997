"""The creation rule of mqstore.fs at each site outside the commit log (whose own are tested in
tests/crash/test_power_cut.py): after a power cut that drops what was never made durable
(tests/support/powercut.py), what each part created and counted on is still there."""

from __future__ import annotations

import os

import pytest

from mqstore import fs
from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.index.store import IndexStore
from mqstore.index.tier import IndexTierConfig, dir_url, open_tier
from mqstore_launcher import launcher
from tests.support import powercut
from tests.support.compaction import BASE_MS, put
from tests.unit.index.index_testing import record, tiny_config

MODES = [powercut.ENTRIES, powercut.SIZES]


@pytest.mark.parametrize("sync", [True, False])
def test_make_dirs_makes_each_directory_it_creates_durable(tmp_path, sync):
    target = tmp_path / "a" / "b" / "c"
    with powercut.PowerCut(powercut.ENTRIES, tmp_path) as power:
        created = fs.make_dirs(target, sync=sync)
        assert created == [tmp_path / "a", tmp_path / "a" / "b", target]
        if not sync:
            fs.sync_dirs(created)
        assert fs.make_dirs(target) == []  # there already: nothing to do
        power.cut()
    assert target.is_dir()


def test_make_dirs_without_sync_leaves_them_to_the_caller(tmp_path):
    with powercut.PowerCut(powercut.ENTRIES, tmp_path) as power:
        fs.make_dirs(tmp_path / "a" / "b", sync=False)
        power.cut()
    assert not (tmp_path / "a").exists()  # the simulation does drop what was not made durable


def test_an_index_survives_a_power_cut_after_its_checkpoint(tmp_path):
    config = tiny_config(tmp_path / "index-service", slot_count=8, entry_count=40, max_keys_per_message=4)
    with powercut.PowerCut(powercut.ENTRIES, tmp_path) as power:
        store = IndexStore(config)
        store.start()
        store.apply([record(100 * i, keys=[f"k{i}"]) for i in range(5)], 500)
        store.checkpoint()
        power.cut()  # the store is abandoned as a cut process would leave it
    again = IndexStore(config)
    again.start()
    try:
        assert again.resume_physical_offset() == 500
        assert [loc.physical_offset for loc in again.query("T", "k3").locators] == [300]
    finally:
        again.close()


def test_an_index_tier_object_survives_a_power_cut(tmp_path):
    source = tmp_path / "source"
    source.write_bytes(b"compact index bytes")
    (tmp_path / "tier" / "second").mkdir(parents=True)  # (the tier's root exists, as a bucket does; below it, made)
    config = IndexTierConfig(tier_url=dir_url(tmp_path / "tier" / "second"))
    with powercut.PowerCut(powercut.ENTRIES, tmp_path) as power:
        tier = open_tier(config)
        key = tier.new_key("00000000000000000000.cidx")
        tier.put(key, source)
        tier.close()
        power.cut()
    tier = open_tier(config)
    try:
        assert tier.keys() == {key: len(b"compact index bytes")}
    finally:
        tier.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_new_compaction_queue_survives_a_power_cut_after_its_sync(tmp_path, mode):
    config = CompactionConfig(segment_size_bytes=4096)
    clock = FakeClock(BASE_MS)
    with powercut.PowerCut(mode, tmp_path) as power:
        store = CompactionStore(tmp_path / "compactor" / "logs", config, clock)
        for offset in range(30):  # over several segments
            put(store, f"k{offset % 7}", f"v{offset}".encode() * 20, offset, clock.now_ms(), topic="kv", queue_id=3)
        store.sync()  # what the follower does before its checkpoint says these are applied
        power.cut()
    again = CompactionStore(tmp_path / "compactor" / "logs", config, clock)
    assert again.slot("kv", 3).qlog.next_offset() == 30


@pytest.mark.parametrize("mode", MODES)
def test_the_internal_token_survives_a_power_cut_whole(tmp_path, monkeypatch, mode):
    monkeypatch.delenv(launcher.TOKEN_ENV, raising=False)
    with powercut.PowerCut(mode, tmp_path) as power:
        fs.make_dirs(tmp_path / "data")
        token = launcher.internal_token(tmp_path / "data")
        power.cut()
    assert len(token) == 64 and launcher.internal_token(tmp_path / "data") == token


def test_a_power_cut_touches_no_file_outside_its_root(tmp_path):
    """Threads of other tests may still write in this process (a store a failed test left open): the cut
    neither tracks nor drops their files, nor reports their renames."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    (other / "old").write_bytes(b"old")
    with powercut.PowerCut(powercut.ENTRIES, mine) as power:
        (mine / "new").write_bytes(b"never synced")
        (other / "new").write_bytes(b"never synced")
        (other / "next").write_bytes(b"replaces old")
        os.replace(other / "next", other / "old")  # over a file that existed, never made durable
        assert power.cut() == [f"{mine / 'new'}: entry lost"]
    assert not (mine / "new").exists()
    assert (other / "new").read_bytes() == b"never synced" and (other / "old").read_bytes() == b"replaces old"


def test_make_dirs_over_a_file_says_so(tmp_path):
    (tmp_path / "a").write_bytes(b"not a directory")
    for target in (tmp_path / "a", tmp_path / "a" / "b"):
        with pytest.raises(FileExistsError, match=str(tmp_path / "a")):
            fs.make_dirs(target)
