"""Consume queue entry, RocketMQ layout, 20 bytes (derived data: rebuilt from the commit log).

  offset size field             meaning (big-endian)
  ------ ---- ----------------- --------------------------------------------------------------
       0    8 physical offset   commit log offset of the message's record
       8    4 size              whole record size in bytes
      12    8 tag hash code     Java String.hashCode of TAGS, sign-extended; 0 when no tags

Entry n of a queue lives at byte n * 20 of the queue's address space; files are named by the byte
offset of their first entry (20 digits). No CRC: every entry is checked against the commit log record
it points at before it is served. An entry with physical offset < 0 or size <= 0 ends the valid data.
A "blank" filler entry (physical offset 0, size 0x7FFFFFFF, tag 0) marks offsets below a queue's
first real entry when a queue is rebuilt after the log's head was deleted.
"""

from __future__ import annotations

import struct

ENTRY = struct.Struct(
    ">"
    "q"  # 0  physical offset
    "i"  # 8  record size
    "q"  # 12 tag hash code
)
ENTRY_SIZE = ENTRY.size  # 20
BLANK_SIZE_FIELD = 0x7FFFFFFF
BLANK_ENTRY = ENTRY.pack(0, BLANK_SIZE_FIELD, 0)


def encode(physical_offset: int, size: int, tag_code: int) -> bytes:
    return ENTRY.pack(physical_offset, size, tag_code)


def decode(buf, position: int) -> tuple[int, int, int]:
    return ENTRY.unpack_from(buf, position)


def is_valid(physical_offset: int, size: int) -> bool:
    return physical_offset >= 0 and size > 0
