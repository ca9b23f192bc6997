"""What the index is fed: one tuple per commit log record, and the keys indexed for it."""

from __future__ import annotations

from typing import NamedTuple


class IndexRecord(NamedTuple):
    """One commit log record as the Tail follower decodes it. ``keys`` is the KEYS property split on
    spaces (empty strings are ignored); ``uniq_key`` is UNIQ_KEY or ""; ``is_rollback`` marks a
    rolled-back transaction record, which is not indexed (prepared half messages are, as in RocketMQ)."""

    physical_offset: int
    store_timestamp_ms: int
    topic: str
    keys: tuple[str, ...] | list[str]
    uniq_key: str = ""
    is_rollback: bool = False


class IndexedKeys(NamedTuple):  # a NamedTuple: one per indexed message, cheap to build
    keys: tuple[str, ...]    # distinct keys, UNIQ_KEY first; indexed as "topic#key"
    dropped: int             # keys beyond max_keys_per_message (logged and counted, not indexed)


def index_keys(record: IndexRecord, max_keys: int) -> IndexedKeys:
    """``topic#UNIQ_KEY`` and ``topic#k`` for each non-empty k; duplicates collapse (RIP-65 uses a set)."""
    if record.is_rollback or not record.topic:
        return IndexedKeys((), 0)
    # A follower may hand over the raw KEYS value: split again, it costs nothing when already split.
    keys = record.keys
    if keys and (" ".join(keys).count(" ") != len(keys) - 1 or "" in keys):  # raw KEYS, or empties
        keys = [part for key in keys for part in key.split(" ") if part]
    distinct = tuple(dict.fromkeys((record.uniq_key, *keys) if record.uniq_key else keys))
    if len(distinct) <= max_keys:
        return IndexedKeys(distinct, 0)
    return IndexedKeys(distinct[:max_keys], len(distinct) - max_keys)


def query_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"
