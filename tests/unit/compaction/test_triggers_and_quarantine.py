"""Background rounds: the triggers (dirty ratio, max compaction lag, tombstone horizon) on an injected
clock, and a queue whose round fails is quarantined with backoff while the others go on."""

from __future__ import annotations

from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.format import compaction_segment as cseg
from tests.support.compaction import BASE_MS, put

CONFIG = CompactionConfig(segment_size_bytes=4096, min_compaction_lag_ms=1_000, max_compaction_lag_ms=60_000,
                          delete_retention_ms=10_000, quarantine_initial_ms=1_000)


def _write(store, queue_id: int, count: int, clock, first: int = 0, keys: int = 3) -> None:
    for offset in range(first, first + count):
        put(store, f"k{offset % keys}", b"v" * 200, offset, clock.now_ms(), queue_id=queue_id)


def test_triggers_on_an_injected_clock(tmp_path):
    clock = FakeClock(BASE_MS)
    store = CompactionStore(tmp_path, CONFIG, clock)
    _write(store, 0, 40, clock)  # several sealed segments, all dirty
    slot = store.slot("kv", 0)
    assert store.due(slot) == ""  # younger than min_compaction_lag_ms: nothing may be cleaned yet
    clock.advance(1_000)
    assert store.due(slot) == "dirty_ratio"
    assert store.run_due() == 1 and store.due(slot) == ""
    put(store, "k0", None, 40, clock.now_ms())  # a tombstone in the active segment only
    assert store.due(slot) == ""
    clock.advance(60_000)  # past max_compaction_lag_ms: the active segment is sealed for it
    assert store.due(slot) == "max_compaction_lag"
    store.run_due()
    assert store.dirt(slot).tombstones_kept == 1 and store.due(slot) == ""
    clock.advance(10_000)
    assert store.due(slot) == "tombstone_horizon"
    store.run_due()
    assert store.dirt(slot).tombstones_kept == 0 and "k0" not in slot.qlog.latest
    store.close()


def test_a_failing_queue_is_quarantined_with_backoff_and_the_others_go_on(tmp_path):
    clock = FakeClock(BASE_MS)
    store = CompactionStore(tmp_path, CONFIG, clock)
    _write(store, 0, 40, clock)
    _write(store, 1, 40, clock)
    broken = store.slot("kv", 0).qlog
    with open(broken.directory / cseg.log_name(broken.bases[0]), "r+b") as f:
        f.truncate(100)  # damaged under the compactor's feet
    clock.advance(1_000)
    assert store.run_due() == 1  # queue 1 was compacted
    q = store.slot("kv", 0).quarantine
    assert q.failures == 1 and q.until_ms == clock.now_ms() + 1_000 and q.error
    assert store.slot("kv", 0).info.result == q.error and store.slot("kv", 1).info.result == "ok"
    assert store.due(store.slot("kv", 0)) == ""  # quarantined: not retried before its backoff
    clock.advance(1_000)
    assert store.due(store.slot("kv", 0)) == "dirty_ratio"
    store.run_due()
    assert q.failures == 2 and q.until_ms == clock.now_ms() + 2_000  # the backoff doubled
    store.close()


def test_asking_whether_a_round_is_due_changes_nothing(tmp_path):
    """DescribeQueue asks ``due``: a read must not seal the active segment, even one past max lag."""
    clock = FakeClock(BASE_MS)
    store = CompactionStore(tmp_path, CONFIG, clock)
    put(store, "k0", b"v", 0, clock.now_ms())
    slot = store.slot("kv", 0)
    clock.advance(60_000)  # the active segment's record is past max_compaction_lag_ms
    for _ in range(3):
        assert store.due(slot) == "max_compaction_lag"
    assert slot.qlog.bases == [0] and store.dirt(slot).active_bytes > 0  # still active, nothing sealed
    assert sorted(p.name for p in slot.qlog.directory.iterdir()) == [cseg.index_name(0), cseg.log_name(0)]
    assert store.run_due() == 1  # the sweep seals it and cleans it
    assert len(slot.qlog.bases) == 2 and store.dirt(slot).active_bytes == 0
    store.close()


def test_a_tombstone_is_kept_its_whole_retention_to_the_millisecond(tmp_path):
    """Seen-at is stored in ms: a tombstone first seen at ...999 ms is not removed 999 ms early."""
    config = CompactionConfig(segment_size_bytes=4096, delete_retention_ms=10_000)
    clock = FakeClock(BASE_MS)
    store = CompactionStore(tmp_path, config, clock)
    put(store, "k0", b"v", 0, clock.now_ms())
    put(store, "k0", None, 1, clock.now_ms())
    slot = store.slot("kv", 0)
    clock.advance(999)
    seen_ms = clock.now_ms()  # a round sees the tombstone at BASE_MS + 999
    store.compact(slot, seal_active=True)
    assert [slot.qlog.entries.seen[i] for i in range(len(slot.qlog.entries))] == [seen_ms]
    clock.advance(10_000 - 1)  # 1 ms before seen-at + retention (whole seconds said: expired 998 ms ago)
    store.compact(slot)
    assert store.dirt(slot).tombstones_kept == 1 and "k0" in slot.qlog.latest
    clock.advance(1)
    store.compact(slot)
    assert store.dirt(slot).tombstones_kept == 0 and "k0" not in slot.qlog.latest
    store.close()
    reopened = CompactionStore(tmp_path, config, clock)  # nothing of the tombstone comes back from the files
    assert "k0" not in reopened.slot("kv", 0).qlog.latest
    reopened.close()
