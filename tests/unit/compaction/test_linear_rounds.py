"""A round is one pass whatever the map budget (rounds.py): one install, each sealed segment rewritten at
most once, the segments below the first one that changes kept as they are (the same files), and a
bucket whose keys do not fit the map split until they do (never a failed round)."""

from __future__ import annotations

import os

from mqstore.clock import FakeClock
from mqstore.compaction import reads, rounds
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.format import compaction_segment as cseg
from tests.support.compaction import BASE_MS, put


def _store(tmp_path, budget_keys: int) -> CompactionStore:
    config = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=budget_keys * ENTRY_COST_BYTES)
    return CompactionStore(tmp_path / "logs", config, FakeClock(BASE_MS + 60_000))


def _live(store: CompactionStore) -> dict[str, int]:
    return {v.key: v.stored.entry.queue_offset for v in reads.scan(store, "kv", 0, 0, 1000).items}


def test_keys_far_over_the_budget_take_one_install_and_clean_everything(tmp_path, monkeypatch):
    store = _store(tmp_path, budget_keys=2)
    try:
        latest = {}
        for offset in range(120):
            key = f"key-{offset * 7 % 30}"
            put(store, key, b"v%d" % offset, offset, BASE_MS + offset, pad=30)
            latest[key] = offset
        staged = []
        real_hit = rounds.failpoints.hit
        monkeypatch.setattr(rounds.failpoints, "hit", lambda name: (staged.append(name), real_hit(name)))
        info = store.compact(store.slot("kv", 0), seal_active=True)
        assert staged.count("compaction.round.staged") == 1  # was one install per pass: 15 of them
        assert info.stats.passes >= 15 and info.stats.keys_mapped == 30  # the map holds 2 keys at a time
        assert _live(store) == latest
        assert len(store.slot("kv", 0).qlog.entries) == 30
        assert store.dirt(store.slot("kv", 0)).dirty_bytes == 0
    finally:
        store.close()


def test_a_bucket_whose_keys_do_not_fit_is_split_until_they_do(tmp_path):
    store = _store(tmp_path, budget_keys=1)
    try:
        for offset in range(200):
            put(store, f"key-{offset % 50}", b"v%d" % offset, offset, BASE_MS + offset)
        info = store.compact(store.slot("kv", 0), seal_active=True)
        # one key a filling: 63 buckets for 50 keys, so some hold two or more and are split
        assert (info.stats.passes, info.stats.keys_mapped) == (50, 50)
        assert _live(store) == {f"key-{k}": 150 + k for k in range(50)}
    finally:
        store.close()


def test_the_segments_below_the_first_that_changes_are_kept_as_they_are(tmp_path):
    store = _store(tmp_path, budget_keys=1000)
    slot = store.slot("kv", 0, create=True)
    try:
        for offset in range(60):  # keys written once: a round has nothing to drop among them
            put(store, f"once-{offset}", b"x" * 200, offset, BASE_MS + offset)
        for offset in range(60, 120):
            put(store, f"twice-{offset % 10}", b"y" * 200, offset, BASE_MS + offset)
        slot.qlog.seal_active()
        qdir = slot.qlog.directory
        bases = slot.qlog.bases[:-1]
        first_changed = cseg.segment_base(slot.qlog.entries.positions[60], 4096)
        before = {b: os.stat(qdir / cseg.log_name(b)).st_ino for b in bases}
        info = store.compact(slot)
        kept = [b for b in bases if b < first_changed]
        assert kept and all(os.stat(qdir / cseg.log_name(b)).st_ino == before[b] for b in kept)  # not rewritten
        assert os.stat(qdir / cseg.log_name(first_changed)).st_ino != before[first_changed]
        assert info.stats.records_removed == 50 and info.stats.records_rewritten < info.stats.records_out
        live = _live(store)
        assert {k for k in live if k.startswith("once-")} == {f"once-{i}" for i in range(60)}
        assert {live[f"twice-{k}"] for k in range(10)} == set(range(110, 120))
        store.close()
        store = _store(tmp_path, budget_keys=1000)  # the index read back from the files says the same
        assert _live(store) == live
    finally:
        store.close()
