"""``<compaction logs>/<topic>/topic.incarnation``: which topic of a name a compactor's logs belong to.

A topic deleted and created again with the same name is another topic (mqstore.store_topics: its
``start_physical_offset`` differs). The compactor writes this file when it creates a topic's directory,
from the start_physical_offset of the topic whose first record it applies, so that the logs say which
topic they hold: a replica compares it with its primary's (ListQueues) and copies afresh when they
differ, and records of a newer topic of the name replace the logs of an older one. Derived metadata of
durable data, 20 bytes, written once through mqstore.fs.replace_file:

  offset size field                   meaning (big-endian)
  ------ ---- ----------------------- ---------------------------------------------------------------
       0    4 magic                   0x4D515449 ("MQTI")
       4    4 version                 1
       8    8 start physical offset   the topic's start_physical_offset (0: a topic older than it)
      16    4 crc                     zlib CRC32 of bytes 0..15

A topic directory without the file (written before it existed) holds a topic of offset 0. A file that
fails its checks raises DataLoss naming it.
"""

from __future__ import annotations

import pathlib
import struct
import zlib

from mqstore import fs
from mqstore.errors import DataLoss

NAME = "topic.incarnation"
MAGIC = 0x4D515449
VERSION = 1
LAYOUT = struct.Struct(
    ">"
    "I"  # 0  magic
    "I"  # 4  version
    "q"  # 8  start physical offset
    "I"  # 16 crc of bytes 0..15
)


def encode(start_physical_offset: int) -> bytes:
    body = LAYOUT.pack(MAGIC, VERSION, start_physical_offset, 0)[:16]
    return body + struct.pack(">I", zlib.crc32(body))


def decode(data: bytes, path: pathlib.Path) -> int:
    if len(data) != LAYOUT.size:
        raise DataLoss(f"{path}: {len(data)} bytes, a topic incarnation has {LAYOUT.size}")
    magic, version, start, crc = LAYOUT.unpack(data)
    if zlib.crc32(data[:16]) != crc or magic != MAGIC or version != VERSION or start < 0:
        raise DataLoss(f"{path}: not a topic incarnation of version {VERSION} (magic {magic:#x}, version "
                       f"{version}, start {start}, CRC {'ok' if zlib.crc32(data[:16]) == crc else 'bad'})")
    return start


def load(topic_dir: pathlib.Path) -> int:
    path = topic_dir / NAME
    return decode(path.read_bytes(), path) if path.exists() else 0


def save(topic_dir: pathlib.Path, start_physical_offset: int) -> None:
    fs.replace_file(topic_dir / NAME, encode(start_physical_offset))
