"""Compaction log segments: the commit log's record format in files of their own (reference §6.2).

A compaction log holds the records of one topic/queue of a COMPACTION topic. Its address space is a
*position*, like the commit log's physical offset: the segment holding position p is the file named
by ``segment_base(p)`` (20 digits, mqstore.format.segment_name) plus ``.log``; each segment has
``segment_size_bytes`` of address space. A record is the commit log record byte for byte (layout:
mqstore.format.record), except:

  field            in the compaction log
  ---------------- -----------------------------------------------------------------------------
  PHYSICALOFFSET   rewritten to the record's position in the compaction log (as RocketMQ does)
  QUEUEOFFSET      kept: the original queue offset (compaction leaves holes, never renumbers)
  everything else  unchanged, BODYCRC included (the body is unchanged)

A record that does not fit in the rest of its segment (with room for a blank record) ends the
segment with the 8-byte blank record (TOTALSIZE = bytes left in the segment, MAGICCODE 0xCBD43194);
a sealed segment file is then exactly ``segment_size_bytes`` long (zeros after the blank), and the
record goes whole into the next segment. The active (last) segment's file ends at its last record.

Source of truth: after the commit log has expired a segment, this is the only copy of its keys.
Its sparse index (mqstore.format.sparse_queue) says where the valid data ends.
"""

from __future__ import annotations

from mqstore.errors import invariant
from mqstore.format import record, segment_name

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".cq"


def segment_base(position: int, segment_size_bytes: int) -> int:
    return position - position % segment_size_bytes


def log_name(base: int) -> str:
    return segment_name.name_for(base) + LOG_SUFFIX


def index_name(base: int) -> str:
    return segment_name.name_for(base) + INDEX_SUFFIX


def parse_log_name(name: str) -> int | None:
    """The base position of a log file name, None for any other file."""
    if not name.endswith(LOG_SUFFIX):
        return None
    try:
        return segment_name.parse(name[:-len(LOG_SUFFIX)])
    except ValueError:
        return None


def fits(position: int, size: int, segment_size_bytes: int) -> bool:
    """Whether a record of ``size`` bytes fits at ``position`` and leaves room for a blank record."""
    left = segment_size_bytes - position % segment_size_bytes
    return size + record.BLANK_SIZE <= left


def blank_for(position: int, segment_size_bytes: int) -> bytes:
    """The blank record that ends the segment of ``position`` there."""
    left = segment_size_bytes - position % segment_size_bytes
    invariant(left >= record.BLANK_SIZE, f"a blank record fits at position {position} ({left} bytes left)")
    return record.encode_blank(left)


def relocate(raw: bytes, position: int) -> bytes:
    """The record ``raw`` (one whole commit log record) with PHYSICALOFFSET set to ``position``."""
    out = bytearray(raw)
    record.INT64.pack_into(out, record.PHYSICAL_OFFSET_AT, position)
    return bytes(out)
