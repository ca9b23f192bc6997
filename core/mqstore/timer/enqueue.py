"""The timer's enqueue (mqstore.timer.timer has the design): the timer topic's records read from the enqueue offset
into units of the wheel, and the notes of the delayed batches the Scheduler appended (:meth:`Enqueue.note`), which
spare the enqueue reading those records back.

Thread-safety: as the Timer's (its duty owns it), but :meth:`Enqueue.note` runs on the appending thread: the notes
(``_notes``, ``_noted``) are read and changed under ``_notes_lock``.
"""

from __future__ import annotations

import threading

import structlog

from mqstore import codec
from mqstore.errors import invariant
from mqstore.format import cq_unit, record_reader
from mqstore.format.timer_unit import KIND_DELIVER, KIND_ROLL, Unit
from mqstore.timer import messages as tm
from mqstore.timer import runs
from mqstore.timer.config import TimerConfig
from mqstore.timer.dequeue import Dequeue
from mqstore.timer.files import TimerFiles
from mqstore.timer.state import TimerPart, TimerState, TimerStats, topic_bounds

log = structlog.get_logger("mqstore.timer")

# Timer records read per step at most: a step costs ~45 us besides its records (0.09 us a record at 512, a third of
# the enqueue's CPU once its records' work was in C); WAKE_RECORDS (mqstore.timer.scheduling) wakes it as often.
READ_BATCH = 4096
MAX_NOTES = 200_000     # noted records kept for the enqueue (about 30 MB at most; beyond, records are read)
REALIGN_MAX_NOTES = 64  # notes (batches) up to which each read of the enqueue realigns them (Timer._realign_notes)
# The noted records' header check and units, a note's physical offsets (mqstore.timer.runs: the references)
_noted_units = codec.compiled.timer_noted_units if codec.compiled is not None else runs.noted_units
_note_physicals = codec.compiled.timer_note_physicals if codec.compiled is not None else runs.note_physicals


class _NotedRun:
    """A run of noted records' units (runs.noted_units: pre-units), the enqueue offset after it, its deliver units'
    count."""

    __slots__ = ("units", "upto", "scheduled")

    def __init__(self, units: bytearray, upto: int, scheduled: int):
        self.units, self.upto, self.scheduled = units, upto, scheduled


class Enqueue(TimerPart):
    """The Timer's enqueue and notes, a part :class:`mqstore.timer.timer.Timer` builds. It owns the notes
    (``_notes``, ``_noted``, ``_notes_lock``); in the shared ``state`` it moves ``enqueue_offset``, adds
    ``cancels`` and sets ``caught_up_at``, and reads ``read_ms``, ``cp_read`` (the horizon) and ``rolled``
    (Recovery's scan); it adds units to the files and those of the read slot to ``dequeue``'s due units
    (Dequeue._take), and counts ``stats``' scheduled and pending."""

    def __init__(self, store, config: TimerConfig, files: TimerFiles, state: TimerState, stats: TimerStats,
                 metrics, dequeue: Dequeue):
        super().__init__(store, config, files, state, stats)
        self.metrics = metrics
        self.dequeue = dequeue
        # queue offset -> (a batch's physical offsets, due times, store ms, the index of that offset's): note()
        self._notes: dict[int, tuple[object, list[int], int, int]] = {}  # object: an array of int64
        self._noted = 0  # records noted and not taken yet (at most MAX_NOTES)
        self._notes_lock = threading.Lock()

    def _enqueue(self) -> bool:
        """Units for the topic's records from the enqueue offset (a bounded read); whether it caught up."""
        low, high = topic_bounds(self.store)
        if self.state.enqueue_offset < low:
            log.error("timer.records_lost", enqueue_offset=self.state.enqueue_offset, topic_min=low,
                      why="the timer topic's retention removed records the timer had not read")
            self.state.enqueue_offset = low
        if self.state.enqueue_offset >= high:
            if self.state.caught_up_at is None:
                self.state.caught_up_at = self.state.read_ms
            return True
        # The wheel's live slots are those from the checkpoint's read slot (where a restart resumes) on: a unit
        # placed further would share its file slot with one a restart still has to read.
        horizon = self.state.cp_read + self.config.span_ms - 2 * self.precision
        scheduled = self.stats.scheduled
        found = self._timer_records(self.state.enqueue_offset, min(READ_BATCH, high - self.state.enqueue_offset),
                                    horizon)
        # The units go to the files in one write per batch (TimerFiles.add_many), flushed before a cancel (which
        # names an earlier unit) and at the end; the enqueue offset moves past what the files hold. They are
        # pre-units (mqstore.timer.runs) until then: no Python object a unit.
        units = bytearray()
        upto = self.state.enqueue_offset
        for item in found:
            if type(item) is _NotedRun:  # noted records' units made already (runs.noted_units)
                if units:
                    units += item.units
                else:
                    units = item.units  # the common case, one run: taken, not copied
                upto = item.upto
                continue
            queue_offset, physical, props, due = item
            if props is not None and tm.CANCEL_OFFSET in props:
                self._flush(units, upto)
                units = bytearray()
            self._add(queue_offset, physical, props, due, units, horizon)
            upto = queue_offset + 1
        self._flush(units, upto)
        if self.metrics and self.stats.scheduled > scheduled:
            self.metrics.scheduled.inc(self.stats.scheduled - scheduled)
        return self.state.enqueue_offset >= high

    def note(self, results, dues: list[int]) -> None:
        """A delayed batch the Scheduler appended to the timer topic (its AppendResults and due times), from the
        appending thread: the enqueue takes a noted record's unit from here instead of reading it back, once it
        finds the record in the log where the note says (:meth:`_timer_records`). One note a batch, under the
        queue offset of its first record not read yet: its physical offsets as an array (the results' tuples
        are not kept: objects the garbage collector tracks, one a record, which made it run every few batches),
        its due times, its store time; at most MAX_NOTES records are noted (beyond, the records are read); the
        notes go with this Timer (a new leadership starts without)."""
        entries = results.entries
        count = len(entries)
        if count != len(dues):
            raise ValueError(f"{len(dues)} due times for {count} records")
        if not count:
            return
        first = entries[0][3]
        at = self.state.enqueue_offset - first  # a batch's queue offsets are consecutive: those below, read already
        if at > 0:
            if at >= count:
                return
            dues, count, first = dues[at:], count - at, first + at
        else:
            at = 0
        if type(dues) is not list:
            dues = list(dues)
        physicals = _note_physicals(entries, at)
        with self._notes_lock:
            if self._noted + count > MAX_NOTES:
                return
            self._notes[first] = (physicals, dues, results.store_timestamp_ms, 0)
            self._noted += count

    def _drop_old_notes(self) -> None:
        """Notes of records the enqueue read otherwise, at a checkpoint (:meth:`_realign_notes`)."""
        with self._notes_lock:
            self._realign_notes(self.state.enqueue_offset)

    def _realign_notes(self, offset: int) -> None:
        """Under the notes' lock: a note under a queue offset below ``offset`` (its first records read from the log:
        it came while the enqueue read them, or its record was not as noted) moved to ``offset`` if its batch
        reaches it, else dropped; the count of noted records made again."""
        notes = self._notes
        if notes and min(notes) < offset:  # min: far cheaper than the rebuild
            kept = {}
            for key, (physicals, dues, stamp, at) in notes.items():
                if key >= offset:
                    kept[key] = (physicals, dues, stamp, at)
                elif at + offset - key < len(physicals):
                    kept[offset] = (physicals, dues, stamp, at + offset - key)
            notes.clear()  # in place: a walk holds the dict
            notes.update(kept)
            self._noted = sum(len(n[0]) - n[3] for n in notes.values())

    def _timer_records(self, offset: int, count: int, horizon: int) -> list:
        """What the enqueue needs of the timer topic's records from ``offset``: (queue offset, physical offset,
        properties, due) of each record read from the log, and each run of noted records (:meth:`note`) whose
        headers name their queue offset, physical offset and noted store time as one _NotedRun of their units
        (runs.noted_units, with ``horizon`` as :meth:`_add`'s). Each record is found by its consume queue entry;
        one that is not noted, or not as noted, comes with its properties read from the log (its framing
        checked, its body not read: the delivery reads it, CRC checked) and due -1. Anything this does not read
        (a record that fails its checks, a segment gone) is read by the store's Pull instead, which raises what
        it finds as before."""
        notes, lock = self._notes, self._notes_lock
        if notes and offset not in notes and len(notes) <= REALIGN_MAX_NOTES:  # bounded: the checkpoint's does all
            with lock:
                self._realign_notes(offset)
        try:
            cq, segments = self.store.queues.get(tm.TIMER_TOPIC, 0), self.store.commitlog.segments
            found: list = []
            seg_start = seg_end = 0  # the segment of the record before (a batch's records share one): found once
            buf = None
            entries = cq.entry_bytes(offset, count)  # their bytes: the noted runs read them in C
            index, total = 0, len(entries) // cq_unit.ENTRY_SIZE
            read_ms, precision, rolled = self.state.read_ms, self.precision, self.state.rolled
            while index < total:
                physical, size, _ = cq_unit.decode(entries, index * cq_unit.ENTRY_SIZE)
                if not seg_start <= physical < seg_end:
                    seg = segments.find(physical)
                    buf, seg_start, seg_end = seg.buffer, seg.start, seg.end
                if notes:  # the run of noted records from here whose headers match their notes
                    units = bytearray()
                    with lock:  # the notes it takes are removed (a note not taken goes at the next checkpoint)
                        reached, scheduled = _noted_units(buf, seg_start, seg_end, entries, index, offset, notes,
                                                          read_ms, horizon, precision, rolled, units)
                        self._noted -= reached - index
                    if reached > index:
                        found.append(_NotedRun(units, offset + reached, scheduled))
                        index = reached
                        continue
                position = physical - seg_start
                record_reader.check(buf, position, position + size, verify_crc=False, physical_offset=physical)
                found.append((offset + index, physical, record_reader.RecordView(buf, position).properties, -1))
                index += 1
        except Exception:  # noqa: BLE001 (the Pull below reads the same records with the store's checks)
            with lock:  # a note taken out by a walk that raised is gone: count what is left
                self._noted = sum(len(n[0]) - n[3] for n in notes.values())
            pulled = self.store.pull(tm.TIMER_TOPIC, 0, offset, count, 8 << 20).messages
            return [(m.record.queue_offset, m.record.physical_offset, m.record.properties, -1) for m in pulled]
        # A run's units count as Timer._add's do (after the walk: the Pull above starts over without them)
        for item in found:
            if type(item) is _NotedRun:
                made = len(item.units) // runs.PRE_UNIT.size
                if made > item.scheduled:
                    invariant(horizon > read_ms, "the timer checkpoint follows the read slot within half the wheel")
                self.stats.scheduled += item.scheduled
                self.stats.pending += made
        return found

    def _flush(self, units: bytearray, upto: int) -> None:
        """The units gathered by :meth:`_add` (pre-units) into the files (and the read slot's into its heap); the
        enqueue offset to ``upto``."""
        touched = self.files.add_many(units)
        self.state.enqueue_offset = upto
        # else no unit is the read slot's: no pass
        if self.dequeue._current is not None and self.state.read_ms in touched:
            read_ms = self.state.read_ms
            self.dequeue._take([Unit(due, slot, offset, physical, -1, kind)
                                for slot, due, offset, physical, kind in runs.PRE_UNIT.iter_unpack(units)
                                if slot == read_ms])

    def _add(self, queue_offset: int, physical: int, props: dict[str, str] | None, due: int, units: bytearray,
             horizon: int) -> None:
        """The unit of a timer record, appended to ``units`` as a pre-unit (a cancel marker goes to the files at
        once); ``props`` None: a noted delayed record (:meth:`note`), due at ``due``; ``horizon``: the first slot a
        unit may not take (it rolls there instead)."""
        if queue_offset in self.state.rolled:
            return  # re-appended already (a rebuild reads the topic from its start): its successor carries it
        if props is not None:
            if tm.CANCEL_OFFSET in props:
                origin, due = int(props[tm.CANCEL_OFFSET]), int(props[tm.OUT_MS])
                self.files.add_cancel(origin, due, queue_offset)
                self.state.cancels[origin] = due
                return
            if tm.OUT_MS not in props or tm.REAL_TOPIC not in props:
                log.error("timer.record_not_timer", queue_offset=queue_offset)
                return
            due = int(props[tm.OUT_MS])
        slot = due - due % self.precision
        if slot < self.state.read_ms:
            slot = self.state.read_ms
        if slot >= horizon:
            invariant(horizon > self.state.read_ms, "the timer checkpoint follows the read slot within half the wheel")
            units += runs.PRE_UNIT.pack(horizon, due, queue_offset, physical, KIND_ROLL)
        else:
            units += runs.PRE_UNIT.pack(slot, due, queue_offset, physical, KIND_DELIVER)
            self.stats.scheduled += 1
        self.stats.pending += 1
