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
