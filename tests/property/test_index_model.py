"""The hash index against a dict-of-lists model, random operations from a printed seed.

Replay a failure with MQSTORE_TEST_SEED=<seed>. Whole-second store times make the index's
second-granular times exact, so answers must equal the model's.
"""

from __future__ import annotations

import random

import pytest
from mqstore.index.config import IndexConfig
from mqstore.index.records import IndexRecord
from mqstore.index.store import IndexStore
from mqstore.clock import FakeClock
from mqstore.format.index_file import IndexFile, key_hash
from mqstore.javahash import java_string_hash

from tests.support.hashkeys import key_with_min_hash, seeded_random

BASE_MS = 1_700_000_000_000
INT_MIN = -0x8000_0000


def _keys(rng: random.Random) -> list[str]:
    special = [key_with_min_hash("T#m"), key_with_min_hash("T#n"), "polygenelubricants"]
    for key in special:
        assert java_string_hash(key) == INT_MIN and key_hash(key) == 0
    return special + [f"T#k{i}" for i in range(rng.randint(3, 30))] + ["T#Aa", "T#BB"]


def test_index_file_against_model(tmp_path):
    rng, _ = seeded_random("index_file_model")
    for round_ in range(20):
        slots = rng.choice([1, 2, 3, 7, 64])  # 1 slot: every key in one bucket
        entries = rng.randint(2, 300)
        file = IndexFile.create(tmp_path / f"f{round_}", slots, entries)
        keys = _keys(rng)
        model: dict[int, list[tuple[int, int]]] = {}
        phy, ts = rng.randint(0, 10**6), BASE_MS
        try:
            for _ in range(entries - 1):
                key = rng.choice(keys)
                phy += rng.randint(1, 500)
                ts += 1000 * rng.randint(0, 3)
                file.put(key, phy, ts)
                model.setdefault(key_hash(key), []).append((phy, ts))
                if rng.random() < 0.2:
                    _query_both(rng, file, model, keys, ts)
            for key in keys:
                _query_both(rng, file, model, [key], ts)
        finally:
            file.close()


def _query_both(rng, file, model, keys, now_ms):
    key = rng.choice(keys)
    begin = rng.choice([0, BASE_MS, now_ms - 1000 * rng.randint(0, 50)])
    end = rng.choice([1 << 62, now_ms, begin + 1000 * rng.randint(0, 50)])
    max_num = rng.randint(1, 80)
    expected = [p for p, t in reversed(model.get(key_hash(key), [])) if begin <= t <= end][:max_num]
    got = [m.physical_offset for m in file.query(key, begin, end, max_num, max_scan_entries=10**6).matches]
    assert got == expected, (key, begin, end, max_num)


def test_store_against_model_with_rolls_conversions_and_restarts(tmp_path):
    rng, _ = seeded_random("index_store_model")
    config = IndexConfig(tmp_path, slot_count=rng.choice([1, 3, 16]), entry_count=rng.randint(6, 40),
                         max_keys_per_message=4, max_scan_entries=rng.choice([3, 50, 10_000]),
                         checkpoint_interval_ms=10**9)
    short = [k[2:] for k in _keys(rng)]
    model: dict[str, list[tuple[int, int]]] = {}
    store = IndexStore(config, clock=FakeClock(BASE_MS))
    store.start()
    phy, ts = 0, BASE_MS
    try:
        for step in range(400):
            phy += rng.randint(1, 300)
            ts += 1000 * rng.randint(0, 2)
            rec = IndexRecord(phy, ts, "T", rng.sample(short, rng.randint(0, 3)), "",
                              rng.random() < 0.05)
            store.apply([rec], phy + 1)
            if not rec.is_rollback:
                for key in dict.fromkeys(rec.keys):
                    model.setdefault(key, []).append((phy, ts))
            action = rng.random()
            if action < 0.05:
                store.convert_sealed(rng.randint(1, 3))
            elif action < 0.08:
                store.close()
                store = IndexStore(config, clock=FakeClock(BASE_MS))
                store.start()
            if step % 10 == 0:
                _store_query(rng, store, model, short, ts)
        for key in short:
            _store_query(rng, store, model, [key], ts, whole=True)
    finally:
        store.close()


def _store_query(rng, store, model, keys, now_ms, whole=False):
    key = rng.choice(keys)
    begin = 0 if whole else rng.choice([0, now_ms - 1000 * rng.randint(0, 40)])
    end = (1 << 62) if whole else rng.choice([1 << 62, now_ms - 1000 * rng.randint(0, 20)])
    if end < begin:
        begin, end = end, begin
    max_num = rng.randint(1, 30)
    # The index compares hashes only (the servicer removes collisions), so the model does too.
    wanted = key_hash(f"T#{key}")
    expected = sorted({p for k, hits in model.items() if key_hash(f"T#{k}") == wanted
                       for p, t in hits if begin - 999 <= t <= end}, reverse=True)
    got, token = [], ""
    while True:
        page = store.query("T", key, begin_ms=begin, end_ms=end, max_num=max_num, page_token=token)
        assert len(page.locators) <= max_num
        got += [loc.physical_offset for loc in page.locators]
        token = page.next_page_token
        if not token:
            break
    assert got == expected, (key, begin, end, max_num)


@pytest.mark.parametrize("text", ["polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"])
def test_known_min_value_strings(text):
    assert java_string_hash(text) == INT_MIN and key_hash(text) == 0
