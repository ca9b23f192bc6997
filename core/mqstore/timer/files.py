"""The timer's files in ``<data-dir>/timer/``: the timer log (units, mqstore.format.timer_unit), the wheel
(slots, mqstore.format.timer_slot), the cancel set (mqstore.format.timer_cancels) and the checkpoint
(mqstore.format.timer_checkpoint). All three are derived from the
timer topic: lost or damaged, they are reset and the timer rebuilds from the topic (:meth:`TimerFiles.open`).

Writes: a unit is appended to the log, then its slot is rewritten (pwrite, so a kill -9 keeps both in the page
cache); a cancel unit is appended to the log only (it is in no slot). :meth:`TimerFiles.checkpoint` fsyncs the log
and the wheel, replaces the cancel set, then the checkpoint file, so what the checkpoint claims is on disk.
Recovery (:meth:`TimerFiles.open`) re-checks the units written after the
checkpoint's log end: a unit whose slot does not reach it yet is applied again (its slot write was lost), the
first bad unit cuts the log (a torn tail); a slot that points past the cut (a power loss lost units whose slot
reached the disk) resets everything: the timer rebuilds from the topic.

Thread-safety: none; the timer's one thread owns it.
"""

from __future__ import annotations

import os
import pathlib
import zlib

import structlog

from mqstore import codec, fs
from mqstore.errors import DataLoss
from mqstore.format import timer_cancels, timer_checkpoint, timer_slot, timer_unit
from mqstore.format.timer_checkpoint import TimerCheckpoint
from mqstore.format.timer_slot import SLOT_SIZE, Slot
from mqstore.format.timer_unit import NO_POSITION, UNIT_SIZE, Unit
from mqstore.timer import runs

log = structlog.get_logger("mqstore.timer")

LOG_NAME, WHEEL_NAME, CHECKPOINT_NAME, CANCELS_NAME = "timerlog", "timerwheel", "timercheck", "timercancels"
NO_SLOT = -1
MAX_SLOT_UNITS = 10_000_000  # a chain longer than this is damage, not data
UNITS_READ_BYTES = 64 << 20  # a slot whose units span at most this is read in one pread
# A batch's units' bytes (mqstore.timer.runs.encode_units is the compiled one's reference)
_encode_units = codec.compiled.timer_units if codec.compiled is not None else runs.encode_units


class TimerFiles:
    def __init__(self, directory: pathlib.Path, precision_ms: int, slots: int):
        self.directory = directory
        self.precision_ms = precision_ms
        self.slots = slots
        self.log_end = 0  # the timer log's end position
        self.enqueued_to = 0  # one past the highest timer offset of a unit in the log (0: none)
        self.cancels: dict[int, int] = {}  # recovered: origin -> due of the recalled messages
        self._log_fd = -1
        self._wheel_fd = -1

    # ---- open, recover, close
    def open(self) -> TimerCheckpoint | None:
        """Open (or create) the files; the checkpoint they hold once recovered, or None when the timer must
        rebuild from the timer topic (no checkpoint, a damaged one, another precision or slot count, a log
        damaged below the checkpoint, a slot past a torn tail). After None the files are empty."""
        fs.make_dirs(self.directory)
        self._log_fd = os.open(self.directory / LOG_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self._wheel_fd = os.open(self.directory / WHEEL_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            cp = self._read_checkpoint()
            if cp is not None:
                self.cancels = timer_cancels.decode((self.directory / CANCELS_NAME).read_bytes())
        except (DataLoss, FileNotFoundError) as exc:
            log.warning("timer.checkpoint_unusable", error=str(exc), action="rebuild from the timer topic")
            cp = None
        if cp is None or (cp.precision_ms, cp.slots) != (self.precision_ms, self.slots) or not self._recover(cp):
            self.reset()
            return None
        return cp

    def _read_checkpoint(self) -> TimerCheckpoint | None:
        path = self.directory / CHECKPOINT_NAME
        if not path.exists():
            return None
        return timer_checkpoint.decode(path.read_bytes(), str(path))

    def _recover(self, cp: TimerCheckpoint) -> bool:
        """Re-check the units from the checkpoint's log end; False when the files cannot be trusted."""
        size = os.fstat(self._log_fd).st_size
        if size < cp.log_end_position or cp.log_end_position % UNIT_SIZE:
            log.warning("timer.log_short", size=size, checkpoint_log_end=cp.log_end_position)
            return False
        self.enqueued_to = cp.enqueue_offset
        position = cp.log_end_position
        while position + UNIT_SIZE <= size:
            unit = timer_unit.decode(os.pread(self._log_fd, UNIT_SIZE, position), 0)
            if unit is None:
                break
            self._reapply(unit, position)
            position += UNIT_SIZE
        if position < size:
            log.warning("timer.log_tail_cut", at=position, size=size)
            os.ftruncate(self._log_fd, position)
            if self._slot_beyond(position):
                return False
        self.log_end = position
        return True

    def _reapply(self, unit: Unit, position: int) -> None:
        if unit.kind == timer_unit.KIND_CANCEL:
            self.cancels[unit.timer_offset] = unit.deliver_ms
            self.enqueued_to = max(self.enqueued_to, unit.physical_offset + 1)  # a cancel's: its marker's offset
            return
        self.enqueued_to = max(self.enqueued_to, unit.timer_offset + 1)
        slot_ms = unit.slot_ms
        slot = self.read_slot(slot_ms)
        if slot is not None and slot.last_position >= position:
            return  # its slot write reached the file
        first = slot.first_position if slot is not None else position
        count = slot.count + 1 if slot is not None else 1
        self._write_slot(Slot(slot_ms, first, position, count))

    def _slot_beyond(self, position: int) -> bool:
        data = os.pread(self._wheel_fd, self.slots * SLOT_SIZE, 0)
        for index in range(len(data) // SLOT_SIZE):
            at = index * SLOT_SIZE
            slot_ms = timer_slot.SLOT.unpack_from(data, at)[0]
            slot = timer_slot.decode(data, at, slot_ms)
            if slot is not None and slot.last_position >= position:
                log.warning("timer.slot_past_log_end", slot_ms=slot_ms, last_position=slot.last_position,
                            log_end=position)
                return True
        return False

    def pending_from(self, read_ms: int) -> int:
        """Units in slots holding a time at or after ``read_ms`` (reads the whole wheel)."""
        data = os.pread(self._wheel_fd, self.slots * SLOT_SIZE, 0)
        total = 0
        for at in range(0, len(data) - SLOT_SIZE + 1, SLOT_SIZE):
            slot_ms = timer_slot.SLOT.unpack_from(data, at)[0]
            if slot_ms >= read_ms:
                slot = timer_slot.decode(data, at, slot_ms)
                total += slot.count if slot is not None else 0
        return total

    def reset(self) -> None:
        """Empty files (the timer rebuilds from the timer topic)."""
        os.ftruncate(self._log_fd, 0)
        os.ftruncate(self._wheel_fd, 0)
        os.ftruncate(self._wheel_fd, self.slots * SLOT_SIZE)
        (self.directory / CHECKPOINT_NAME).unlink(missing_ok=True)
        self.log_end = 0
        self.enqueued_to = 0
        self.cancels = {}

    def close(self) -> None:
        for fd in (self._log_fd, self._wheel_fd):
            if fd >= 0:
                os.close(fd)
        self._log_fd = self._wheel_fd = -1

    # ---- the wheel
    def slot_ms(self, deliver_ms: int) -> int:
        return deliver_ms - deliver_ms % self.precision_ms

    def _slot_position(self, slot_ms: int) -> int:
        return (slot_ms // self.precision_ms) % self.slots * SLOT_SIZE

    def read_slot(self, slot_ms: int) -> Slot | None:
        data = os.pread(self._wheel_fd, SLOT_SIZE, self._slot_position(slot_ms))
        return timer_slot.decode(data, 0, slot_ms) if len(data) == SLOT_SIZE else None

    def _write_slot(self, slot: Slot) -> None:
        os.pwrite(self._wheel_fd, timer_slot.encode(slot), self._slot_position(slot.slot_ms))

    def add(self, slot_ms: int, deliver_ms: int, timer_offset: int, physical_offset: int, kind: int) -> int:
        """Append a unit to the slot of ``slot_ms`` (a multiple of the precision); returns its position."""
        slot = self.read_slot(slot_ms)
        position = self.log_end
        prev = slot.last_position if slot is not None else NO_POSITION
        os.pwrite(self._log_fd, timer_unit.encode(Unit(deliver_ms, slot_ms, timer_offset, physical_offset, prev, kind)),
                  position)
        self.log_end = position + UNIT_SIZE
        if kind != timer_unit.KIND_CANCEL:
            self.enqueued_to = max(self.enqueued_to, timer_offset + 1)
        first = slot.first_position if slot is not None else position
        self._write_slot(Slot(slot_ms, first, position, (slot.count if slot is not None else 0) + 1))
        return position

    def add_many(self, units) -> dict[int, list[int]]:
        """:meth:`add` for several units, each ``(slot ms, deliver ms, timer offset, physical offset, kind)`` as a
        pre-unit (mqstore.timer.runs.PRE_UNIT; ``units`` bytes-like, runs.pack_units makes them of tuples), in
        order: the units in one write to the log, then each slot they touch rewritten once (the same files as one
        :meth:`add` each: a kill -9 between the two writes leaves units past the slots' ends, which recovery
        applies again like a single unit's lost slot write). Returns the slots touched (slot ms -> [first
        position, last position, count])."""
        if not units:
            return {}
        slots: dict[int, list[int]] = {}  # slot ms -> [first position, last position, count]
        start = self.log_end
        encoded, self.enqueued_to = _encode_units(units, start, slots, self.enqueued_to, self._slot_fields)
        position = start + len(encoded)
        view = memoryview(encoded)
        while view:
            written = os.pwrite(self._log_fd, view, start)
            view, start = view[written:], start + written
        self.log_end = position
        for slot_ms, (first, last, count) in slots.items():
            self._write_slot(Slot(slot_ms, first, last, count))
        return slots

    def _slot_fields(self, slot_ms: int) -> list[int]:
        """[first position, last position, count] of the slot (add_many's), [-1, -1, 0] when it is empty."""
        read = self.read_slot(slot_ms)
        return [read.first_position, read.last_position, read.count] if read is not None else [NO_POSITION] * 2 + [0]

    def add_cancel(self, origin: int, due_ms: int, marker_offset: int) -> None:
        """A cancel unit (in no slot): the message of ``origin`` due at ``due_ms``, cancelled by the marker at
        timer queue offset ``marker_offset`` (kept in the physical offset field: the enqueue resumes after it)."""
        unit = Unit(due_ms, NO_SLOT, origin, marker_offset, NO_POSITION, timer_unit.KIND_CANCEL)
        os.pwrite(self._log_fd, timer_unit.encode(unit), self.log_end)
        self.log_end += UNIT_SIZE
        self.enqueued_to = max(self.enqueued_to, marker_offset + 1)

    def first_pending(self, position: int, read_ms: int) -> tuple[int, Unit | None]:
        """The first unit from ``position`` (a unit boundary) in a slot at or after ``read_ms`` (not read yet, or
        the one being read), and its position; (log end, None) when there is none. Units are appended in the
        timer topic's order, so its physical offset is the lowest of every unit not delivered (or rolled) yet."""
        chunk = 4096 * UNIT_SIZE  # read without the CRC (recovery checked the log below its end): ~0.3 us a unit
        while position < self.log_end:
            data = os.pread(self._log_fd, min(chunk, self.log_end - position), position)
            whole = len(data) - len(data) % UNIT_SIZE
            if not whole:
                break
            for index, fields in enumerate(timer_unit.UNIT.iter_unpack(memoryview(data)[:whole])):
                deliver_ms, slot_ms, timer_offset, physical_offset, prev, kind, _ = fields
                if kind == timer_unit.KIND_CANCEL:
                    continue
                if slot_ms >= read_ms or kind not in timer_unit.KINDS:  # damage: all kept from the start
                    unit = (Unit(deliver_ms, slot_ms, timer_offset, physical_offset, prev, kind)
                            if kind in timer_unit.KINDS else Unit(0, read_ms, -1, 0, NO_POSITION, kind))
                    return position + index * UNIT_SIZE, unit
            position += whole
        return self.log_end, None

    def units(self, slot_ms: int) -> list[Unit]:
        """The slot's units in the order they were added."""
        slot = self.read_slot(slot_ms)
        if slot is None:
            return []
        found: list[Unit] = []
        position = slot.last_position
        # The slot's units lie between its first and last unit: one read of that span when it is not too large
        # (a burst's slot: its units side by side), a read per unit otherwise.
        span_start = slot.first_position
        span = b""
        if 0 <= span_start <= position < self.log_end and position + UNIT_SIZE - span_start <= UNITS_READ_BYTES:
            span = os.pread(self._log_fd, position + UNIT_SIZE - span_start, span_start)
        # timer_unit.decode inlined for the span's units (a burst's slot: one call and one copy fewer a unit).
        unpack, crc32, kinds, covered = timer_unit.UNIT.unpack_from, zlib.crc32, timer_unit.KINDS, UNIT_SIZE - 4
        view, last_in_span = memoryview(span), span_start + len(span) - UNIT_SIZE
        while position != NO_POSITION:
            if span_start <= position <= last_in_span:
                at = position - span_start
                deliver_ms, unit_slot, timer_offset, physical_offset, prev, kind, crc = unpack(span, at)
                unit = (Unit(deliver_ms, unit_slot, timer_offset, physical_offset, prev, kind)
                        if crc == crc32(view[at:at + covered]) and kind in kinds else None)
            else:
                unit = timer_unit.decode(os.pread(self._log_fd, UNIT_SIZE, position), 0)
            if unit is None or len(found) > MAX_SLOT_UNITS or position >= self.log_end:
                raise DataLoss(f"timer log {self.directory / LOG_NAME}: unit at {position} of slot {slot_ms} is "
                               f"damaged; delete {self.directory} to rebuild the timer from its topic")
            found.append(unit)
            position = unit.prev_position
        found.reverse()
        return found

    # ---- the checkpoint
    def checkpoint(self, enqueue_offset: int, read_ms: int, read_log_end: int, now_ms: int,
                   cancels: dict[int, int], empty: bool = False) -> None:
        """fsync the log and the wheel, then replace the checkpoint. ``empty``: no unit is pending (every
        slot at or after ``read_ms`` is empty), so the log starts over at position 0."""
        if empty and self.log_end:
            os.ftruncate(self._log_fd, 0)  # slots still naming old positions hold times before read_ms
            self.log_end = 0
        os.fsync(self._log_fd)
        os.fsync(self._wheel_fd)
        fs.replace_file(self.directory / CANCELS_NAME, timer_cancels.encode(cancels))
        cp = TimerCheckpoint(enqueue_offset, self.log_end, read_ms, read_log_end, self.precision_ms, self.slots,
                             now_ms)
        fs.replace_file(self.directory / CHECKPOINT_NAME, timer_checkpoint.encode(cp))
