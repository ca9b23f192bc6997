"""Compaction against a model (a dict of the latest value per key): random keys, values, tombstones,
rounds (some with a key budget so small that every round's keys need many buckets, some of them split
further), restarts and time.

Replay a failure with MQSTORE_TEST_SEED=<seed>.
"""

from __future__ import annotations

import pytest

from mqstore.clock import FakeClock
from mqstore.compaction import reads
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.rounds import key_and_tombstone
from mqstore.compaction.store import CompactionStore
from mqstore.errors import NotFound
from tests.support.compaction import BASE_MS, put
from tests.support.hashkeys import seeded_random

RETENTION_MS = 20_000


def _all_records(store: CompactionStore) -> list[tuple[int, str, bytes | None]]:
    """What a consumer reading from offset 0 sees: (offset, key, value or None for a tombstone)."""
    qlog = store.slot("kv", 0).qlog
    out, offset = [], 0
    for _ in range(10_000):
        page = reads.pull(qlog, offset, 100, 0)
        for stored in page.records:
            key, tombstone = key_and_tombstone(stored.raw)
            body = stored.raw[88:88 + int.from_bytes(stored.raw[84:88], "big")]
            out.append((stored.entry.queue_offset, key, None if tombstone else bytes(body)))
        if not page.records:
            return out
        offset = page.next_offset
    raise AssertionError("pull did not end")


def _check_latest(store, model: dict, rng) -> None:
    for key in rng.sample(sorted(model), min(5, len(model))):
        offset, value = model[key]
        found = reads.get_latest(store, "kv", key)
        assert found.stored.entry.queue_offset == offset and found.tombstone == (value is None)


@pytest.mark.parametrize("budget_keys", [1, 3, 1000])
def test_compaction_against_a_dict_of_latest_values(tmp_path, budget_keys):
    rng, _ = seeded_random(f"compaction_model_{budget_keys}")
    clock = FakeClock(BASE_MS)
    config = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=budget_keys * ENTRY_COST_BYTES,
                              delete_retention_ms=RETENTION_MS)
    store = CompactionStore(tmp_path, config, clock)
    keys = [f"key-{i}" for i in range(rng.randint(5, 40))]
    model: dict[str, tuple[int, bytes | None]] = {}  # key -> (latest offset, value or None)
    seen: dict[tuple[str, int], int] = {}           # (key, tombstone offset) -> seen-at ms
    removed: set[str] = set()
    offset, multi_pass = 0, False
    try:
        for _ in range(600):
            op = rng.random()
            if op < 0.8:
                key = rng.choice(keys)
                value = None if rng.random() < 0.15 else f"{key}={offset}".encode() * rng.randint(1, 5)
                put(store, key, value, offset, clock.now_ms(), pad=rng.randint(0, 60))
                model[key], offset = (offset, value), offset + 1
                removed.discard(key)
                clock.advance(rng.randint(0, 300))
            elif op < 0.88:  # a full round: everything sealed and cleaned
                now = clock.now_ms()
                info = store.compact(store.slot("kv", 0, create=True), seal_active=True)
                multi_pass |= info.stats.passes > 1
                for key, (o, value) in list(model.items()):
                    if value is None:
                        at = seen.setdefault((key, o), now)
                        if now >= at + RETENTION_MS:
                            del model[key]
                            removed.add(key)
                expected = sorted((o, k, v) for k, (o, v) in model.items())
                assert _all_records(store) == expected
            elif op < 0.92:  # a round over the sealed segments only: values never lost
                slot = store.slot("kv", 0, create=True)
                entries = slot.qlog.sealed()[1]
                sealed = {entries.offsets[i] for i in range(len(entries))}
                store.compact(slot)
                for key, (o, value) in model.items():  # the round cleaned every sealed record
                    if value is None and o in sealed:
                        seen.setdefault((key, o), clock.now_ms())
                got = {(o, k) for o, k, _ in _all_records(store)}
                for key, (o, value) in list(model.items()):
                    expired = value is None and (key, o) in seen and clock.now_ms() >= seen[key, o] + RETENTION_MS
                    if (o, key) not in got:
                        assert expired, f"the latest record of {key} (offset {o}) was lost"
                        del model[key]
                        removed.add(key)
            elif op < 0.96:
                store.close()
                store = CompactionStore(tmp_path, config, clock)
            else:
                clock.advance(rng.randint(0, 2 * RETENTION_MS))
            if model:
                _check_latest(store, model, rng)
            for key in rng.sample(sorted(removed), min(2, len(removed))):
                with pytest.raises(NotFound):
                    reads.get_latest(store, "kv", key)
    finally:
        store.close()
    if budget_keys == 1:
        assert multi_pass, "a budget of one key makes every round with two dirty keys fill the map more than once"
