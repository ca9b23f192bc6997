"""The Transaction service's checkpoint file ``<data-dir>/state.journal``: a header, then records, each
holding one JSON document (snapshot.py says what: the first a full snapshot, the rest deltas).

Derived data: the log holds every fact it records except check counts, last answers and the Stats
counters. Written by persist.Checkpointer: a delta is appended (write, fsync) every
``checkpoint_interval_ms`` when something changed; once the file has grown past its rebase size the
whole file is replaced by a new full snapshot through mqstore.fs.replace_file (temp file, fsync,
rename, fsync of the directory), so it stays about the size of the state it holds.

  header (8 bytes, big-endian)
  offset  size  field    meaning
  ------  ----  -------  ------------------------------------------------------------------------------
       0     4  magic    0x4D51544A ("MQTJ")
       4     4  version  1

  record (repeated to the end of the file, big-endian)
  offset  size  field    meaning
  ------  ----  -------  ------------------------------------------------------------------------------
       0     4  length   N, the bytes of the payload (at most MAX_RECORD_BYTES)
       4     4  crc      zlib CRC32 of the payload
       8     N  payload  UTF-8 JSON (snapshot.py)

Reading stops at the first record that is cut short or fails its CRC: a torn tail (a crash during an
append), or damage, after which nothing can be trusted. The records before it are a consistent state
(each names the log offset it is valid at), so the service starts from there and its follower reads
the rest of the log again; the event ``txn.checkpoint_tail_ignored`` names the bytes left out, and
the next save rewrites the file whole. A header that is not this one refuses the start (DataLoss naming
the file: delete it to rebuild the state from the log, losing only check counts and counters).
"""

from __future__ import annotations

import os
import pathlib
import struct
import zlib

import structlog

from mqstore import failpoints, fs
from mqstore.errors import DataLoss

log = structlog.get_logger("mqstore.txn.journal")

HEADER = struct.Struct(
    ">"
    "I"   # 0 magic
    "I"   # 4 version
)
RECORD = struct.Struct(
    ">"
    "I"   # 0 payload length
    "I"   # 4 CRC32 of the payload
)
MAGIC = 0x4D51544A
VERSION = 1
MAX_RECORD_BYTES = 256 << 20


def encode_header() -> bytes:
    return HEADER.pack(MAGIC, VERSION)


def encode_record(payload: bytes) -> bytes:
    if len(payload) > MAX_RECORD_BYTES:
        raise DataLoss(f"a checkpoint record of {len(payload)} bytes is over the limit {MAX_RECORD_BYTES}")
    return RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def decode(data: bytes, path: pathlib.Path) -> list[bytes]:
    """The payloads of the sound records, in order (see the module docstring for a bad one)."""
    if len(data) < HEADER.size:
        raise DataLoss(f"{path}: {len(data)} bytes, shorter than the checkpoint header; delete it to rebuild the "
                       f"transaction state from the log")
    magic, version = HEADER.unpack_from(data)
    if (magic, version) != (MAGIC, VERSION):
        raise DataLoss(f"{path}: magic 0x{magic:08X} version {version}, expected 0x{MAGIC:08X} version {VERSION}; "
                       f"delete it to rebuild the transaction state from the log")
    out, position = [], HEADER.size
    while position < len(data):
        sound = position + RECORD.size <= len(data)
        if sound:
            length, crc = RECORD.unpack_from(data, position)
            payload = data[position + RECORD.size:position + RECORD.size + length]
            sound = length <= MAX_RECORD_BYTES and len(payload) == length and zlib.crc32(payload) == crc
        if not sound:
            log.warning("txn.checkpoint_tail_ignored", path=str(path), position=position,
                        bytes_ignored=len(data) - position, why="a record cut short or failing its CRC: the state is "
                        "taken from the records before it; the follower reads the log again from there")
            break
        out.append(payload)
        position += RECORD.size + length
    return out


class JournalWriter:
    """Appends records to the file and replaces it whole. Not thread-safe: the checkpointer serialises."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self._file = None
        self.size = path.stat().st_size if path.exists() else 0

    def rewrite(self, payload: bytes) -> None:
        """The file becomes the header and this one record, atomically."""
        self.close()
        data = encode_header() + encode_record(payload)
        fs.replace_file(self.path, data, before_rename=lambda: failpoints.hit("txn.checkpoint.before_rename"))
        self.size = len(data)

    def append(self, payload: bytes) -> None:
        record = encode_record(payload)
        if self._file is None:
            self._file = open(self.path, "ab")  # kept open across appends; closed by close()
        self._file.write(record)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.size += len(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
