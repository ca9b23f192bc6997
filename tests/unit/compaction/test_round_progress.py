"""A running round's passes are visible while it runs (DescribeQueue reads slot.info; the metrics too):
a round whose second pass fails shows the two passes it began (the first installed), instead of 0."""

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


def test_a_failed_second_pass_leaves_the_first_pass_on_record(tmp_path, monkeypatch):
    config = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=4 * ENTRY_COST_BYTES,
                              min_compaction_lag_ms=0)
    store = CompactionStore(tmp_path / "logs", config, FakeClock(BASE_MS + 60_000))
    registry = Registry()
    store.register_metrics(registry)
    try:
        for offset in range(40):
            put(store, f"key-{offset % 10}", b"value-%d" % offset, offset, BASE_MS + offset, pad=40)
        staged = []

        def second_pass_fails(name: str) -> None:
            if name == "compaction.round.staged":
                staged.append(name)
                if len(staged) == 2:
                    raise FailpointHit(name)
        monkeypatch.setattr(rounds.failpoints, "hit", second_pass_fails)
        slot = store.slot("kv", 0)
        with pytest.raises(FailpointHit):
            store.compact(slot, seal_active=True)
        assert slot.info.stats.passes == 2                  # was 0: the stats came back only with a finished round
        assert slot.info.result.startswith("FailpointHit")
        passes = {f.name: f for f in registry.collect()}["mqstore_compactor_round_passes"]
        assert dict(passes.samples)[("kv", "0")] == 2
    finally:
        store.close()
