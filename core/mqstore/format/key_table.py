"""The key table checkpoint of one compaction log (mqstore.compaction.key_checkpoint): the latest queue offset
of every key among the records at positions below ``covered_end``, so a start reads only the records at or
above it instead of every segment (the tiered ones through object storage). mqstore's own layout. Derived
data, never the source of truth: replaced whole through mqstore.fs.replace_file (temp file, fsync, rename,
directory fsync), and a start uses it only when it checks out against the log's index (below), else it reads
every segment as before. File ``<queue dir>/keys.checkpoint``.

  offset  size  field            meaning (big-endian)
  ------- ----- ---------------- -------------------------------------------------------------------------
        0     4 magic            0x4D514B54 ("MQKT")
        4     4 version          1
        8     8 covered end      every record at a position below it (and no other) is in the table
       16     8 entry count      the index entries below ``covered end`` when written
       24    32 entries digest   SHA-256 of those entries (:func:`entries_digest`): a round that rewrote
                                 anything below ``covered end``, or a crash that cut the index there,
                                 changes it, and the checkpoint is stale
       56     8 written at ms    when it was written (clock time; for people)
       64     4 key count        n
       68     …  keys            n times: u32 key length L, L bytes of the key (UTF-8, surrogates
                                 passed), i64 queue offset
                                 of its latest record below ``covered end``; sorted by key bytes
  end - 4     4 crc              zlib CRC32 of every byte before it

**Entries digest**: SHA-256 over three columns of the entries in index order, one after the other: every
entry's i64 position, then every i32 size, then every i64 queue offset (big-endian); what decides where every
record lies and which offset it has.

A short or long file, a wrong magic or version, a CRC mismatch, a key that is not UTF-8 or not in order, or a
negative count raises DataLoss naming the file: the caller logs it and rebuilds from the segments.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass

from mqstore.errors import DataLoss, invariant

MAGIC = 0x4D514B54
VERSION = 1
HEAD = struct.Struct(
    ">"
    "I"    # 0  magic
    "I"    # 4  version
    "q"    # 8  covered end
    "q"    # 16 entry count
    "32s"  # 24 entries digest
    "q"    # 56 written at ms
    "I"    # 64 key count
)
KEY_LENGTH = struct.Struct(">I")
OFFSET = struct.Struct(">q")
CRC = struct.Struct(">I")
DIGEST_STEP = 1 << 16  # entries of a column hashed at a time
FILE_NAME = "keys.checkpoint"


@dataclass(frozen=True, slots=True)
class KeyTable:
    covered_end: int
    entry_count: int
    entries_digest: bytes
    written_at_ms: int
    latest: dict[str, int]


def entries_digest(positions: array, sizes: array, offsets: array, count: int) -> bytes:
    """SHA-256 of the first ``count`` index entries (the module docstring): whole columns, big-endian."""
    digest = hashlib.sha256()
    for column, width in ((positions, 8), (sizes, 4), (offsets, 8)):
        invariant(column.itemsize == width, f"an index column of {column.itemsize}-byte items, not {width}")
        for lo in range(0, count, DIGEST_STEP):  # (bounded pieces: no copy of a whole column)
            piece = column[lo:min(lo + DIGEST_STEP, count)]
            if sys.byteorder == "little":
                piece.byteswap()
            digest.update(piece.tobytes())
    return digest.digest()


def encode(table: KeyTable) -> bytes:
    parts = [HEAD.pack(MAGIC, VERSION, table.covered_end, table.entry_count, table.entries_digest,
                       table.written_at_ms, len(table.latest))]
    for key, raw in sorted((key.encode("utf-8", "surrogatepass"), key) for key in table.latest):
        parts += [KEY_LENGTH.pack(len(key)), key, OFFSET.pack(table.latest[raw])]
    body = b"".join(parts)
    return body + CRC.pack(zlib.crc32(body))


def decode(data: bytes, where: str = FILE_NAME) -> KeyTable:
    if len(data) < HEAD.size + CRC.size:
        raise DataLoss(f"{where}: {len(data)} bytes, shorter than a key table checkpoint's header")
    (crc,) = CRC.unpack_from(data, len(data) - CRC.size)
    if crc != zlib.crc32(memoryview(data)[:len(data) - CRC.size]):
        raise DataLoss(f"{where}: CRC mismatch (a torn or damaged key table checkpoint)")
    magic, version, covered_end, entry_count, digest, written_at_ms, count = HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise DataLoss(f"{where}: magic {magic:#x} version {version}, expected {MAGIC:#x} version {VERSION}")
    if covered_end < 0 or entry_count < 0:
        raise DataLoss(f"{where}: negative covered end {covered_end} or entry count {entry_count}")
    latest, at, end, previous = {}, HEAD.size, len(data) - CRC.size, None
    for _ in range(count):
        if at + KEY_LENGTH.size > end:
            raise DataLoss(f"{where}: {count} keys announced, the file ends after {len(latest)}")
        (length,) = KEY_LENGTH.unpack_from(data, at)
        key = data[at + KEY_LENGTH.size:at + KEY_LENGTH.size + length]
        at += KEY_LENGTH.size + length + OFFSET.size
        if at > end or (previous is not None and key <= previous):
            raise DataLoss(f"{where}: key {len(latest)} runs past the end or is out of order")
        try:
            latest[key.decode("utf-8", "surrogatepass")] = OFFSET.unpack_from(data, at - OFFSET.size)[0]
        except UnicodeDecodeError:
            raise DataLoss(f"{where}: key {len(latest)} is not UTF-8") from None
        previous = key
    if at != end:
        raise DataLoss(f"{where}: {end - at} bytes after the last of its {count} keys")
    return KeyTable(covered_end, entry_count, digest, written_at_ms, latest)
