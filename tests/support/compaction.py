"""Compaction-topic records for tests: the commit log record of one keyed message (or tombstone)."""

from __future__ import annotations

from mqstore.compaction.store import CompactionStore
from mqstore.format import record
from tests.support import records

BASE_MS = 1_700_000_000_000


def raw(key: str, value: bytes | None, queue_offset: int, store_ms: int, *, topic: str = "kv", queue_id: int = 0,
        pad: int = 0) -> bytes:
    """A record of ``key``; value None is a tombstone (an empty body)."""
    props = record.encode_properties({"KEYS": key, "UNIQ_KEY": f"U{queue_offset:08d}", "PAD": "x" * pad})
    return records.encode(topic=topic.encode(), body=value or b"", properties=props, queue_id=queue_id,
                          queue_offset=queue_offset, physical_offset=10_000 + queue_offset * 7,
                          store_timestamp_ms=store_ms)


def put(store: CompactionStore, key: str, value: bytes | None, queue_offset: int, store_ms: int, *,
        topic: str = "kv", queue_id: int = 0, pad: int = 0) -> None:
    assert store.append(topic, queue_id, raw(key, value, queue_offset, store_ms, topic=topic, queue_id=queue_id,
                                             pad=pad), queue_offset, None, store_ms)
