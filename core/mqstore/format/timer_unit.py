"""Timer log unit, mqstore's own layout (after RocketMQ's RIP-43 TimerLog unit, 52 bytes without a checksum;
ours is 48 bytes with one, and the slot it was put in). Derived data: rebuilt from the timer topic when lost
(mqstore.timer.files).

The timer log (``<data-dir>/timer/timerlog``) is an append-only file of these units, one per record of the
timer topic the timer has read (and one per cancel marker and per roll). Unit n lives at byte n * 48; a
unit's *position* is that byte. A wheel slot (mqstore.format.timer_slot) points at its last unit, and each
unit at the slot's unit before it (``prev position``, -1 for the first), so a slot's units are read
backwards and reversed. A cancel unit is in no slot (slot ms -1): recovery reads it from the log into the
cancel set (mqstore.format.timer_cancels).

  offset size field                 meaning (big-endian)
  ------ ---- --------------------- ----------------------------------------------------------------
       0    8 deliver ms            when the message is due (epoch ms; a roll unit: when it is re-read)
       8    8 slot ms               the slot it was put in (a roll's parking slot, or the read slot when
                                    it came due already): recovery re-applies it there
      16    8 timer queue offset    the record's offset in the timer topic's queue 0 (its identity); a
                                    cancel unit: the origin of the message it cancels
      24    8 physical offset       the commit log offset of the record (a cancel unit: of the marker)
      32    8 prev position         position of the slot's unit before this one, -1 for none
      40    2 kind                  1 deliver, 2 roll (re-append at its time), 4 cancel (the record is
                                    a cancel marker naming the message to drop; deliver ms: its due time)
      42    2 reserved              zero
      44    4 crc                   zlib CRC32 of bytes 0..43

A unit whose CRC fails, or whose kind is none of the three, ends the valid log (a torn tail after a crash).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

UNIT = struct.Struct(
    ">"
    "q"   # 0  deliver ms
    "q"   # 8  slot ms
    "q"   # 16 timer queue offset
    "q"   # 24 physical offset
    "q"   # 32 prev position
    "H"   # 40 kind
    "2x"  # 42 reserved
    "I"   # 44 crc
)
UNIT_SIZE = UNIT.size  # 48
_COVERED = struct.Struct(">qqqqqH2x")
_CRC = struct.Struct(">I")
KIND_DELIVER = 1
KIND_ROLL = 2
KIND_CANCEL = 4
KINDS = frozenset({KIND_DELIVER, KIND_ROLL, KIND_CANCEL})
NO_POSITION = -1


@dataclass(frozen=True, slots=True)
class Unit:
    deliver_ms: int
    slot_ms: int
    timer_offset: int
    physical_offset: int
    prev_position: int
    kind: int


def encode(unit: Unit) -> bytes:
    return encode_fields(unit.deliver_ms, unit.slot_ms, unit.timer_offset, unit.physical_offset, unit.prev_position,
                         unit.kind)


def encode_fields(deliver_ms: int, slot_ms: int, timer_offset: int, physical_offset: int, prev_position: int,
                  kind: int) -> bytes:
    """:func:`encode` of a unit's fields without the Unit (the enqueue's hot loop: a frozen dataclass a unit
    cost more than the packing)."""
    head = _COVERED.pack(deliver_ms, slot_ms, timer_offset, physical_offset, prev_position, kind)
    return head + _CRC.pack(zlib.crc32(head))


def decode(buf, position: int) -> Unit | None:
    """The unit at ``position`` of ``buf``, or None when it is short, fails its CRC or has an unknown kind."""
    if len(buf) - position < UNIT_SIZE:
        return None
    deliver_ms, slot_ms, timer_offset, physical_offset, prev, kind, crc = UNIT.unpack_from(buf, position)
    if crc != zlib.crc32(bytes(buf[position:position + UNIT_SIZE - 4])) or kind not in KINDS:
        return None
    return Unit(deliver_ms, slot_ms, timer_offset, physical_offset, prev, kind)
