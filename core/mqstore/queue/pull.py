"""Pull's read path: the messages of one consume queue from an offset, with tag or SQL92 filters (the
latter on each record's properties, its body never decoded: mqstore.filters.sql92), size limits and long
polling. MessageStore.pull checks the request and calls these.

Thread-safety: :func:`read_queue` reads lock-free below the queue's ``max_offset``; :class:`LongPolls`
is thread-safe (a bounded semaphore and the dispatcher's ``visible`` condition).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Protocol, Sequence

from mqstore import waits
from mqstore.errors import DataLoss, OutOfRange
from mqstore.format import record
from mqstore.format.record_reader import Record, RecordView
from mqstore.log.segment import SegmentClosed
from mqstore.model import PullResult, RawPullResult, StoredMessage
from mqstore.queue.consume_queue import ConsumeQueue

# (physical offset, size, queue offset) -> the checked record; raises DataLoss (CommitLog.decode_at).
DecodeAt = Callable[[int, int, int], Record]
# The same -> the checked record's bytes, not decoded (CommitLog.checked_at).
CheckedAt = Callable[[int, int, int], bytes]


class Selector(Protocol):
    """A filter on a record's properties map (mqstore.filters.sql92.Sql92Filter); ``required_tags``, when
    not None, holds every TAGS a message it selects may have."""

    required_tags: frozenset[str] | None

    def matches(self, properties: Mapping[str, str]) -> bool: ...


def read_queue(cq: ConsumeQueue, offset: int, max_messages: int, max_bytes: int, tags: Sequence[str],
               tag_code: Callable[[str], int], decode_at: DecodeAt, selector: Selector | None = None) -> PullResult:
    """Up to ``max_messages`` messages (at least one, else up to ``max_bytes``) of ``cq`` from
    ``offset`` whose TAGS is one of ``tags`` (all when empty) and that ``selector`` matches (when given).
    Entries whose tag code matches none are skipped without reading the log; a code that matches by hash
    collision is checked on the record. A record that fails its checks ends the result before it, or
    raises DataLoss when it comes first."""
    taken, next_offset = _collect(cq, offset, max_messages, max_bytes, tags, tag_code, decode_at,
                                  lambda rec: rec.properties.get(record.PROPERTY_TAGS, ""), selector,
                                  lambda rec: rec.properties)
    messages: list[StoredMessage] = []
    if taken:  # every message id of one Pull takes the first record's store host
        first = taken[0][0]
        host_prefix = record.msg_id_prefix(first.store_host, first.store_port)
        messages = [StoredMessage(rec, f"{host_prefix}{phys:016X}") for rec, phys in taken]
    return PullResult(messages, next_offset, cq.min_offset, cq.max_offset)


def read_queue_raw(cq: ConsumeQueue, offset: int, max_messages: int, max_bytes: int, tags: Sequence[str],
                   tag_code: Callable[[str], int], checked_at: CheckedAt,
                   selector: Selector | None = None) -> RawPullResult:
    """:func:`read_queue` giving the checked record bytes instead of decoded records, for the compiled
    codec's response encoder (mqstore.codec): the same messages, next offset and errors."""
    taken, next_offset = _collect(cq, offset, max_messages, max_bytes, tags, tag_code, checked_at, _raw_tags,
                                  selector, _raw_properties)
    return RawPullResult([data for data, _ in taken], next_offset, cq.min_offset, cq.max_offset)


def _raw_tags(data: bytes) -> str:
    return RecordView(data, 0).property(record.PROPERTY_TAGS) or ""


def _raw_properties(data: bytes) -> dict[str, str]:
    return RecordView(data, 0).properties  # the properties' bytes only: the body is not copied or decoded


def _collect(cq: ConsumeQueue, offset: int, max_messages: int, max_bytes: int, tags: Sequence[str],
             tag_code: Callable[[str], int], read_at: Callable[[int, int, int], Any],
             tags_of: Callable[[Any], str], selector: Selector | None = None,
             properties_of: Callable[[Any], Mapping[str, str]] | None = None) -> tuple[list[tuple[Any, int]], int]:
    """The walk of :func:`read_queue`: ([(what ``read_at`` gave, physical offset)], next offset)."""
    wanted_tags = set(tags)
    # An SQL92 filter that requires some tags skips the others by their tag code too (the filter itself then
    # decides, hash collisions included); tags given with it are checked as a tag filter.
    required = selector.required_tags if selector is not None and not wanted_tags else None
    wanted_codes = {tag_code(t) for t in (wanted_tags or required or ())}
    taken: list[tuple[Any, int]] = []
    taken_bytes = 0
    next_offset = offset
    try:
        while len(taken) < max_messages and next_offset < cq.max_offset:
            for phys, size, code in cq.entries(next_offset, max_messages - len(taken)):
                if taken and taken_bytes + size > max_bytes:
                    return taken, next_offset
                if wanted_codes and code not in wanted_codes:
                    next_offset += 1
                    continue
                try:
                    rec = read_at(phys, size, next_offset)
                except DataLoss:
                    if taken:  # serve the good ones; the next Pull starts at the bad one
                        return taken, next_offset
                    raise
                next_offset += 1
                if wanted_tags and tags_of(rec) not in wanted_tags:
                    continue
                if selector is not None and not selector.matches(properties_of(rec)):
                    continue
                taken.append((rec, phys))
                taken_bytes += size
    except SegmentClosed:
        if next_offset < cq.min_offset:
            raise OutOfRange(f"offset {next_offset} of {cq.topic}/{cq.queue_id} was removed by retention; "
                             f"the queue now starts at {cq.min_offset}", min_value=cq.min_offset,
                             max_value=cq.max_offset) from None
        raise
    return taken, next_offset


class LongPolls:
    """Pulls that wait for the next message of a queue, at most ``max_waiters`` at once: a long poll
    holds a server thread while it waits, so beyond that it answers at once (the caller sees no
    messages and polls again), and waiting consumers never take every thread and starve producers."""

    def __init__(self, max_waiters: int, visible: threading.Condition, clock):
        self._slots = threading.BoundedSemaphore(max_waiters)
        self._visible = visible
        self._clock = clock

    def wait(self, get_queue: Callable[[], ConsumeQueue | None], offset: int, wait_ms: int,
             running: Callable[[], bool]) -> ConsumeQueue | None:
        """The queue once it holds a message at ``offset``, or after ``wait_ms`` (None: no queue yet)."""
        def arrived() -> bool:
            cq = get_queue()
            return cq is not None and cq.max_offset > offset
        self.wait_for(arrived, wait_ms, running)
        return get_queue()

    def wait_for(self, ready: Callable[[], bool], wait_ms: int, running: Callable[[], bool]) -> bool:
        """Until ``ready()`` (checked after each dispatch round), ``wait_ms`` passed or not ``running()``;
        at once when every slot is taken. Returns ``ready()``'s last value."""
        if not self._slots.acquire(blocking=False):
            return ready()
        try:
            deadline = self._clock.monotonic_s() + wait_ms / 1000
            with waits.waiting(), self._visible:  # a long poll: its handler thread does not count while it waits
                while True:
                    if ready():
                        return True
                    left = deadline - self._clock.monotonic_s()
                    if left <= 0 or not running():
                        return False
                    self._visible.wait(min(left, 0.5))
        finally:
            self._slots.release()
