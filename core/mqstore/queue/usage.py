"""How many bytes of the commit log each topic holds: the sizes of its live consume queue entries.

The commit log is one log for every topic, so "bytes on disk per topic" is the sum of the record sizes
(the consume queue entry's size field) of the topic's messages between each queue's min and max
offset: what retention will free when it removes them. Summing millions of 20-byte entries at every
scrape would cost seconds, so the sums are kept per consume queue file and extended from where the last
scrape stopped: a scrape reads only the entries written since the previous one (and, once after
retention moved a queue's minimum, the head of its first file).

Read without the dispatcher's lock (reads below ``max_offset`` are lock-free: consume_queue.py); a file
that retention removes during a scrape ends that queue's sum for this scrape (``cut`` is counted) and
the next scrape starts over from the files that remain.

Thread-safety: ``bytes_by_topic`` is called by the metrics collector, one scrape at a time (``_lock``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog

from mqstore.format import cq_unit
from mqstore.log.segment import SegmentClosed

log = structlog.get_logger("mqstore.queue.usage")
ENTRY = cq_unit.ENTRY_SIZE


@dataclass(slots=True)
class _FileSum:
    start_offset: int      # queue offset of the file's first entry
    scanned_to: int        # entries [start_offset, scanned_to) are summed into `total`
    total: int
    head_to: int = -1      # entries [start_offset, head_to) are summed into `head`
    head: int = 0


def _sum(buf, first: int, end: int) -> int:
    """Record sizes of the entries at entry positions [first, end) of a file's buffer."""
    total = 0
    for _, size, _ in cq_unit.ENTRY.iter_unpack(bytes(buf[first * ENTRY:end * ENTRY])):
        if size != cq_unit.BLANK_SIZE_FIELD:
            total += size
    return total


class TopicUsage:
    """Live record bytes per topic, from a store's consume queues (mqstore.queue.dispatch.QueueTable)."""

    def __init__(self, queues):
        self._queues = queues
        self._files: dict[tuple[str, int, int], _FileSum] = {}
        self._lock = threading.Lock()
        self.cut = 0  # scrapes of a queue ended by a file removed under them

    def bytes_by_topic(self) -> dict[tuple[str], int]:
        with self._lock:
            out: dict[tuple[str], int] = {}
            seen: set[tuple[str, int, int]] = set()
            for (topic, queue_id), cq in list(self._queues.queues.items()):
                try:
                    out[(topic,)] = out.get((topic,), 0) + self._queue_bytes(topic, queue_id, cq, seen)
                except (SegmentClosed, ValueError, IndexError):  # retention removed a file while we read it
                    self.cut += 1
                    out.setdefault((topic,), 0)
            for key in set(self._files) - seen:
                del self._files[key]
            return out

    def _queue_bytes(self, topic: str, queue_id: int, cq, seen: set) -> int:
        low, high = cq.min_offset, cq.max_offset
        total = 0
        per_file = cq.entries_per_file
        for seg in list(cq.files.segments):
            first = seg.start // ENTRY
            lo, hi = max(low, first), min(high, first + per_file)
            if lo >= hi:
                continue
            key = (topic, queue_id, first)
            seen.add(key)
            total += self._file_bytes(self._files.setdefault(key, _FileSum(first, first, 0)), seg.buffer, lo, hi)
        return total

    @staticmethod
    def _file_bytes(state: _FileSum, buf, lo: int, hi: int) -> int:
        first = state.start_offset
        if hi < state.scanned_to:  # entries cut (the queue was brought back to the log's end)
            state.total -= _sum(buf, hi - first, state.scanned_to - first)
            state.scanned_to = hi
        if hi > state.scanned_to:
            state.total += _sum(buf, state.scanned_to - first, hi - first)
            state.scanned_to = hi
        if lo == first:
            head = 0
        else:
            if state.head_to != lo:
                state.head, state.head_to = _sum(buf, 0, lo - first), lo
            head = state.head
        return state.total - head
