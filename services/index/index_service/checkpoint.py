"""The index checkpoint: where the Tail follower resumes. mqstore's own format, 40 bytes.

Derived metadata, replaced atomically through mqstore.fs.replace_file, never updated in place. It is
written only after every index file holding entries below it has been flushed, so after kill -9 or a
power loss the follower re-feeds from it and loses nothing (re-feeding is idempotent).

  offset size field                  meaning (big-endian)
  ------ ---- ---------------------- --------------------------------------------------------------
       0    4 magic                  0x4D514958 ("MQIX")
       4    4 version                1
       8    8 next physical offset   every record below it is indexed and flushed
      16    8 written at ms          when this checkpoint was written (clock time)
      24    8 file physical offset   name (first physical offset) of the newest unsealed file, -1 if none
      32    4 file index count       that file's indexCount when it was flushed for this checkpoint
      36    4 crc                    zlib CRC32 of bytes 0..35

Entries numbered >= file index count in that file were written after the checkpoint and may be torn
by a power loss (mmap pages reach the disk in any order); they are checked on start.
A short file, a wrong magic or version, or a CRC mismatch raises CorruptIndexCheckpoint.
"""

from __future__ import annotations

import pathlib
import struct
import zlib
from dataclasses import dataclass

from mqstore import failpoints, fs
from mqstore.errors import DataLoss

MAGIC = 0x4D514958
VERSION = 1
BODY = struct.Struct(
    ">"
    "I"   # 0  magic
    "I"   # 4  version
    "q"   # 8  next physical offset
    "q"   # 16 written at ms
    "q"   # 24 file physical offset (-1: no unsealed file)
    "i"   # 32 file index count
)
CRC = struct.Struct(">I")  # 36 crc of bytes 0..35
SIZE = BODY.size + CRC.size  # 40
FILE_NAME = "index.checkpoint"


class CorruptIndexCheckpoint(DataLoss):
    """The checkpoint file fails its checks; ``path`` names it."""

    def __init__(self, path: pathlib.Path, reason: str):
        super().__init__(f"index checkpoint {path}: {reason}")
        self.path = str(path)


@dataclass(frozen=True, slots=True)
class IndexCheckpoint:
    next_physical_offset: int = 0
    written_at_ms: int = 0
    file_physical_offset: int = -1
    file_index_count: int = 0


def encode(cp: IndexCheckpoint) -> bytes:
    body = BODY.pack(MAGIC, VERSION, cp.next_physical_offset, cp.written_at_ms,
                     cp.file_physical_offset, cp.file_index_count)
    return body + CRC.pack(zlib.crc32(body))


def decode(data: bytes, path: pathlib.Path) -> IndexCheckpoint:
    if len(data) != SIZE:
        raise CorruptIndexCheckpoint(path, f"{len(data)} bytes, expected {SIZE}")
    (crc,) = CRC.unpack_from(data, BODY.size)
    if zlib.crc32(data[:BODY.size]) != crc:
        raise CorruptIndexCheckpoint(path, "CRC mismatch")
    magic, version, next_offset, written_ms, file_offset, file_count = BODY.unpack_from(data)
    if magic != MAGIC:
        raise CorruptIndexCheckpoint(path, f"magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    if version != VERSION:
        raise CorruptIndexCheckpoint(path, f"version {version}, this build reads {VERSION}")
    if next_offset < 0:
        raise CorruptIndexCheckpoint(path, f"negative physical offset {next_offset}")
    return IndexCheckpoint(next_offset, written_ms, file_offset, file_count)


def load(path: pathlib.Path) -> IndexCheckpoint | None:
    """The stored checkpoint, or None when there is none yet (a new index)."""
    if not path.exists():
        return None
    return decode(path.read_bytes(), path)


def save(path: pathlib.Path, cp: IndexCheckpoint) -> None:
    fs.replace_file(path, encode(cp),
                    before_rename=lambda: failpoints.hit("index.checkpoint.before_rename"))
