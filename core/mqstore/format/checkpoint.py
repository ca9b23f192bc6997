"""Store checkpoint, mqstore's own format (RocketMQ's has no version or CRC; ours does).

Derived metadata; replaced atomically through mqstore.fs.replace_file, never updated in place.
Version 2 (80 bytes) is written; version 1 (64 bytes, bytes 0..47 the same, then 12 reserved bytes
and the CRC at 60) is still read, with an empty checked range. Version 2 could not use v1's 12
reserved bytes: two 8-byte offsets do not fit, and narrower offsets would cap the log's address space.

  offset size field                      meaning (big-endian)
  ------ ---- -------------------------- ------------------------------------------------------------
       0    4 magic                      0x4D514350 ("MQCP")
       4    4 version                    2 (1: the 64-byte layout above)
       8    8 flushed physical offset    every record below it was covered by an fsync
      16    8 dispatched physical offset every record below it has its consume queue entry flushed
      24    8 physic msg timestamp ms    store time of the last flushed record
      32    8 logics msg timestamp ms    store time of the last record dispatched to consume queues
      40    8 written at ms              when this checkpoint was written
      48    8 checked from               every record in [checked from, checked to) passed its checks,
      56    8 checked to                 CRC included, when the store last started (empty: no claim)
      64   12 reserved                   zero
      76    4 crc                        zlib CRC32 of bytes 0..75 (version 1: of bytes 0..59, at 60)

A file that is short, has the wrong magic or version, or fails its CRC is rejected with DataLoss; the
store then re-checks the whole log (as if no checkpoint existed).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqstore.errors import DataLoss

MAGIC = 0x4D514350
VERSION = 2
PREFIX = struct.Struct(">II")  # magic, version: read first, they say which layout follows
BODY_V1 = struct.Struct(
    ">"
    "I"    # 0  magic
    "I"    # 4  version (1)
    "q"    # 8  flushed physical offset
    "q"    # 16 dispatched physical offset
    "q"    # 24 physic msg timestamp ms
    "q"    # 32 logics msg timestamp ms
    "q"    # 40 written at ms
    "12x"  # 48 reserved
)
BODY = struct.Struct(
    ">"
    "I"    # 0  magic
    "I"    # 4  version (2)
    "q"    # 8  flushed physical offset
    "q"    # 16 dispatched physical offset
    "q"    # 24 physic msg timestamp ms
    "q"    # 32 logics msg timestamp ms
    "q"    # 40 written at ms
    "q"    # 48 checked from
    "q"    # 56 checked to
    "12x"  # 64 reserved
)
CRC = struct.Struct(">I")
SIZE = BODY.size + CRC.size  # 80
SIZE_V1 = BODY_V1.size + CRC.size  # 64
_BODY_BY_VERSION = {1: BODY_V1, 2: BODY}


@dataclass(frozen=True, slots=True)
class Checkpoint:
    flushed_physical_offset: int = 0
    dispatched_physical_offset: int = 0
    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    written_at_ms: int = 0
    checked_from_physical_offset: int = 0
    checked_to_physical_offset: int = 0


def encode(cp: Checkpoint) -> bytes:
    body = BODY.pack(MAGIC, VERSION, cp.flushed_physical_offset, cp.dispatched_physical_offset,
                     cp.physic_msg_timestamp_ms, cp.logics_msg_timestamp_ms, cp.written_at_ms,
                     cp.checked_from_physical_offset, cp.checked_to_physical_offset)
    return body + CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> Checkpoint:
    if len(data) < PREFIX.size:
        raise DataLoss(f"checkpoint is {len(data)} bytes, expected {SIZE}")
    magic, version = PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise DataLoss(f"checkpoint magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    body_format = _BODY_BY_VERSION.get(version)
    if body_format is None:
        raise DataLoss(f"checkpoint version {version} is not supported (this build reads 1 and {VERSION})")
    if len(data) != body_format.size + CRC.size:
        raise DataLoss(f"checkpoint version {version} is {len(data)} bytes, expected {body_format.size + CRC.size}")
    body = data[:body_format.size]
    (crc,) = CRC.unpack_from(data, body_format.size)
    if zlib.crc32(body) != crc:
        raise DataLoss("checkpoint CRC mismatch")
    _, _, *fields = body_format.unpack(body)
    return Checkpoint(*fields)
