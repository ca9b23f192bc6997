"""Timer wheel slot, mqstore's own layout (after RocketMQ's RIP-43 TimerWheel slot, 32 bytes without a
checksum; ours is 32 bytes with one). Derived data: rebuilt from the timer log or the timer topic.

The wheel (``<data-dir>/timer/timerwheel``) is one file of ``slots`` of these, slot i at byte i * 32. The
slot of a time t (epoch ms) is ``(t // precision) % slots``; a slot holds the units of one precision-wide
span of time, its *slot time* (a multiple of the precision). A slot whose stored slot time is not the one
asked for is empty (it held an earlier turn of the wheel), as is an all-zero or CRC-failing slot.

  offset size field          meaning (big-endian)
  ------ ---- -------------- ----------------------------------------------------------------------
       0    8 slot time ms   the start of the span this slot holds now
       8    8 first position timer log position of the slot's first unit
      16    8 last position  timer log position of the slot's last unit (units chain backwards)
      24    4 count          units in the slot
      28    4 crc            zlib CRC32 of bytes 0..27
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

SLOT = struct.Struct(
    ">"
    "q"  # 0  slot time ms
    "q"  # 8  first position
    "q"  # 16 last position
    "i"  # 24 count
    "I"  # 28 crc
)
SLOT_SIZE = SLOT.size  # 32
_COVERED = struct.Struct(">qqqi")


@dataclass(frozen=True, slots=True)
class Slot:
    slot_ms: int
    first_position: int
    last_position: int
    count: int


def encode(slot: Slot) -> bytes:
    head = _COVERED.pack(slot.slot_ms, slot.first_position, slot.last_position, slot.count)
    return head + struct.pack(">I", zlib.crc32(head))


def decode(buf, position: int, slot_ms: int) -> Slot | None:
    """The slot at ``position`` if it holds ``slot_ms`` and passes its CRC; None when it is empty for that time."""
    got_ms, first, last, count, crc = SLOT.unpack_from(buf, position)
    if got_ms != slot_ms or count <= 0 or crc != zlib.crc32(bytes(buf[position:position + SLOT_SIZE - 4])):
        return None
    return Slot(got_ms, first, last, count)
