"""The enqueue's per-record loops, pure Python: the reference of the compiled codec's ``timer_noted_units``,
``timer_note_physicals`` and ``timer_units`` (mqstore.codec's ``_records``), which must give the same results byte
for byte (tests/property/test_codec_timer_runs.py). mqstore.timer.timer and files call the compiled ones when
built.

Between the two a batch's units are *pre-units*, :data:`PRE_UNIT` each (slot ms, deliver ms, timer offset,
physical offset, kind as native int64s, in memory only: never stored) one after the other in a bytearray, not a
tuple a unit: no Python object a record between the walk and the bytes (:func:`pack_units` and
:func:`unpack_units` convert).

* :func:`noted_units`: from entry ``index`` of ``entries`` (consume queue entries of the timer topic's queue 0 as
  their bytes, ConsumeQueue.entry_bytes, the first at queue offset ``first_offset``), the run of records that are
  in the segment buffer ``buf`` (log offsets ``seg_start``..``seg_end``) and noted with a header naming that queue
  offset, that physical offset and the noted store time, each made its timer unit; it stops at the first entry
  that is not such a record (the caller reads that one from the log, as before). ``notes`` is what Timer.note
  keeps, a batch a note: the queue offset of its first record not taken yet -> (the batch's physical offsets, an
  array of int64, their due times, the batch's store time, the index in them of that record); a note is removed
  when its walk starts and what is left of it put back under the queue offset where the run stopped (a record
  that is not as noted stays noted, as before). The queue offsets a note's records have are its key's and the
  next ones: the consume queue's entry at each must name the noted physical offset, and the record there that
  queue offset.
* :func:`note_physicals`: the physical offsets of a batch's AppendResults.entries from ``start``, as the array of
  int64 Timer.note keeps (the results' tuples are not kept).
* :func:`encode_units`: a batch's timer units (mqstore.format.timer_unit) from its pre-units in one bytes object,
  each chained to its slot's unit before it; ``slots`` (slot ms -> [first position, last position, count]) is
  updated as the units are added, a slot not in it yet read with ``read(slot ms)`` first ([-1, -1, 0] for an empty
  one).
"""

from __future__ import annotations

import array
import struct
import zlib

from mqstore.format.cq_unit import ENTRY, ENTRY_SIZE
from mqstore.format.record import FIXED_OVERHEAD, IPV4, LAYOUTS, QUEUE_OFFSET_AT, SYSFLAG_BORN_HOST_V6
from mqstore.format.timer_unit import KIND_CANCEL, KIND_DELIVER, KIND_ROLL, UNIT_SIZE

# From QUEUEOFFSET: it, PHYSICALOFFSET, SYSFLAG, then STORETIMESTAMP where an IPv4 born host puts it
_NOTED = struct.Struct(">qqi16xq")
_INT64 = struct.Struct(">q")
_V6_STAMP_AT = LAYOUTS[1].store_timestamp_at  # an IPv6 born host's (its store host's size does not move it)
_COVERED = struct.Struct(">qqqqqH2x")
_CRC = struct.Struct(">I")
PRE_UNIT = struct.Struct("=qqqqq")  # slot ms, deliver ms, timer offset, physical offset, kind (the module's docstring)
assert QUEUE_OFFSET_AT + _NOTED.size - 8 == IPV4.store_timestamp_at == LAYOUTS[2].store_timestamp_at
assert _V6_STAMP_AT == LAYOUTS[3].store_timestamp_at


def noted_units(buf, seg_start: int, seg_end: int, entries: bytes, index: int, first_offset: int, notes: dict,
                read_ms: int, horizon: int, precision: int, rolled: set, units: bytearray) -> tuple[int, int]:
    """The run of noted records from entry ``index`` (the module's docstring) as units, each appended to
    ``units`` as Timer._add does it, a pre-unit (slot ms, due, queue offset, physical offset, kind), in the slot of
    its due time (the read slot when that passed), or a roll unit parked at ``horizon`` from there on; a record
    re-appended already (its queue offset in ``rolled``) is taken without a unit. Returns the index of the first
    entry not taken and the number of deliver units added."""
    if precision <= 0 or index < 0:
        raise ValueError("precision must be positive, index not negative")
    size_of_buf, scheduled, count = len(buf), 0, len(entries) // ENTRY_SIZE
    noted = None  # the note being walked (taken out of ``notes``): its physical offsets, dues, store time, next index
    while index < count:
        queue_offset = first_offset + index
        if noted is None:
            note = notes.pop(queue_offset, None)
            if note is None:
                break
            noted, dues, noted_stamp, at = note
        physical, size, _ = ENTRY.unpack_from(entries, index * ENTRY_SIZE)
        position = physical - seg_start
        if (not seg_start <= physical < seg_end or size < FIXED_OVERHEAD or not 0 <= at < min(len(noted), len(dues))
                or noted[at] != physical or position + _V6_STAMP_AT + 8 > size_of_buf):
            break
        named_offset, named_physical, sys_flag, stamp = _NOTED.unpack_from(buf, position + QUEUE_OFFSET_AT)
        if sys_flag & SYSFLAG_BORN_HOST_V6:
            stamp = _INT64.unpack_from(buf, position + _V6_STAMP_AT)[0]
        if named_offset != queue_offset or named_physical != physical or stamp != noted_stamp:
            break
        due = dues[at]
        index += 1
        at += 1
        if at == len(noted):
            noted = None
        if queue_offset in rolled:
            continue
        slot = due - due % precision
        if slot < read_ms:
            slot = read_ms
        if slot >= horizon:
            units += PRE_UNIT.pack(horizon, due, queue_offset, physical, KIND_ROLL)
        else:
            units += PRE_UNIT.pack(slot, due, queue_offset, physical, KIND_DELIVER)
            scheduled += 1
    if noted is not None:  # the rest of the note walked, for the next run
        notes[first_offset + index] = (noted, dues, noted_stamp, at)
    return index, scheduled


def note_physicals(entries: list, start: int) -> array.array:
    """The physical offsets of ``entries[start:]`` as an array of int64 (the module's docstring)."""
    if start < 0:
        raise ValueError("start must not be negative")
    return array.array("q", [entry[0] for entry in entries[start:]])


def pack_units(units) -> bytearray:
    """Units as (slot ms, deliver ms, timer offset, physical offset, kind) tuples, as pre-units."""
    packed = bytearray()
    for unit in units:
        packed += PRE_UNIT.pack(*unit)
    return packed


def unpack_units(packed) -> list[tuple[int, int, int, int, int]]:
    """Pre-units as (slot ms, deliver ms, timer offset, physical offset, kind) tuples."""
    return list(PRE_UNIT.iter_unpack(packed))


def encode_units(units, position: int, slots: dict, enqueued_to: int, read) -> tuple[bytes, int]:
    """The units' bytes (``units``: pre-units, bytes-like) from log position ``position``, and the enqueued-to
    offset after them."""
    if len(units) % PRE_UNIT.size:
        raise ValueError(f"{len(units)} bytes are not whole pre-units of {PRE_UNIT.size}")
    encoded = bytearray()
    for slot_ms, deliver_ms, timer_offset, physical_offset, kind in PRE_UNIT.iter_unpack(units):
        slot = slots.get(slot_ms)
        if slot is None:
            slot = slots[slot_ms] = read(slot_ms)
        if slot[2] == 0:
            slot[0] = position
        head = _COVERED.pack(deliver_ms, slot_ms, timer_offset, physical_offset, slot[1], kind)
        encoded += head
        encoded += _CRC.pack(zlib.crc32(head))
        slot[1] = position
        slot[2] += 1
        position += UNIT_SIZE
        if kind != KIND_CANCEL and timer_offset >= enqueued_to:
            enqueued_to = timer_offset + 1
    return bytes(encoded), enqueued_to
