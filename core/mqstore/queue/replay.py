"""The consume-queue rebuild of one segment range from the compiled walk's runs (mqstore.codec).

The compiled walk (codec _replay.replay_runs) turns a segment's records into runs of consecutive
queue offsets per (topic, queue id), entries already packed; :class:`SegmentRuns` applies them with
the rules of the reference loop, Dispatcher._replay_segment_python, which takes one record at a time:

- a queue is considered only if its topic is in ``starts`` (when given), the queue is in ``only``
  (when given) and not in ``behind``; of a run, only the entries at or above the topic's start
  physical offset are taken (those below belong to a deleted topic of the same name);
- its next offset is what this segment already took for it, else the consume queue's max offset;
- an entry below the next offset is there already: it is dropped (a run that starts below is trimmed);
- an entry above it is a gap: with ``behind`` given, the queue is added to ``behind`` and gets no more
  entries from this segment (its pending run is dropped: the caller rebuilds it from the log's start);
  without ``behind``, the run is written where it says (ConsumeQueue fills the gap with blanks);
- consecutive entries are written together, one put_packed per run, when the next run leaves a gap
  and at the end of the segment.

These are the reference's rules per record, grouped: within a run the offsets are consecutive, so
only a run's first entry can open a gap, and trimming a run's front drops exactly the entries the
reference drops one by one. The queues' files come out byte for byte the same
(tests/property/test_codec_replay.py).

Thread-safety: the caller holds the dispatcher's lock (it writes consume queues).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqstore.format import cq_unit, record, record_scan

ENTRY = cq_unit.ENTRY_SIZE


@dataclass(slots=True)
class _Pending:
    """Entries taken for one queue and not written yet: consecutive offsets from ``first``."""

    first: int
    pieces: list = field(default_factory=list)  # bytes in cq_unit format, in offset order
    count: int = 0
    physical_end: int = 0


class SegmentRuns:
    """The state of one segment's replay: the next offset per queue, the runs not written yet."""

    def __init__(self, queues, starts, only, behind):
        self.queues = queues
        self.starts = starts
        self.only = only
        self.behind = behind
        self.expect: dict[tuple[str, int], int] = {}
        self.pending: dict[tuple[str, int], _Pending] = {}
        self._starts: dict[str, int | None] = {}

    def admits(self, key: tuple[str, int]) -> bool:
        return ((self.starts is None or self.start_of(key[0]) is not None) and (self.only is None or key in self.only)
                and key not in (self.behind or ()))

    def start_of(self, topic: str) -> int | None:
        """``starts``' start of the topic (None: not a topic now), looked up once a segment."""
        try:
            return self._starts[topic]
        except KeyError:
            found = self._starts[topic] = self.starts.get(topic)
            return found

    def take(self, key: tuple[str, int], first: int, data: bytes, physical_end: int) -> None:
        """Entries for offsets [first, first + len(data) // ENTRY) of an admitted queue."""
        if self.starts is not None:
            below = _count_below(data, self.start_of(key[0]))
            if below:  # records of a deleted topic of the same name: not this topic's
                if below * ENTRY == len(data):
                    return
                data, first = data[below * ENTRY:], first + below
        nxt = self.expect.get(key)
        if nxt is None:
            cq = self.queues.get(*key)
            nxt = cq.max_offset if cq else 0
        if first > nxt and self.behind is not None:
            self.behind.add(key)  # missing or behind: rebuilt from the log's start afterwards
            self.pending.pop(key, None)
            return
        count = len(data) // ENTRY
        if first + count <= nxt:
            return
        if first < nxt:  # a repeat: the entries from nxt on are new
            data, count, first = data[(nxt - first) * ENTRY:], first + count - nxt, nxt
        pending = self.pending.get(key)
        if pending is None and self.behind is None:
            # Nothing of this queue waits: write now. Without ``behind`` every pending run is written in
            # the end, so this writes the same entries as a pending run would (put_packed is idempotent by
            # offset, and the next run of the queue, if any, starts a pending one after these).
            self.queues.get_or_create(*key).put_packed(first, data, physical_end)
            self.expect[key] = first + count
            return
        if pending is None or pending.first + pending.count != first:
            if pending is not None:
                self._write(key, pending)
            pending = self.pending[key] = _Pending(first)
        pending.pieces.append(data)
        pending.count += count
        pending.physical_end = physical_end
        self.expect[key] = first + count

    def finish(self) -> None:
        """Write the runs still pending (none of a queue that fell behind)."""
        for key, pending in self.pending.items():
            self._write(key, pending)
        self.pending.clear()

    def _write(self, key: tuple[str, int], pending: _Pending) -> None:
        data = pending.pieces[0] if len(pending.pieces) == 1 else b"".join(pending.pieces)
        self.queues.get_or_create(*key).put_packed(pending.first, data, pending.physical_end)


def _count_below(data: bytes, start: int) -> int:
    """How many of the packed entries (in log order) point below physical offset ``start``."""
    if not data or cq_unit.decode(data, 0)[0] >= start:
        return 0  # the usual case: a run of the topic as it is now
    lo, hi = 0, len(data) // ENTRY
    while lo < hi:
        mid = (lo + hi) // 2
        if cq_unit.decode(data, mid * ENTRY)[0] < start:
            lo = mid + 1
        else:
            hi = mid
    return lo


def replay_compiled(runs_of, queues, tag_code, seg, position: int, end: int, starts, only,
                    behind) -> tuple[int, int] | None:
    """Dispatcher._replay_segment on the compiled walk ``runs_of``: (records walked, store time of the
    last one, or None when there was none); None when two different topic byte strings decode to the
    same name (not valid UTF-8: they would share a queue, in an order the runs do not keep), for the
    caller to replay with the reference."""
    groups, stop, blank, count, last_ts = runs_of(seg.buffer, position, end, seg.start)
    named = []
    names: dict[str, bytes] = {}
    for topic_bytes, queue_id, runs in groups:
        topic = topic_bytes.decode("utf-8", "replace")
        if names.setdefault(topic, topic_bytes) != topic_bytes:
            return None
        named.append(((topic, queue_id), runs))
    state = SegmentRuns(queues, starts, only, behind)
    if behind is None:
        named = _write_single_runs(state, named, seg.start + position)
    for key, runs in named:
        for first, data, physical_end in runs:
            if not state.admits(key):
                break
            state.take(key, first, data, physical_end)
    if stop < end and not blank:  # a record the walk does not take on: the reference goes on from it
        count, last_ts = _reference_rest(state, tag_code, seg, stop, end, count, last_ts)
    state.finish()
    return count, last_ts if count else None


def _write_single_runs(state: SegmentRuns, named: list, walked_from: int) -> list:
    """Without ``behind``, the usual round (a replica's, the append path's catch-up): each admitted queue
    with one run whose records all lie at or above its topic's start (``walked_from``, where the walk
    began, is) gets it written here, by ConsumeQueue.put_packed directly; the rest is returned for
    :meth:`SegmentRuns.take`. The same writes as take makes: without ``behind`` a queue's first run is
    written at once (put_packed drops what the queue holds already and fills a gap with blanks, as take
    would have), and a queue appears in one group only (the caller refused names that collide), so no
    later run of it is pending. Takes no other state: the queue's max offset afterwards is what take
    would have put in ``expect`` for the reference records after the walk's stop (_reference_rest)."""
    starts, only, queues = state.starts, state.only, state.queues
    tables = queues.queues
    rest = []
    for key, runs in named:
        if len(runs) != 1 or (only is not None and key not in only):
            rest.append((key, runs))
            continue
        if starts is not None:
            start = state.start_of(key[0])
            if start is None:
                continue  # not a topic now: no entry (take would not be reached: admits says no)
            if start > walked_from:
                rest.append((key, runs))  # some records may be an earlier topic's of the name: take trims them
                continue
        first, data, physical_end = runs[0]
        cq = tables.get(key)
        if cq is None:
            if first + len(data) // ENTRY <= 0:
                continue  # entries of negative offsets only (below a new queue's 0): take makes no queue
            cq = queues.get_or_create(*key)
        cq.put_packed(first, data, physical_end)
    return rest


def _reference_rest(state: SegmentRuns, tag_code, seg, position: int, end: int, count: int,
                    last_ts: int) -> tuple[int, int]:
    """The reference's loop (one record at a time) from ``position``, on the same state."""
    for size, topic_bytes, qid, qoff, flag, tags, store_ts in record_scan._routing_records_python(
            seg.buffer, position, end):
        key = (topic_bytes.decode("utf-8", "replace"), qid)
        if record.takes_queue_offset(flag) and state.admits(key):
            physical = seg.start + position
            state.take(key, qoff, cq_unit.encode(physical, size, tag_code(tags)), physical + size)
        last_ts = store_ts
        position += size
        count += 1
    return count, last_ts
