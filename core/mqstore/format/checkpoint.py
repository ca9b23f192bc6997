"""Store checkpoint, mqstore's own format (RocketMQ's has no version or CRC; ours does). 64 bytes.

Derived metadata; replaced atomically through mqstore.fs.replace_file, never updated in place.

  offset size field                      meaning (big-endian)
  ------ ---- -------------------------- ------------------------------------------------------------
       0    4 magic                      0x4D514350 ("MQCP")
       4    4 version                    1
       8    8 flushed physical offset    every record below it was covered by an fsync
      16    8 dispatched physical offset every record below it has its consume queue entry flushed
      24    8 physic msg timestamp ms    store time of the last flushed record
      32    8 logics msg timestamp ms    store time of the last record dispatched to consume queues
      40    8 written at ms              when this checkpoint was written
      48   12 reserved                   zero
      60    4 crc                        zlib CRC32 of bytes 0..59

A file that is short, has the wrong magic or version, or fails its CRC is rejected with DataLoss; the
store then re-checks the whole log (as if no checkpoint existed).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqstore.errors import DataLoss

MAGIC = 0x4D514350
VERSION = 1
BODY = struct.Struct(
    ">"
    "I"    # 0  magic
    "I"    # 4  version
    "q"    # 8  flushed physical offset
    "q"    # 16 dispatched physical offset
    "q"    # 24 physic msg timestamp ms
    "q"    # 32 logics msg timestamp ms
    "q"    # 40 written at ms
    "12x"  # 48 reserved
)
CRC = struct.Struct(">I")
SIZE = BODY.size + CRC.size  # 64


@dataclass(frozen=True, slots=True)
class Checkpoint:
    flushed_physical_offset: int = 0
    dispatched_physical_offset: int = 0
    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    written_at_ms: int = 0


def encode(cp: Checkpoint) -> bytes:
    body = BODY.pack(MAGIC, VERSION, cp.flushed_physical_offset, cp.dispatched_physical_offset,
                     cp.physic_msg_timestamp_ms, cp.logics_msg_timestamp_ms, cp.written_at_ms)
    return body + CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> Checkpoint:
    if len(data) != SIZE:
        raise DataLoss(f"checkpoint is {len(data)} bytes, expected {SIZE}")
    body = data[:BODY.size]
    (crc,) = CRC.unpack_from(data, BODY.size)
    if zlib.crc32(body) != crc:
        raise DataLoss("checkpoint CRC mismatch")
    magic, version, flushed, dispatched, physic_ts, logics_ts, written = BODY.unpack(body)
    if magic != MAGIC:
        raise DataLoss(f"checkpoint magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    if version != VERSION:
        raise DataLoss(f"checkpoint version {version} is not supported (this build reads {VERSION})")
    return Checkpoint(flushed, dispatched, physic_ts, logics_ts, written)
