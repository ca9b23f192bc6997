"""Timer checkpoint, mqstore's own layout (RocketMQ's ``config/timercheck`` has seven longs and no checksum).
Replaced atomically through mqstore.fs.replace_file after the timer log and the wheel are fsynced, so every
claim below holds for the files on disk.

  offset size field                 meaning (big-endian)
  ------ ---- --------------------- ----------------------------------------------------------------
       0    4 magic                 0x4D515443 ("MQTC")
       4    4 version               1
       8    8 enqueue offset        every timer topic record below it has its unit in the timer log
      16    8 log end position      the timer log's units below it are fsynced (and their slots)
      24    8 read ms               every slot below this time was delivered completely
      32    8 read log end          the commit log's end when that slot was reached: every delivery of a
                                    later slot lies at or above it (recovery reads delivered records from
                                    there, so a crash never delivers twice)
      40    8 precision ms          the wheel's precision when written (another one rebuilds the wheel)
      48    4 slots                 the wheel's slot count when written (another one rebuilds the wheel)
      52    8 written at ms         when this checkpoint was written
      60    4 crc                   zlib CRC32 of bytes 0..59

A short file, a wrong magic or version, or a failed CRC is DataLoss: the timer rebuilds from the timer topic.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqstore.errors import DataLoss

MAGIC = 0x4D515443
VERSION = 1
BODY = struct.Struct(
    ">"
    "I"  # 0  magic
    "I"  # 4  version
    "q"  # 8  enqueue offset
    "q"  # 16 log end position
    "q"  # 24 read ms
    "q"  # 32 read log end
    "q"  # 40 precision ms
    "i"  # 48 slots
    "q"  # 52 written at ms
)
SIZE = BODY.size + 4  # 64


@dataclass(frozen=True, slots=True)
class TimerCheckpoint:
    enqueue_offset: int
    log_end_position: int
    read_ms: int
    read_log_end: int
    precision_ms: int
    slots: int
    written_at_ms: int


def encode(cp: TimerCheckpoint) -> bytes:
    body = BODY.pack(MAGIC, VERSION, cp.enqueue_offset, cp.log_end_position, cp.read_ms, cp.read_log_end,
                     cp.precision_ms, cp.slots, cp.written_at_ms)
    return body + struct.pack(">I", zlib.crc32(body))


def decode(data: bytes, where: str = "timer checkpoint") -> TimerCheckpoint:
    if len(data) != SIZE:
        raise DataLoss(f"{where}: {len(data)} bytes, a timer checkpoint has {SIZE}")
    magic, version, *fields = BODY.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise DataLoss(f"{where}: magic {magic:#x} version {version}, expected {MAGIC:#x} version {VERSION}")
    (crc,) = struct.unpack_from(">I", data, BODY.size)
    if crc != zlib.crc32(data[:BODY.size]):
        raise DataLoss(f"{where}: CRC mismatch")
    return TimerCheckpoint(*fields)
