"""The timer: delayed messages wait in the timer topic and are delivered at their time as new appends to their
real topic (issue 35; RocketMQ's RIP-43 in mqstore's shape, with its known failures fixed).

* **Enqueue**: the timer reads the timer topic's queue 0 from its enqueue offset and adds a unit per record to
  the wheel (mqstore.timer.files) in the slot of its due time, or of the slot being read if that time has
  passed. A due time at or past the wheel's span (from the slot being read) is parked as a *roll* unit near the
  span's end: when that slot is read the record is appended to the timer topic again and waits another turn,
  so a delay of any length fits a wheel of fixed size. A cancel marker adds a cancel unit to its target's slot.
  A batch's units go to the files in one write (TimerFiles.add_many). A record the Scheduler appended on this
  leadership was *noted* (:meth:`Timer.note`: its offsets, due time and store time) and is not read back once its
  header matches the note; any other record's properties are read from the log.
* **Dequeue**: the slot being read (``read_ms``) is loaded once the clock reaches it; its units are delivered
  one by one once the clock reaches each one's own due time (never early, and not a precision late either:
  lateness is the duty's pause and the append), cancelled units dropped; the slot is done when it is empty and
  the clock has passed its end, then ``read_ms`` moves one precision on. Slots are read only while the enqueue
  has caught up with the topic, so no record is overtaken by the wheel.
* **Idempotence** (RocketMQ re-delivers every slot since its last checkpoint: #6984, #11047): a copy carries
  TIMER_UNIT (the timer record's queue offset), a rolled record TIMER_ROLLED_FROM. The checkpoint keeps, with
  ``read_ms``, the commit log's end when that slot was reached (``read_log_end``): every delivery of a later
  slot lies above it. At open the timer reads the log from there and skips the units it finds done.
* **Downtime longer than the wheel** (RocketMQ skips those messages): ``read_ms`` is the checkpoint's, however
  old; the slots from there are read in turn (each slot time is stored in the slot, so a slot of an earlier
  turn reads as empty), and once a whole span has been read with nothing left the timer jumps to now.
* **Failed appends** are retried with back-off by the duty (mqstore.background), never dropped (#7927); they are
  counted (``mqstore_timer_delivery_failures_total``) and the duty's state names the last error. A copy whose
  real topic was deleted is dropped with a log line and counted (there is nowhere to deliver it).
* **Retention floor** (RocketMQ's retention deletes timer records before their turn): :attr:`Timer.retention_floor`
  is the lowest log offset the timer still needs: the oldest unit not delivered or rolled yet (its slot not read:
  the timer log is in topic order, so a cursor finds it), the first timer record not enqueued yet, and the log
  end of the checkpoint (where recovery reads the copies made). Published at each checkpoint; the store's
  retention deletes nothing from there (TimerDuty.retention_floor). Rolls keep it within about one wheel span
  of the clock while the timer keeps up; after downtime it is as old as the oldest message not delivered.
* **Rebuild**: without usable files the timer starts from the topic's lowest offset with ``read_ms`` at now,
  every unit already due delivered at once, and the whole log from that record read for TIMER_UNIT first.

Thread-safety: none; the timer's duty (mqstore.timer.leadership) owns it; :meth:`Timer.stats` may be read from
any thread (plain int reads).
"""

from __future__ import annotations

import pathlib
import struct
import threading
from dataclasses import dataclass

import structlog

from mqstore import codec, disk_space, topics as topic_rules
from mqstore.errors import InvalidArgument, TopicNotFound, invariant
from mqstore.format import cq_unit, record_reader
from mqstore.format.timer_unit import KIND_DELIVER, KIND_ROLL, Unit
from mqstore.model import KIND_COMPACTION, Copies, Copy
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig
from mqstore.timer import delivery, runs
from mqstore.timer.files import TimerFiles

log = structlog.get_logger("mqstore.timer")

READ_BATCH = 512        # timer records read per pull
DELIVER_BATCH = 1000    # copies appended per step and topic batch (the store's max_batch_messages)
MAX_SLOTS_PER_STEP = 20_000
ROLL_PASSES = 4
SCAN_FRAME_BYTES = 4 << 20
MAX_NOTES = 200_000     # noted records kept for the enqueue (about 30 MB at most; beyond, records are read)
REALIGN_MAX_NOTES = 64  # notes (batches) up to which each read of the enqueue realigns them (Timer._realign_notes)
_SIZE = struct.Struct(">i")
# The noted records' header check and units, a note's physical offsets (mqstore.timer.runs: the references)
_noted_units = codec.compiled.timer_noted_units if codec.compiled is not None else runs.noted_units
_note_physicals = codec.compiled.timer_note_physicals if codec.compiled is not None else runs.note_physicals
_MARKERS = (tm.UNIT.encode() + b"\x01", tm.ROLLED_FROM.encode() + b"\x01")


class _NotedRun:
    """A run of noted records' units (runs.noted_units): the enqueue offset after it, its deliver units' count."""

    __slots__ = ("units", "upto", "scheduled")

    def __init__(self, units: list, upto: int, scheduled: int):
        self.units, self.upto, self.scheduled = units, upto, scheduled


@dataclass
class TimerStats:
    scheduled: int = 0      # units added to the wheel (not rolls or cancels)
    delivered: int = 0      # copies appended
    rolled: int = 0         # records re-appended to wait another turn
    cancelled: int = 0      # units dropped by a cancel marker
    skipped_done: int = 0   # units found delivered already at recovery
    dropped: int = 0        # units whose real topic or record is gone
    pending: int = 0        # units in the wheel not delivered yet (an estimate after a restart)
    lag_ms: int = 0         # how far the read slot is behind the clock (0 while it keeps up)


class Timer:
    def __init__(self, store, config: TimerConfig, directory: pathlib.Path, metrics=None):
        """``store``: the started MessageStore; ``metrics``: a TimerMetrics or None."""
        self.store = store
        self.config = config
        self.precision = config.timer_precision_ms
        self.files = TimerFiles(directory, self.precision, config.timer_wheel_slots)
        self.metrics = metrics
        self.stats = TimerStats()
        self.enqueue_offset = 0
        self.read_ms = 0
        self.read_log_end = 0
        self._advances: list[tuple[int, int]] = []  # (read_ms, read_log_end) not yet checkpointed
        self._current: delivery.DueUnits | None = None  # the read slot's units left, by due time
        self.cancels: dict[int, int] = {}  # origin -> due of a recalled message (kept a turn past its due)
        self._done: set[int] = set()  # timer offsets delivered already (recovery's scan of TIMER_UNIT)
        self._rolled: set[int] = set()  # timer offsets re-appended already (TIMER_ROLLED_FROM): never again
        self._done_until_ms = 0  # the scan's set is needed for slots before this
        self._slot_done: set[int] = set()  # delivered from the read slot (a retried step skips them)
        self._next_jump_check = 0
        self._caught_up_at: int | None = None  # the read slot when the enqueue first caught up with the topic
        self._last_checkpoint_ms = 0
        self._checkpoint_skipped = False  # the last checkpoint write met a full disk (logged once)
        self._cp_read = self._cp_end = 0  # the read slot and log end the next checkpoint records
        self._floor_position = 0  # timer log position: every unit before it is in a slot read already
        self.retention_floor: int | None = None  # published for the store's retention (read from its thread)
        # queue offset -> (a batch's physical offsets, due times, store ms, the index of that offset's): note()
        self._notes: dict[int, tuple[object, list[int], int, int]] = {}  # object: an array of int64
        self._noted = 0  # records noted and not taken yet (at most MAX_NOTES)
        self._notes_lock = threading.Lock()

    # ---- open and close
    def open(self) -> None:
        """Recover the files (or rebuild) and read the log for what is done; the files are closed if it fails
        (the duty retries the open)."""
        try:
            self._open()
        except BaseException:
            self.files.close()
            raise

    def _open(self) -> None:
        now = self.store.clock.now_ms()
        cp = self.files.open()
        low, high = self._bounds()
        if cp is not None and cp.enqueue_offset > high:
            log.warning("timer.ahead_of_topic", enqueue_offset=cp.enqueue_offset, topic_max=high)
            self.files.reset()
            cp = None
        if cp is None:
            self.enqueue_offset, self.read_ms = low, self.files.slot_ms(now)
            self.read_log_end = self._first_record_position(low)
        else:
            self.enqueue_offset = max(self.files.enqueued_to, cp.enqueue_offset, low)
            self.cancels = dict(self.files.cancels)
            self.read_ms, self.read_log_end = cp.read_ms, cp.read_log_end
        self._done, self._rolled = self._scan_done(self.read_log_end)
        self._done_until_ms = now + self.precision
        self._cp_read, self._cp_end = self.read_ms, self.read_log_end
        self.stats.pending = self.files.pending_from(self.read_ms)
        self._publish_floor()
        log.info("timer.opened", rebuilt=cp is None, enqueue_offset=self.enqueue_offset, read_ms=self.read_ms,
                 behind_ms=now - self.read_ms, done_found=len(self._done))

    def close(self) -> None:
        try:
            self.checkpoint(force=True)
        finally:
            self.files.close()

    def _bounds(self) -> tuple[int, int]:
        cq = self.store.queues.get(tm.TIMER_TOPIC, 0)
        return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)

    def _first_record_position(self, offset: int) -> int:
        found = self.store.pull(tm.TIMER_TOPIC, 0, offset, 1).messages if offset < self._bounds()[1] else []
        return found[0].record.physical_offset if found else self.store.log_end()

    def _scan_done(self, start: int) -> tuple[set[int], set[int]]:
        """TIMER_UNIT and TIMER_ROLLED_FROM of the log's records from ``start``: the units done already."""
        done: set[int] = set()
        rolled: set[int] = set()
        pos, end = max(start, self.store.log_min()), self.store.visible_offset()
        while pos < end:
            data, count, nxt = self.store.commitlog.frame(pos, end, SCAN_FRAME_BYTES, frozenset())
            at = 0
            while at + 4 <= len(data):
                size = _SIZE.unpack_from(data, at)[0]
                if size <= 0:
                    break
                raw = data[at:at + size]
                if _MARKERS[0] in raw or _MARKERS[1] in raw:
                    rec = record_reader.decode(raw, 0, verify_crc=False)
                    if tm.UNIT in rec.properties and rec.topic != tm.TIMER_TOPIC:
                        done.add(int(rec.properties[tm.UNIT]))
                    if tm.ROLLED_FROM in rec.properties and rec.topic == tm.TIMER_TOPIC:
                        rolled.add(int(rec.properties[tm.ROLLED_FROM]))
                at += size
            if nxt <= pos:
                break
            pos = nxt
        return done, rolled

    # ---- the step
    def step(self) -> float:
        """Enqueue what the topic holds, deliver what is due; seconds until the next step is needed."""
        now = self.store.clock.now_ms()
        wait_ms = self.precision
        for _ in range(ROLL_PASSES):  # a roll re-appended in this pass may be due already: read it at once
            rolled = self.stats.rolled
            caught_up = self._enqueue()
            if not caught_up:
                break
            wait_ms = self._dequeue(now)
            if self.stats.rolled == rolled:
                break
        self.stats.lag_ms = max(0, now - self.read_ms - self.precision)
        if now - self._last_checkpoint_ms >= self.config.timer_checkpoint_interval_ms:
            self.checkpoint()
        return max(0.0, wait_ms / 1000) if caught_up else 0.0

    def _enqueue(self) -> bool:
        """Units for the topic's records from the enqueue offset (a bounded read); whether it caught up."""
        low, high = self._bounds()
        if self.enqueue_offset < low:
            log.error("timer.records_lost", enqueue_offset=self.enqueue_offset, topic_min=low,
                      why="the timer topic's retention removed records the timer had not read")
            self.enqueue_offset = low
        if self.enqueue_offset >= high:
            if self._caught_up_at is None:
                self._caught_up_at = self.read_ms
            return True
        # The wheel's live slots are those from the checkpoint's read slot (where a restart resumes) on: a unit
        # placed further would share its file slot with one a restart still has to read.
        horizon = self._cp_read + self.config.span_ms - 2 * self.precision
        scheduled = self.stats.scheduled
        found = self._timer_records(self.enqueue_offset, min(READ_BATCH, high - self.enqueue_offset), horizon)
        # The units go to the files in one write per batch (TimerFiles.add_many), flushed before a cancel (which
        # names an earlier unit) and at the end; the enqueue offset moves past what the files hold.
        units: list[tuple[int, int, int, int, int]] = []
        upto = self.enqueue_offset
        for item in found:
            if type(item) is _NotedRun:  # noted records' units made already (runs.noted_units)
                units += item.units
                upto = item.upto
                continue
            queue_offset, physical, props, due = item
            if props is not None and tm.CANCEL_OFFSET in props:
                self._flush(units, upto)
                units = []
            self._add(queue_offset, physical, props, due, units, horizon)
            upto = queue_offset + 1
        self._flush(units, upto)
        if self.metrics and self.stats.scheduled > scheduled:
            self.metrics.scheduled.inc(self.stats.scheduled - scheduled)
        return self.enqueue_offset >= high

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
        at = self.enqueue_offset - first  # a batch's queue offsets are consecutive: those below, read already
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
            self._realign_notes(self.enqueue_offset)

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
            read_ms, precision, rolled = self.read_ms, self.precision, self._rolled
            while index < total:
                physical, size, _ = cq_unit.decode(entries, index * cq_unit.ENTRY_SIZE)
                if not seg_start <= physical < seg_end:
                    seg = segments.find(physical)
                    buf, seg_start, seg_end = seg.buffer, seg.start, seg.end
                if notes:  # the run of noted records from here whose headers match their notes
                    units: list = []
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
                if len(item.units) > item.scheduled:
                    invariant(horizon > read_ms, "the timer checkpoint follows the read slot within half the wheel")
                self.stats.scheduled += item.scheduled
                self.stats.pending += len(item.units)
        return found

    def _flush(self, units: list[tuple[int, int, int, int, int]], upto: int) -> None:
        """The units gathered by :meth:`_add` into the files (and the read slot's into its heap); the enqueue
        offset to ``upto``."""
        touched = self.files.add_many(units)
        self.enqueue_offset = upto
        if self._current is not None and self.read_ms in touched:  # else no unit is the read slot's: no pass
            read_ms = self.read_ms
            self._take([Unit(due, slot, offset, physical, -1, kind) for slot, due, offset, physical, kind in units
                        if slot == read_ms])

    def _add(self, queue_offset: int, physical: int, props: dict[str, str] | None, due: int,
             units: list[tuple[int, int, int, int, int]], horizon: int) -> None:
        """The unit of a timer record, appended to ``units`` (a cancel marker goes to the files at once); ``props``
        None: a noted delayed record (:meth:`note`), due at ``due``; ``horizon``: the first slot a unit may not
        take (it rolls there instead)."""
        if queue_offset in self._rolled:
            return  # re-appended already (a rebuild reads the topic from its start): its successor carries it
        if props is not None:
            if tm.CANCEL_OFFSET in props:
                origin, due = int(props[tm.CANCEL_OFFSET]), int(props[tm.OUT_MS])
                self.files.add_cancel(origin, due, queue_offset)
                self.cancels[origin] = due
                return
            if tm.OUT_MS not in props or tm.REAL_TOPIC not in props:
                log.error("timer.record_not_timer", queue_offset=queue_offset)
                return
            due = int(props[tm.OUT_MS])
        slot = due - due % self.precision
        if slot < self.read_ms:
            slot = self.read_ms
        if slot >= horizon:
            invariant(horizon > self.read_ms, "the timer checkpoint follows the read slot within half the wheel")
            units.append((horizon, due, queue_offset, physical, KIND_ROLL))
        else:
            units.append((slot, due, queue_offset, physical, KIND_DELIVER))
            self.stats.scheduled += 1
        self.stats.pending += 1

    def _take(self, units: list[Unit]) -> None:
        """Units of the read slot into the in-memory queue by due time (delivery.DueUnits)."""
        self._current.take(units)

    def _dequeue(self, now: int) -> int:
        """Deliver what is due; ms until something may be due next."""
        for _ in range(MAX_SLOTS_PER_STEP):
            if now < self.read_ms:
                return self.read_ms - now
            if self._current is None:
                self._current = delivery.DueUnits()
                self._take(self.files.units(self.read_ms))
            heap = self._current
            due = heap.pop_due(now, DELIVER_BATCH)
            if due:
                try:
                    self._deliver(due, now)
                except BaseException:  # retried by the duty: the units stay (the delivered ones are skipped)
                    self._take(due)
                    raise
                if heap:
                    return 0
                continue
            if heap:
                return heap.first_due() - now
            if now < self.read_ms + self.precision:
                return self.read_ms + self.precision - now
            self._next_slot(now)
        return 0

    def _next_slot(self, now: int) -> None:
        self._current = None
        self._slot_done = set()
        self.read_ms += self.precision
        # Behind by more than the wheel (a long downtime): once no slot holds a time from here on, the slots
        # left are earlier turns' (empty) and the timer jumps to now; checked once per span read.
        if now - self.read_ms > self.config.span_ms and self.read_ms >= self._next_jump_check:
            self._next_jump_check = self.read_ms + self.config.span_ms
            if not self.files.pending_from(self.read_ms) and self.enqueue_offset >= self._bounds()[1]:
                log.info("timer.caught_up", skipped_to=self.files.slot_ms(now), from_ms=self.read_ms)
                self.read_ms = self.files.slot_ms(now)
        # Until the slots the last run may have read are passed, their deliveries may lie below today's log end:
        # a checkpoint then keeps the recovery's start (where its scan began) as the place to read from.
        if self.read_ms > self._done_until_ms:
            self._done = set()
            self.read_log_end = self.store.log_end()
        self._advances.append((self.read_ms, self.read_log_end))
        if self.read_ms - self._cp_read >= self.config.span_ms // 2:
            self.checkpoint()  # keeps the live slots within one turn (see _add)

    def _deliver(self, units: list[Unit], now: int) -> None:
        """Append the copies (or roll records) of ``units``, batched per topic in order. A copy to a topic that is
        not a compaction topic is made from the timer record's bytes, the run's in one pass (delivery.copies: its
        body and CRC as stored, its properties written once); any other, or where that declines, by :meth:`_made`."""
        made = delivery.copies(self.store, units, now)
        batches: list[list] = []  # [topic, copies, units, body bytes]
        copyable: dict[str, bool] = {}
        for unit, got in zip(units, made, strict=True):
            offset = unit.timer_offset
            if offset in self._done or offset in self._slot_done or offset in self._rolled:
                self.stats.skipped_done += 1
                self.stats.pending -= 1
                continue
            if got is not None:
                topic = got[0]
                if topic not in copyable:
                    copyable[topic] = self._copyable(topic)
                if not copyable[topic]:
                    got = None
            if got is None:
                got = self._made(unit, now, copyable)
                if got is None:
                    continue
            topic, origin, copy = got
            if origin in self.cancels:
                log.info("timer.cancelled", timer_offset=offset, origin=origin)
                self.stats.cancelled += 1
                self.stats.pending -= 1
                self._slot_done.add(offset)
                continue
            kind = type(copy)
            last = batches[-1] if batches else None
            if (last is not None and last[0] == topic and type(last[1][0]) is kind
                    and self._fits(len(last[1]), last[3] + len(copy.body))):
                last[1].append(copy)
                last[2].append(unit)
                last[3] += len(copy.body)
            else:
                batches.append([topic, [copy], [unit], len(copy.body)])
        for topic, copies, batch_units, _ in batches:
            self._append(topic, Copies(copies) if type(copies[0]) is Copy else copies, batch_units, now)

    def _made(self, unit: Unit, now: int, copyable: dict[str, bool]) -> tuple | None:
        """(topic, origin, the copy or roll record) of ``unit`` the reference way (the record looked up, a copy
        from its bytes where the topic allows, else decoded: messages.delivered_copy, delivered, rolled); None
        for a record that is gone (counted as dropped)."""
        found, missing = delivery.lookup(self.store, unit.physical_offset)
        if found is None:
            log.error("timer.record_missing", timer_offset=unit.timer_offset, why=missing)
            self.stats.dropped += 1
            self.stats.pending -= 1
            return None
        props = found.properties
        real, origin = props.get(tm.REAL_TOPIC), int(props.get(tm.ORIGIN, unit.timer_offset))
        if origin in self.cancels:
            return None, origin, None  # cancelled: the caller counts it
        if unit.kind == KIND_DELIVER and type(found) is record_reader.RecordView:
            if real not in copyable:
                copyable[real] = self._copyable(real)
            made = tm.delivered_copy(found, props, unit.timer_offset, now) if copyable[real] else None
            if made is not None:
                return made[0], origin, made[1]
        record = found.decode() if type(found) is record_reader.RecordView else found
        if unit.kind == KIND_ROLL:
            return tm.TIMER_TOPIC, origin, tm.rolled(record, unit.timer_offset)
        topic, copy = tm.delivered(record, unit.timer_offset, now)
        return topic, origin, copy

    def _copyable(self, topic: str | None) -> bool:
        """Whether copies to ``topic`` may be made from the timer record's bytes (it exists and is not a compaction
        topic, whose queue is its key's: those go as MessageIn, as does any copy whose topic is gone, which the
        append then refuses as before)."""
        try:
            return topic is not None and self.store.topic_admin.get(topic).kind != KIND_COMPACTION
        except TopicNotFound:
            return False

    def _fits(self, count: int, body_bytes: int) -> bool:
        """Whether a batch of ``count`` copies may take one more, ``body_bytes`` with it, within the store's batch
        limits (a batch past them would be refused)."""
        cfg = self.store.config
        return count < cfg.max_batch_messages and body_bytes <= cfg.max_batch_body_bytes

    def _append(self, topic: str, copies: list, units: list[Unit], now: int) -> None:
        try:
            if topic == tm.TIMER_TOPIC:
                self.store.append(topic, copies, system_writer=topic_rules.OWNER_SCHEDULE)
            else:
                self.store.append(topic, copies)
        except (TopicNotFound, InvalidArgument) as exc:  # deleted, or re-created with fewer queues: nowhere to go
            log.warning("timer.undeliverable", topic=topic, dropped=len(copies), error=str(exc))
            self.stats.dropped += len(copies)
            self.stats.pending -= len(copies)
            return
        except Exception:
            if self.metrics:
                self.metrics.failures.inc()
            raise
        for unit in units:
            self._slot_done.add(unit.timer_offset)  # a retry of this step after a later batch failed skips it
            if unit.kind == KIND_ROLL:
                self.stats.rolled += 1
                self.stats.pending -= 1  # it comes back as a new record (scheduled again)
                continue
            self.stats.delivered += 1
            self.stats.pending -= 1
            if self.metrics:
                self.metrics.delivered.inc()
                self.metrics.late.observe(max(0, now - unit.deliver_ms) / 1000)

    # ---- the checkpoint
    def checkpoint(self, force: bool = False) -> None:
        """fsync and record what holds: the enqueue offset, and the latest slot advance whose log end is
        flushed (a copy not fsynced yet would be lost by a power cut after a checkpoint that counted it)."""
        flushed = self.store.flushed_offset()
        if self._advances and self._advances[-1][1] > flushed:
            flushed = self.store.flusher.flush_now()
        while self._advances and self._advances[0][1] <= flushed:
            self._cp_read, self._cp_end = self._advances.pop(0)
        now = self.store.clock.now_ms()
        self._last_checkpoint_ms = now
        self._drop_old_notes()
        # The log starts over when no unit is left: the estimate says so, the wheel confirms it (rarely read).
        empty = (self.stats.pending <= 0 and not self._current and self._cp_read == self.read_ms
                 and self.files.log_end > 0 and not self.files.pending_from(self.read_ms))
        # Every copy of a recalled message has come by a whole turn after its due slot was read, once the records
        # this run found in the topic (a rebuild's, a late roll's) were put in the wheel and their slot read.
        if self._caught_up_at is not None and self._cp_read > self._caught_up_at:
            self.cancels = {k: v for k, v in self.cancels.items() if v + self.config.span_ms > self._cp_read}
        try:
            self.files.checkpoint(self.enqueue_offset, self._cp_read, self._cp_end, now, self.cancels, empty=empty)
        except OSError as exc:
            # A full disk: the checkpoint before stays valid (a restart reads the log again from it and skips what
            # was delivered), so the timer goes on and tries again at the next one; the floor stays the old
            # checkpoint's. Any other failure is raised (the duty's backoff and health).
            if not disk_space.is_no_space(exc):
                raise
            if not self._checkpoint_skipped:
                log.warning("timer.checkpoint_skipped", reason="disk full", error=str(exc),
                            action="the previous checkpoint stays; a restart re-reads the timer topic from it")
            self._checkpoint_skipped = True
            return
        self._checkpoint_skipped = False
        self._publish_floor()

    def _publish_floor(self) -> None:
        """:attr:`retention_floor`: the lowest of the checkpoint's log end (recovery reads the copies from there),
        the oldest unit of a slot not passed by the checkpoint's read slot (a restart reads its slot again), and
        the first record not enqueued yet (the dispatched end when there is none: a record the queue shows after
        this read lies above it)."""
        unenqueued = self.store.dispatcher.dispatched_offset
        if self.enqueue_offset < self._bounds()[1]:
            unenqueued = self._first_record_position(self.enqueue_offset)
        if self._floor_position > self.files.log_end:
            self._floor_position = 0  # the log started over
        self._floor_position, unit = self.files.first_pending(self._floor_position, self._cp_read)
        floor = min(self._cp_end, unenqueued)
        self.retention_floor = floor if unit is None else min(floor, unit.physical_offset)
