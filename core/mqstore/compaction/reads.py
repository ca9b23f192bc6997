"""Reads of compaction logs: a compacted Pull by queue offset, the latest value of a key, a Scan of every
live key, and the offsets of a compacted queue (answered from the compaction log itself, never from the
raw queue: RocketMQ's #7540).

Offsets are the original queue offsets; compacted offsets are holes. A Pull from a hole starts at the
next record and says which offsets it skipped and why ("compacted"). Nothing below min_offset exists
any more: a Pull there starts at the first record (RocketMQ's rule, reference §6.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mqstore import limits
from mqstore.errors import InvalidArgument, NotFound, shown

from .qlog import Chunk, QueueLog, Stored
from .rounds import compaction_fields, key_and_tombstone
from .store import CompactionStore

MAX_PULL_MESSAGES = 1_000
MAX_PULL_BYTES = 4 << 20
DEFAULT_SCAN_PAGE = 500


@dataclass(frozen=True)
class Skipped:
    from_offset: int
    to_offset: int      # exclusive
    reason: str         # "compacted": a round removed them (superseded, or expired tombstones)


@dataclass(frozen=True)
class Pulled:
    records: list[Stored]
    next_offset: int
    min_offset: int
    max_offset: int     # the next offset the queue will hold
    skipped: list[Skipped]


def pull(qlog: QueueLog, offset: int, max_messages: int, max_bytes: int) -> Pulled:
    limits.at_least_zero("offset", offset, "an original queue offset")
    max_messages = limits.limit("max_messages", max_messages, default=32, maximum=MAX_PULL_MESSAGES)
    max_bytes = limits.limit("max_bytes", max_bytes, default=MAX_PULL_BYTES, maximum=MAX_PULL_BYTES)
    low, high = qlog.min_offset(), qlog.next_offset()
    records = qlog.read(qlog.index_of(offset), max_messages, max_bytes)
    skipped, expected = [], offset
    for stored in records:
        if stored.entry.queue_offset > expected:
            skipped.append(Skipped(expected, stored.entry.queue_offset, "compacted"))
        expected = stored.entry.queue_offset + 1
    if not records and offset < high:
        skipped.append(Skipped(offset, high, "compacted"))
    next_offset = records[-1].entry.queue_offset + 1 if records else max(offset, high) if offset < high else offset
    return Pulled(records, next_offset, low, high, skipped)


def no_log(topic: str) -> NotFound:
    return NotFound(f"topic {shown(topic)} has no compaction log here (not a COMPACTION topic, or not written yet, "
                    f"or deleted)")


@dataclass(frozen=True)
class Latest:
    key: str
    queue_id: int
    stored: Stored
    tombstone: bool
    value: bytes | None = None  # the record's body, when the read has taken it out already (Scan)


def get_latest(store: CompactionStore, topic: str, key: str) -> Latest:
    """The latest record of ``key`` (a tombstone says so); NotFound when the key was never written (or
    its tombstone's retention is over)."""
    if not key:
        raise InvalidArgument("key must not be empty")
    for slot in store.slots(topic):
        qlog = slot.qlog
        offset = qlog.latest.get(key)
        if offset is None:
            continue
        found = qlog.read(qlog.index_of(offset), 1)
        if found and found[0].entry.queue_offset == offset:
            return Latest(key, qlog.queue_id, found[0], key_and_tombstone(found[0].raw)[1])
    if not store.slots(topic):
        raise no_log(topic)
    for slot in store.slots(topic):
        if slot.keys_partial:  # the key may be in a tiered segment whose keys are not known yet: never NOT_FOUND
            raise store.remote.unloaded_error(f"the keys of the tiered segments of {shown(topic)}/{slot.qlog.queue_id}")
    raise NotFound(f"key {shown(key)} has no value in topic {shown(topic)}")


@dataclass(frozen=True)
class ScanPage:
    items: list[Latest]
    next_queue_id: int
    next_offset: int
    done: bool


Take = Callable[[QueueLog, Chunk, int], "tuple[int, int]"]


def scan(store: CompactionStore, topic: str, queue_id: int, offset: int, limit: int,
         include_tombstones: bool = False, take: Take | None = None) -> ScanPage:
    """The latest value of live keys, queue by queue in offset order, from the cursor (queue_id, offset);
    the next cursor. A key written again after the cursor passed it shows up again (at its new offset).

    ``take(qlog, chunk, room)`` is what a page does with a chunk of records: it keeps the live ones (the
    latest of their key, and not tombstones unless asked for), at most ``room``, stopping after the
    room-th, and says how many records it went through and how many it kept. Without it the page's
    ``items`` are Latest objects (the reference); the Compactor service passes the compiled codec's,
    which writes the page's wire bytes instead (compactor_service.scan_wire)."""
    if limit <= 0 or limit > MAX_PULL_MESSAGES:
        raise InvalidArgument(f"page_size is {limit}; give 0 (the default, {DEFAULT_SCAN_PAGE}) or 1 to "
                              f"{MAX_PULL_MESSAGES}")
    items: list[Latest] = []
    if take is None:
        take = _latest_items(items, include_tombstones)
    taken = 0
    for slot in [s for s in store.slots(topic) if s.qlog.queue_id >= queue_id]:
        qlog = slot.qlog
        at = offset if qlog.queue_id == queue_id else 0
        while taken < limit:
            chunk = qlog.read_chunk(qlog.index_of(at), min(256, limit * 4))
            if not chunk.offsets:
                break
            went, kept = take(qlog, chunk, limit - taken)
            taken += kept
            at = chunk.offsets[went - 1] + 1
        if taken == limit:
            return ScanPage(items, qlog.queue_id, at, False)
    return ScanPage(items, 0, 0, True)


def _latest_items(items: list[Latest], include_tombstones: bool) -> Take:
    """The reference ``take`` of :func:`scan`: a Latest per live record, into ``items``."""
    def take(qlog: QueueLog, chunk: Chunk, room: int) -> tuple[int, int]:
        kept = 0
        for i in range(len(chunk.offsets)):
            stored = chunk.stored(i)
            key, tombstone, value = compaction_fields(stored.raw)
            if key is not None and qlog.latest.get(key) == chunk.offsets[i] and (include_tombstones or not tombstone):
                items.append(Latest(key, qlog.queue_id, stored, tombstone, value))
                kept += 1
                if kept == room:
                    return i + 1, kept
        return len(chunk.offsets), kept
    return take
