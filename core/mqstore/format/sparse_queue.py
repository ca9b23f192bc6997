"""Sparse queue index entry of a compaction log, 46 bytes (RocketMQ's BatchConsumeQueue / SparseConsumeQueue
entry, reference §3.1 and §3.4). Derived from its compaction log segment, but rewritten only together with
it (a round installs both in one staged install); on start it is the source of truth for where the
segment's valid data ends (RocketMQ's rule: the log is cut to the end of the last valid entry).

  offset size field                meaning (big-endian)
  ------ ---- -------------------- -----------------------------------------------------------------
       0    8 position             compaction log position of the record (its PHYSICALOFFSET there)
       8    4 size                 whole record size in bytes
      12    8 tag hash code        Java String.hashCode of TAGS, sign-extended; 0 when no tags
      20    8 store timestamp      ms, the record's STORETIMESTAMP
      28    8 queue offset         the record's original queue offset (msgBaseOffset; holes allowed)
      36    2 batch size           always 1 (one message per record)
      38    8 tombstone seen at    ms since the epoch of the round that first mapped this tombstone
                                   (signed; where RocketMQ has its 4-byte compacted offset and 4 reserved
                                   bytes): 0 = not a tombstone, or not yet seen by a round. A tombstone is
                                   removed by the first round at or after seen-at + delete_retention_ms.

Entries written before milliseconds (layout 1) kept RocketMQ's compacted offset there, -1 in bytes
38..42, and the seen-at time in whole *seconds* (unsigned) in 42..46. Read as one signed 64-bit field
such an entry is negative (its top bit is set), which no time in ms is: :func:`decode` takes the low
32 bits as seconds and gives seen-at = seconds x 1000, so old files read correctly; a round rewrites
them in this layout. (Seconds let a tombstone go up to 999 ms before its retention ended.)

One index file per compaction log segment, with the same name (``<20 digits>.cq`` next to
``<20 digits>.log``), holding the entries of that segment's records in log order; queue offsets grow
strictly along the files. There is no CRC (as in RocketMQ): every entry is checked against the record
it points at when it is read. A valid entry has position >= 0, size > 0, queue offset >= 0 and batch
size 1; a file whose length is not a multiple of 46 has a torn last entry (cut on start).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

ENTRY = struct.Struct(
    ">"
    "q"  # 0  position in the compaction log
    "i"  # 8  record size
    "q"  # 12 tag hash code
    "q"  # 20 store timestamp ms
    "q"  # 28 queue offset (original)
    "h"  # 36 batch size (1)
    "q"  # 38 tombstone seen at, ms (0: none; negative: layout 1, see the docstring)
)
ENTRY_SIZE = ENTRY.size  # 46
_SECONDS_MASK = 0xFFFF_FFFF  # layout 1: the low 32 bits of the field were the seconds


@dataclass(frozen=True, slots=True)
class SparseEntry:
    position: int
    size: int
    tag_code: int
    store_timestamp_ms: int
    queue_offset: int
    tombstone_seen_ms: int = 0


def encode(entry: SparseEntry) -> bytes:
    return ENTRY.pack(entry.position, entry.size, entry.tag_code, entry.store_timestamp_ms, entry.queue_offset, 1,
                      entry.tombstone_seen_ms)


def decode(buf, at: int) -> SparseEntry | None:
    """The entry at byte ``at``, or None when it is not a valid entry (the end of the valid data)."""
    position, size, tag, store_ms, queue_offset, batch, seen = ENTRY.unpack_from(buf, at)
    if position < 0 or size <= 0 or queue_offset < 0 or batch != 1:
        return None
    if seen < 0:  # layout 1: -1 (compacted offset) in the high half, seconds in the low half
        seen = (seen & _SECONDS_MASK) * 1000
    return SparseEntry(position, size, tag, store_ms, queue_offset, seen)


def decode_all(data: bytes) -> tuple[list[SparseEntry], int]:
    """The valid entries of a whole file, and the byte length they cover (a torn or invalid tail after it)."""
    entries = []
    for at in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        entry = decode(data, at)
        if entry is None:
            break
        entries.append(entry)
    return entries, len(entries) * ENTRY_SIZE
