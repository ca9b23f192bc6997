"""A running round's passes (offset map fillings) are visible while it runs (DescribeQueue reads slot.info;
the metrics too): a round that fails before its install shows the fillings it made, instead of 0."""

from __future__ import annotations

import pytest

from mqstore.clock import FakeClock
from mqstore.compaction import rounds
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.failpoints import FailpointHit
from mqstore.metrics import Registry
from tests.support.compaction import BASE_MS, put


def test_a_round_failing_before_its_install_leaves_its_map_fillings_on_record(tmp_path, monkeypatch):
    config = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=4 * ENTRY_COST_BYTES,
                              min_compaction_lag_ms=0)
    store = CompactionStore(tmp_path / "logs", config, FakeClock(BASE_MS + 60_000))
    registry = Registry()
    store.register_metrics(registry)
    try:
        for offset in range(40):
            put(store, f"key-{offset % 10}", b"value-%d" % offset, offset, BASE_MS + offset, pad=40)
        seen_running = []

        def fails_when_staged(name: str) -> None:
            if name == "compaction.round.staged":
                seen_running.append(slot.info.stats.passes)  # what DescribeQueue shows of the running round
                raise FailpointHit(name)
        monkeypatch.setattr(rounds.failpoints, "hit", fails_when_staged)
        slot = store.slot("kv", 0)
        with pytest.raises(FailpointHit):
            store.compact(slot, seal_active=True)
        assert seen_running[0] >= 3                 # 10 keys, a map of 4: several fillings, shown while it ran
        assert slot.info.stats.passes == seen_running[0]  # was 0: the stats came back only with a finished round
        assert slot.info.result.startswith("FailpointHit")
        passes = {f.name: f for f in registry.collect()}["mqstore_compactor_round_passes"]
        assert dict(passes.samples)[("kv", "0")] == seen_running[0]
    finally:
        store.close()
