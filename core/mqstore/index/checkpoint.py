"""The index checkpoint: where the Tail follower resumes. A follower checkpoint (mqstore.format.
follower_checkpoint) with the index's magic and a 12-byte payload, 40 bytes in all.

It is written only after every index file holding entries below it has been flushed, so after kill -9
or a power loss the follower re-feeds from it and loses nothing (re-feeding is idempotent).

  offset size field                  meaning (big-endian)
  ------ ---- ---------------------- --------------------------------------------------------------
       0    4 magic                  0x4D514958 ("MQIX")
       4    4 version                1
       8    8 next physical offset   every record below it is indexed and flushed
      16    8 written at ms          when this checkpoint was written (clock time)
      24    8 file physical offset   payload: name (first physical offset) of the newest unsealed file,
                                     -1 if none
      32    4 file index count       payload: that file's indexCount when it was flushed for this
                                     checkpoint
      36    4 crc                    zlib CRC32 of bytes 0..35

Entries numbered >= file index count in that file were written after the checkpoint and may be torn
by a power loss (mmap pages reach the disk in any order); they are checked on start.
A short file, a wrong magic or version, or a CRC mismatch raises CorruptIndexCheckpoint.
"""

from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass

from mqstore import failpoints
from mqstore.format import follower_checkpoint as fcp

MAGIC = 0x4D514958
VERSION = 1
PAYLOAD = struct.Struct(
    ">"
    "q"   # 24 file physical offset (-1: no unsealed file)
    "i"   # 32 file index count
)
FORMAT = fcp.CheckpointFormat("index checkpoint", MAGIC, VERSION, PAYLOAD)
BODY, CRC, SIZE = FORMAT.body, fcp.CRC, FORMAT.size  # SIZE: 40
FILE_NAME = "index.checkpoint"
CorruptIndexCheckpoint = fcp.CorruptCheckpoint
_NO_FILE = -1  # on disk only


@dataclass(frozen=True, slots=True)
class IndexCheckpoint:
    next_physical_offset: int = 0
    written_at_ms: int = 0
    file_physical_offset: int | None = None   # the newest unsealed file, None if there is none
    file_index_count: int = 0


def encode(cp: IndexCheckpoint) -> bytes:
    return FORMAT.encode(_generic(cp))


def decode(data: bytes, path: pathlib.Path) -> IndexCheckpoint:
    return _index(FORMAT.decode(data, path))


def load(path: pathlib.Path) -> IndexCheckpoint | None:
    """The stored checkpoint, or None when there is none yet (a new index)."""
    cp = FORMAT.load(path)
    return None if cp is None else _index(cp)


def save(path: pathlib.Path, cp: IndexCheckpoint) -> None:
    FORMAT.save(path, _generic(cp), before_rename=lambda: failpoints.hit("index.checkpoint.before_rename"))


def _generic(cp: IndexCheckpoint) -> fcp.FollowerCheckpoint:
    file_offset = _NO_FILE if cp.file_physical_offset is None else cp.file_physical_offset
    return fcp.FollowerCheckpoint(cp.next_physical_offset, cp.written_at_ms, (file_offset, cp.file_index_count))


def _index(cp: fcp.FollowerCheckpoint) -> IndexCheckpoint:
    file_offset, file_count = cp.payload
    return IndexCheckpoint(cp.next_physical_offset, cp.written_at_ms,
                           None if file_offset == _NO_FILE else file_offset, file_count)
