"""The timer's delivered copies of a run of due units, made in one pass over their timer records' bytes: the
pure-Python reference of the compiled codec's ``timer_copy_run`` (mqstore.codec's ``_records``), which must give
the same copies byte for byte (tests/property/test_codec_timer_delivery.py). mqstore.timer.timer calls
:func:`copies`, which takes the compiled one when built.

* :func:`copy_run`: from entry ``index`` of ``physicals`` (the log offsets of timer records; ``offsets`` their
  units' queue offsets), while each lies in the segment buffer ``buf`` (log offsets ``seg_start``..``seg_end``),
  each record checked as Timer._records checks it for its view (whole, its CRC, naming its own offset, between
  the log's ``low`` and ``visible`` ends, and here also of the timer topic ``timer_topic`` from its start
  ``owned_from``), and its copy made as messages.delivered_copy makes it: ``(real topic, origin, Copy)`` appended to
  ``out`` for each, or None where anything is not so (no such record, properties without a UNIQ_KEY or unusual:
  the compiled one declines more than this one, never less); the caller makes None's unit the reference way
  (the record looked up, decoded where needed). Returns the index of the first entry not in the segment.
* :func:`copies`: :func:`copy_run` over a batch of units, one segment lookup per run of records in one segment.
* :class:`DueUnits`: the read slot's units by due time, a step's due ones taken as one slice where it can.
* :func:`lookup`: one record, checked as the store's GetMessage checks it (the reference way's, for a unit whose
  copy :func:`copies` did not make).

Thread-safety: stateless.
"""

from __future__ import annotations

import bisect
import heapq

from mqstore import codec
from mqstore.errors import TopicNotFound
from mqstore.format import record_reader
from mqstore.format.record_reader import RecordError, RecordView
from mqstore.format.timer_unit import KIND_DELIVER
from mqstore.model import Copy
from mqstore.timer import messages as tm

_TIMER_TOPIC_BYTES = tm.TIMER_TOPIC.encode("utf-8")


def copy_run(buf, seg_start: int, seg_end: int, low: int, visible: int, timer_topic: bytes, owned_from: int,
             physicals: list, offsets: list, index: int, now_ms: int, copy_type, out: list) -> int:
    """The copies of the run from ``index`` (the module's docstring)."""
    if len(offsets) != len(physicals) or index < 0:
        raise ValueError("physicals and offsets differ in length, or index is negative")
    while index < len(physicals):
        physical = physicals[index]
        if not seg_start <= physical < seg_end:
            break
        out.append(_copy_at(buf, physical - seg_start, physical, low, visible, timer_topic, owned_from,
                            offsets[index], now_ms, copy_type))
        index += 1
    return index


def _copy_at(buf, position: int, physical: int, low: int, visible: int, timer_topic: bytes, owned_from: int,
             timer_offset: int, now_ms: int, copy_type) -> tuple | None:
    if not low <= physical < visible or position < 0:
        return None
    try:
        record_reader.check(buf, position, len(buf), physical_offset=physical)
    except RecordError:
        return None
    if record_reader.is_blank(buf, position):
        return None
    view = RecordView(buf, position)
    if physical + view.size > visible or physical < owned_from or view.topic_bytes != timer_topic:
        return None
    try:
        props = view.properties
        origin = int(props.get(tm.ORIGIN, timer_offset))
        made = tm.delivered_copy(view, props, timer_offset, now_ms)
    except (KeyError, ValueError, UnicodeDecodeError):  # not a timer record as the timer writes them
        return None
    if made is None:
        return None
    real, copy = made
    return real, origin, copy_type(copy.body, copy.body_crc, copy.properties, copy.tags, copy.uniq_key, copy.flag,
                                   copy.born_timestamp_ms, copy.born_host, copy.born_port, copy.queue_id,
                                   copy.sharding_key)


_copy_run = codec.compiled.timer_copy_run if codec.compiled is not None else copy_run


def copies(store, units: list, now_ms: int) -> list[tuple | None]:
    """:func:`copy_run` of each deliver unit of ``units`` (a roll unit: None), in order, the records' segments
    looked up once per run of records in one segment."""
    physicals = [unit.physical_offset for unit in units]
    offsets = [unit.timer_offset for unit in units]
    commitlog = store.commitlog
    low, visible = commitlog.min_offset, store.visible_offset()
    try:
        owned_from = store.topics.get(tm.TIMER_TOPIC).start_physical_offset
    except TopicNotFound:
        return [None] * len(units)
    out: list[tuple | None] = []
    index, count = 0, len(units)
    while index < count:
        physical = physicals[index]
        try:
            if not low <= physical < visible:
                raise LookupError(physical)
            seg = commitlog.segments.find(physical)
            index = _copy_run(seg.buffer, seg.start, seg.end, low, visible, _TIMER_TOPIC_BYTES, owned_from,
                              physicals, offsets, index, now_ms, Copy, out)
        except Exception:  # noqa: BLE001 (gone, or its segment deleted meanwhile: the reference way says why)
            del out[index:]
            out.append(None)
            index += 1
    for at, unit in enumerate(units):
        if unit.kind != KIND_DELIVER:
            out[at] = None
    return out


def lookup(store, physical: int) -> tuple[RecordView | record_reader.Record | None, str]:
    """(the record at ``physical``, or None and why), the reference way's (Timer._made): the store's GetMessage
    checks (the record whole and below the visible end, its CRC, that it names its own offset, its topic live) on a
    view of it in the segment's mapping; where that path does not serve, get_messages, which says why (a decoded
    Record then)."""
    try:
        commitlog = store.commitlog
        visible = store.visible_offset()
        if not commitlog.min_offset <= physical < visible:
            raise LookupError(physical)
        seg = commitlog.segments.find(physical)
        buf, position = seg.buffer, physical - seg.start
        record_reader.check(buf, position, len(buf), physical_offset=physical)
        if record_reader.is_blank(buf, position):
            raise LookupError(physical)
        view = RecordView(buf, position)
        if physical + view.size > visible or not store.topics.owns(view.topic, physical):
            raise LookupError(physical)
        return view, ""
    except Exception:  # noqa: BLE001 (the store's own lookup answers, with its reason)
        found = store.get_messages([physical])[0]
        return (found.message.record if found.message is not None else None), found.missing


def _due_of(entry: tuple) -> int:
    return entry[0]


class DueUnits:
    """The read slot's units not delivered yet, in the order they are due (a roll first: it is due at the slot; ties
    by timer offset): a heap of (due, timer offset, Unit), kept as a sorted list while only a load and pops changed
    it (a sorted list is a heap), so that a step's due units are one slice of it, not a heap pop each (about 1.5 us
    a unit in a slot of thousands). Timer._dequeue's; not thread-safe (the timer's duty owns it)."""

    __slots__ = ("_heap", "_sorted")

    def __init__(self):
        self._heap: list[tuple] = []
        self._sorted = True

    def __len__(self) -> int:
        return len(self._heap)

    def take(self, units) -> None:
        """Add ``units``: a load (more than held: a slot read) sorted in once, a few pushed onto the heap."""
        entries = [(unit.deliver_ms if unit.kind == KIND_DELIVER else 0, unit.timer_offset, unit) for unit in units]
        heap = self._heap
        if len(entries) > len(heap):
            heap.extend(entries)
            heap.sort()
            self._sorted = True
        elif entries:
            for entry in entries:
                heapq.heappush(heap, entry)
            self._sorted = False

    def first_due(self) -> int:
        """When the first unit is due (there must be one)."""
        return self._heap[0][0]

    def pop_due(self, now_ms: int, limit: int) -> list:
        """The units due at ``now_ms``, at most ``limit``, taken out in order."""
        heap = self._heap
        if self._sorted:
            count = bisect.bisect_right(heap, now_ms, hi=min(len(heap), limit), key=_due_of)
            due = [entry[2] for entry in heap[:count]]
            del heap[:count]
            return due
        due = []
        while heap and heap[0][0] <= now_ms and len(due) < limit:
            due.append(heapq.heappop(heap)[2])
        return due
