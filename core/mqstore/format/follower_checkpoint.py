"""The checkpoint of a Tail follower: where it resumes, plus a small fixed payload of its own.

Every service that follows the commit log (mqstore.follow) keeps one. The shape is the commit log's
checkpoint's (format/checkpoint.py: magic, version, offsets, written at, CRC), with a payload the user
defines once as a ``struct.Struct``; the user also picks the magic and version, so its files say
whose they are. Derived metadata, replaced atomically through mqstore.fs.replace_file, never updated
in place.

  offset  size field                  meaning (big-endian)
  ------- ---- ---------------------- --------------------------------------------------------------
        0    4 magic                  the user's (the index: 0x4D514958 "MQIX")
        4    4 version                the user's payload version
        8    8 next physical offset   every record below it is applied and durable
       16    8 written at ms          when this checkpoint was written (clock time)
       24    P payload                the user's fixed struct (the index: 12 bytes, see its checkpoint)
     24+P    4 crc                    zlib CRC32 of bytes 0 .. 23+P

A follower that has applied nothing yet has no checkpoint (``load`` answers None): "from the earliest
record" is not an offset, and 0 is one. A short or long file, a wrong magic or version, a CRC
mismatch or a negative offset raises :class:`CorruptCheckpoint` naming the file.
"""

from __future__ import annotations

import pathlib
import struct
import zlib
from dataclasses import dataclass
from typing import Callable

from mqstore import fs
from mqstore.errors import DataLoss

HEAD = struct.Struct(
    ">"
    "I"   # 0  magic
    "I"   # 4  version
    "q"   # 8  next physical offset
    "q"   # 16 written at ms
)
CRC = struct.Struct(">I")


class CorruptCheckpoint(DataLoss):
    """A checkpoint file fails its checks; ``path`` names it."""

    def __init__(self, what: str, path: pathlib.Path, reason: str):
        super().__init__(f"{what} {path}: {reason}")
        self.path = str(path)


@dataclass(frozen=True, slots=True)
class FollowerCheckpoint:
    next_physical_offset: int
    written_at_ms: int
    payload: tuple = ()


class CheckpointFormat:
    """One user's checkpoint layout: its magic, version and payload. Immutable, thread-safe."""

    def __init__(self, what: str, magic: int, version: int, payload: struct.Struct):
        self.what = what  # names the file in errors, e.g. "index checkpoint"
        self.magic, self.version, self.payload = magic, version, payload
        self.body = struct.Struct(HEAD.format + payload.format.lstrip("<>!=@"))
        self.size = self.body.size + CRC.size

    def encode(self, cp: FollowerCheckpoint) -> bytes:
        body = self.body.pack(self.magic, self.version, cp.next_physical_offset, cp.written_at_ms, *cp.payload)
        return body + CRC.pack(zlib.crc32(body))

    def decode(self, data: bytes, path: pathlib.Path) -> FollowerCheckpoint:
        if len(data) != self.size:
            raise CorruptCheckpoint(self.what, path, f"{len(data)} bytes, expected {self.size}")
        (crc,) = CRC.unpack_from(data, self.body.size)
        if zlib.crc32(data[:self.body.size]) != crc:
            raise CorruptCheckpoint(self.what, path, "CRC mismatch")
        magic, version, next_offset, written_ms, *payload = self.body.unpack_from(data)
        if magic != self.magic:
            raise CorruptCheckpoint(self.what, path, f"magic 0x{magic:08X}, expected 0x{self.magic:08X}")
        if version != self.version:
            raise CorruptCheckpoint(self.what, path, f"version {version}, this build reads {self.version}")
        if next_offset < 0:
            raise CorruptCheckpoint(self.what, path, f"negative physical offset {next_offset}")
        return FollowerCheckpoint(next_offset, written_ms, tuple(payload))

    def load(self, path: pathlib.Path) -> FollowerCheckpoint | None:
        """The stored checkpoint, or None when there is none yet."""
        if not path.exists():
            return None
        return self.decode(path.read_bytes(), path)

    def save(self, path: pathlib.Path, cp: FollowerCheckpoint,
             before_rename: Callable[[], None] | None = None) -> None:
        """Atomically (mqstore.fs.replace_file); ``before_rename`` is where a failpoint goes."""
        fs.replace_file(path, self.encode(cp), before_rename=before_rename)
