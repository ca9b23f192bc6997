"""Timer cancel set, mqstore's own format: the messages recalled (cancelled by message id) whose due time has not
passed by a whole wheel yet. Derived data (the cancel markers are records of the timer topic); replaced atomically
through mqstore.fs.replace_file at each timer checkpoint, before the checkpoint file, so it holds at least every
cancel the checkpoint's timer log end covers.

  offset size field       meaning (big-endian)
  ------ ---- ----------- -----------------------------------------------------------------------------
       0    4 magic       0x4D515458 ("MQTX")
       4    4 version     1
       8    4 count       n, at most MAX_ENTRIES
      12   16n entries    per recalled message: origin i64 (the queue offset of its first timer record),
                          due ms i64
  12+16n    4 crc         zlib CRC32 of every byte before it

A short or long file, a wrong magic or version, or a failed CRC is DataLoss: the timer rebuilds from its topic.
"""

from __future__ import annotations

import struct
import zlib

from mqstore.errors import DataLoss

MAGIC = 0x4D515458
VERSION = 1
HEAD = struct.Struct(">IIi")
ENTRY = struct.Struct(">qq")
MAX_ENTRIES = 10_000_000


def encode(cancels: dict[int, int]) -> bytes:
    body = HEAD.pack(MAGIC, VERSION, len(cancels)) + b"".join(
        ENTRY.pack(origin, due) for origin, due in sorted(cancels.items()))
    return body + struct.pack(">I", zlib.crc32(body))


def decode(data: bytes, where: str = "timer cancels") -> dict[int, int]:
    if len(data) < HEAD.size + 4:
        raise DataLoss(f"{where}: {len(data)} bytes, shorter than an empty cancel set")
    magic, version, count = HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise DataLoss(f"{where}: magic {magic:#x} version {version}, expected {MAGIC:#x} version {VERSION}")
    if not 0 <= count <= MAX_ENTRIES or len(data) != HEAD.size + count * ENTRY.size + 4:
        raise DataLoss(f"{where}: {len(data)} bytes do not hold {count} entries")
    (crc,) = struct.unpack_from(">I", data, len(data) - 4)
    if crc != zlib.crc32(data[:-4]):
        raise DataLoss(f"{where}: CRC mismatch")
    return dict(ENTRY.unpack_from(data, HEAD.size + i * ENTRY.size) for i in range(count))
