"""Helpers shared by the index tests: a trivially correct model, record builders, key finders."""

from __future__ import annotations

import itertools
import os
import pathlib
import random

from index_service.config import IndexConfig
from index_service.records import IndexRecord
from mqstore.javahash import java_string_hash

INT_MIN = -0x8000_0000
BASE_MS = 1_700_000_000_000
GOLDEN_DIR = pathlib.Path(__file__).resolve().parents[2] / "golden"
REGENERATE = os.environ.get("MQSTORE_REGENERATE_GOLDEN") == "1"


def seeded_random(name: str) -> tuple[random.Random, int]:
    """A Random from MQSTORE_TEST_SEED or a fresh seed, printed so a failure can be replayed."""
    seed = int(os.environ.get("MQSTORE_TEST_SEED", random.randrange(1 << 32)))
    print(f"{name}: seed {seed} (replay with MQSTORE_TEST_SEED={seed})")
    return random.Random(seed), seed


def key_with_min_hash(prefix: str) -> str:
    """``prefix`` + a counter + four characters whose Java hashCode is Integer.MIN_VALUE: with four
    free UTF-16 units (weights 31^3, 31^2, 31, 1; each unit 33..0xFFFF, no surrogates) about every
    second counter value has a solution, found greedily."""
    weights = (29791, 961, 31, 1)
    for trial in itertools.count():
        stem = f"{prefix}{trial}"
        h = java_string_hash(stem) & 0xFFFFFFFF
        rest = (0x8000_0000 - 923521 * h - 33 * sum(weights)) & 0xFFFFFFFF
        units = []
        for weight in weights:
            unit = min(rest // weight, 0xFFFF - 33)
            units.append(33 + unit)
            rest -= unit * weight
        if rest == 0 and not any(0xD800 <= u <= 0xDFFF for u in units):
            candidate = stem + "".join(map(chr, units))
            if java_string_hash(candidate) == INT_MIN:
                return candidate
    raise AssertionError("unreachable")


def min_hash_key_for_topic(topic: str, prefix: str = "k") -> str:
    """A key such that ``topic#key`` hashes to Integer.MIN_VALUE."""
    full = key_with_min_hash(f"{topic}#{prefix}")
    return full[len(topic) + 1:]


def tiny_config(tmp_path: pathlib.Path, **overrides) -> IndexConfig:
    values = dict(slot_count=4, entry_count=12, max_keys_per_message=4, max_scan_entries=1000,
                  checkpoint_interval_ms=1_000_000)
    values.update(overrides)
    return IndexConfig(tmp_path, **values)


def record(phy: int, keys=(), uniq: str = "", topic: str = "T", ts_ms: int | None = None,
           rollback: bool = False) -> IndexRecord:
    return IndexRecord(phy, BASE_MS + phy * 1000 if ts_ms is None else ts_ms, topic, list(keys), uniq,
                       rollback)


class Model:
    """topic#key -> list of (physical offset, store time ms), the obvious way."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[tuple[int, int]]] = {}

    def add(self, rec: IndexRecord) -> None:
        if rec.is_rollback:
            return
        keys = ([rec.uniq_key] if rec.uniq_key else []) + [k for k in rec.keys if k]
        for key in dict.fromkeys(keys):
            self.by_key.setdefault(f"{rec.topic}#{key}", []).append((rec.physical_offset,
                                                                     rec.store_timestamp_ms))

    def query(self, topic: str, key: str, begin_ms: int, end_ms: int) -> list[int]:
        """Newest first; begin widened by 999 ms (the index keeps seconds), exactly as documented."""
        hits = {phy for phy, ts in self.by_key.get(f"{topic}#{key}", [])
                if begin_ms - 999 <= ts <= end_ms}
        return sorted(hits, reverse=True)


def all_pages(store, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
              max_num: int = 0) -> list[int]:
    kwargs = {} if end_ms is None else {"end_ms": end_ms}
    token, found = "", []
    for _ in range(10_000):
        result = store.query(topic, key, begin_ms=begin_ms, max_num=max_num, page_token=token, **kwargs)
        found.extend(loc.physical_offset for loc in result.locators)
        token = result.next_page_token
        if not token:
            return found
    raise AssertionError("paging did not end")
