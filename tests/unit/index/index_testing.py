"""Helpers shared by the index tests: a trivially correct model, record builders, key finders."""

from __future__ import annotations

import os
import pathlib

from mqstore.index.config import IndexConfig
from mqstore.index.records import IndexRecord

from tests.support.hashkeys import key_with_min_hash, seeded_random  # noqa: F401 (re-exported)

INT_MIN = -0x8000_0000
BASE_MS = 1_700_000_000_000
GOLDEN_DIR = pathlib.Path(__file__).resolve().parents[2] / "golden"
REGENERATE = os.environ.get("MQSTORE_REGENERATE_GOLDEN") == "1"


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
