"""Timer log unit, mqstore's own layout (after RocketMQ's RIP-43 TimerLog unit, 52 bytes without a checksum;
ours is 40 bytes with one). Derived data: rebuilt from the timer topic when lost (mqstore.timer.files).

The timer log (``<data-dir>/timer/timerlog``) is an append-only file of these units, one per record of the
timer topic the timer has read (and one per cancel marker and per roll). Unit n lives at byte n * 40; a
unit's *position* is that byte. A wheel slot (mqstore.format.timer_slot) points at its last unit, and each
unit at the slot's unit before it (``prev position``, -1 for the first), so a slot's units are read
backwards and reversed.

  offset size field                 meaning (big-endian)
  ------ ---- --------------------- ----------------------------------------------------------------
       0    8 deliver ms            when the message is due (epoch ms; a roll unit: when it is re-read)
       8    8 timer queue offset    the record's offset in the timer topic's queue 0 (its identity); a
                                    cancel unit: the offset of the unit it cancels
      16    8 physical offset       the commit log offset of the record (a cancel unit: of the marker)
      24    8 prev position         position of the slot's unit before this one, -1 for none
      32    2 kind                  1 deliver, 2 roll (re-append at its time), 4 cancel (the record is
                                    a cancel marker naming the unit to drop)
      34    2 reserved              zero
      36    4 crc                   zlib CRC32 of bytes 0..35

A unit whose CRC fails, or whose kind is none of the three, ends the valid log (a torn tail after a crash).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

UNIT = struct.Struct(
    ">"
    "q"   # 0  deliver ms
    "q"   # 8  timer queue offset
    "q"   # 16 physical offset
    "q"   # 24 prev position
    "H"   # 32 kind
    "2x"  # 34 reserved
    "I"   # 36 crc
)
UNIT_SIZE = UNIT.size  # 40
_COVERED = struct.Struct(">qqqqH2x")
KIND_DELIVER = 1
KIND_ROLL = 2
KIND_CANCEL = 4
KINDS = frozenset({KIND_DELIVER, KIND_ROLL, KIND_CANCEL})
NO_POSITION = -1


@dataclass(frozen=True, slots=True)
class Unit:
    deliver_ms: int
    timer_offset: int
    physical_offset: int
    prev_position: int
    kind: int


def encode(unit: Unit) -> bytes:
    head = _COVERED.pack(unit.deliver_ms, unit.timer_offset, unit.physical_offset, unit.prev_position,
                         unit.kind)
    return head + struct.pack(">I", zlib.crc32(head))


def decode(buf, position: int) -> Unit | None:
    """The unit at ``position`` of ``buf``, or None when it is short, fails its CRC or has an unknown kind."""
    if len(buf) - position < UNIT_SIZE:
        return None
    deliver_ms, timer_offset, physical_offset, prev, kind, crc = UNIT.unpack_from(buf, position)
    if crc != zlib.crc32(bytes(buf[position:position + UNIT_SIZE - 4])) or kind not in KINDS:
        return None
    return Unit(deliver_ms, timer_offset, physical_offset, prev, kind)
