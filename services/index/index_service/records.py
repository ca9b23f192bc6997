"""What the index is fed: one tuple per commit log record, and the keys indexed for it."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class IndexedKeys:
    keys: tuple[str, ...]    # "topic#key", distinct, UNIQ_KEY first
    dropped: int             # keys beyond max_keys_per_message (logged and counted, not indexed)


def index_keys(record: IndexRecord, max_keys: int) -> IndexedKeys:
    """``topic#UNIQ_KEY`` and ``topic#k`` for each non-empty k; duplicates collapse (RIP-65 uses a set)."""
    if record.is_rollback or not record.topic:
        return IndexedKeys((), 0)
    # A follower may hand over the raw KEYS value: split again, it costs nothing when already split.
    raw = ([record.uniq_key] if record.uniq_key else []) + [
        part for key in record.keys for part in key.split(" ") if part]
    distinct = tuple(dict.fromkeys(f"{record.topic}#{k}" for k in raw))
    return IndexedKeys(distinct[:max_keys], max(0, len(distinct) - max_keys))


def query_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"
