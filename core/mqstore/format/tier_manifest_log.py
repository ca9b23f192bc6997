"""The Index's tier manifest (mqstore.index.tier_manifest) on disk: an append-only log of fixed, checksummed
records, ``tier-manifest.log``, on top of a snapshot, ``tier-manifest.snapshot``. mqstore's own layout; the
source of truth for which index files live on the tier (the objects are not listed to find them).

**A record** (112 bytes, big-endian), one change of the manifest:

  offset  size  field              meaning
  ------- ----- ------------------ ----------------------------------------------------------------------
        0     4 crc                zlib CRC32 of bytes 4..111
        4     1 version            1
        5     1 kind               1 STARTED: a move's attempt began (its object may or may not exist)
                                   2 FINISHED: the file lives on the tier (the attempt's object verified)
                                   3 DISCARDED: the file's STARTED attempt is forgotten
                                   4 FORGOTTEN: the file's FINISHED entry is forgotten
        6     2 reserved           zero
        8     8 seq                the change's number: the snapshot's seq + 1 for the log's first record,
                                   then + 1 per record (0 in a snapshot)
       16     8 first offset       the file's first physical offset (it is ``<first:020d>.cidx``)
       24    16 attempt id         the attempt's id (its object key is ``index/<file name>.<id as 32 hex>``);
                                   zero for DISCARDED and FORGOTTEN
       40     8 size               the object's size in bytes (the compact file's), FINISHED only, else 0
       48    64 compact header     the compact file's 64-byte header (mqstore.format.compact_index, its
                                   own CRC), FINISHED only, else zero: a start opens tier files without
                                   calling the tier

**The log** is records only, each appended whole and fsynced before the change is relied on. A crash can
leave a torn tail: the records from the first one that does not check (short, CRC, version, kind) to the end
are cut, never served, when no record after it checks; a record that checks after one that does not is
damage (DataLoss, the start stops). Records of seq <= the snapshot's are ones a snapshot already holds
(a crash between the snapshot and the log's truncation): skipped, and the log truncated again.

**The snapshot** is the whole manifest at one seq, replaced whole through mqstore.fs.replace_file (temp
file, fsync, rename, directory fsync):

  offset  size  field              meaning (big-endian)
  ------- ----- ------------------ ----------------------------------------------------------------------
        0     4 magic              0x4D51544D ("MQTM")
        4     4 version            1
        8     8 seq                the last change it holds
       16     2 url length         L
       18     L url                the tier URL (UTF-8) the objects are on
   18 + L     4 count              n
   22 + L  112n records            STARTED and FINISHED records (seq 0), sorted by first offset and kind
                                   (a state: a file can have both, a FINISHED entry and a newer attempt)
  end - 4     4 crc                zlib CRC32 of every byte before it

A snapshot that does not check (short, long, magic, version, CRC) raises DataLoss naming the file.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqstore.errors import DataLoss

VERSION = 1
STARTED, FINISHED, DISCARDED, FORGOTTEN = 1, 2, 3, 4
KINDS = frozenset({STARTED, FINISHED, DISCARDED, FORGOTTEN})
RECORD = struct.Struct(
    ">"
    "I"    # 0  crc
    "B"    # 4  version
    "B"    # 5  kind
    "H"    # 6  reserved
    "q"    # 8  seq
    "q"    # 16 first physical offset
    "16s"  # 24 attempt id
    "q"    # 40 size
    "64s"  # 48 compact header
)
RECORD_SIZE = RECORD.size  # 112
HEADER_BYTES = 64
ATTEMPT_BYTES = 16
SNAPSHOT_HEAD = struct.Struct(">IIqH")
SNAPSHOT_MAGIC = 0x4D51544D
COUNT = struct.Struct(">I")
CRC = struct.Struct(">I")
_ZERO_ATTEMPT, _ZERO_HEADER = bytes(ATTEMPT_BYTES), bytes(HEADER_BYTES)


@dataclass(frozen=True, slots=True)
class Record:
    kind: int
    seq: int
    first_phy_offset: int
    attempt: bytes = _ZERO_ATTEMPT  # 16 bytes
    size: int = 0  # FINISHED
    header: bytes = _ZERO_HEADER  # 64 bytes (FINISHED)


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int
    url: str
    records: tuple[Record, ...]  # STARTED and FINISHED


def encode_record(record: Record) -> bytes:
    if record.kind not in KINDS or len(record.attempt) != ATTEMPT_BYTES or len(record.header) != HEADER_BYTES:
        raise ValueError(f"not a manifest record: {record}")
    body = RECORD.pack(0, VERSION, record.kind, 0, record.seq, record.first_phy_offset, record.attempt,
                       record.size, record.header)[4:]
    return CRC.pack(zlib.crc32(body)) + body


def _decode_record(data, at: int) -> Record | None:
    """The record at ``at``; None when it does not check."""
    if at + RECORD_SIZE > len(data):
        return None
    crc, version, kind, reserved, seq, first, attempt, size, header = RECORD.unpack_from(data, at)
    if crc != zlib.crc32(memoryview(data)[at + 4:at + RECORD_SIZE]) or version != VERSION or kind not in KINDS \
            or reserved:
        return None
    return Record(kind, seq, first, attempt, size, header)


def decode_log(data: bytes, where: str) -> tuple[list[Record], int]:
    """The log's records and the length of its valid prefix (shorter than ``data``: a torn tail to cut);
    DataLoss when a record checks after one that does not."""
    records, at = [], 0
    while (record := _decode_record(data, at)) is not None:
        records.append(record)
        at += RECORD_SIZE
    for later in range(at + RECORD_SIZE, len(data) - RECORD_SIZE + 1, RECORD_SIZE):
        if _decode_record(data, later) is not None:
            raise DataLoss(f"{where}: the record at byte {at} does not check but the one at byte {later} does: "
                           f"damage, not a torn tail")
    return records, at


def encode_snapshot(snapshot: Snapshot) -> bytes:
    url = snapshot.url.encode()
    parts = [SNAPSHOT_HEAD.pack(SNAPSHOT_MAGIC, VERSION, snapshot.seq, len(url)), url,
             COUNT.pack(len(snapshot.records))]
    for record in sorted(snapshot.records, key=lambda r: (r.first_phy_offset, r.kind)):
        if record.kind not in (STARTED, FINISHED):
            raise ValueError(f"a snapshot holds STARTED and FINISHED records only, not {record}")
        parts.append(encode_record(record))
    body = b"".join(parts)
    return body + CRC.pack(zlib.crc32(body))


def decode_snapshot(data: bytes, where: str) -> Snapshot:
    if len(data) < SNAPSHOT_HEAD.size + COUNT.size + CRC.size:
        raise DataLoss(f"{where}: {len(data)} bytes, shorter than a tier manifest snapshot")
    (crc,) = CRC.unpack_from(data, len(data) - CRC.size)
    if crc != zlib.crc32(memoryview(data)[:len(data) - CRC.size]):
        raise DataLoss(f"{where}: CRC mismatch (a damaged tier manifest snapshot)")
    magic, version, seq, url_length = SNAPSHOT_HEAD.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC or version != VERSION:
        raise DataLoss(f"{where}: magic {magic:#x} version {version}, expected {SNAPSHOT_MAGIC:#x} version {VERSION}")
    at = SNAPSHOT_HEAD.size + url_length
    if at + COUNT.size + CRC.size > len(data):
        raise DataLoss(f"{where}: its URL runs past the end")
    (count,) = COUNT.unpack_from(data, at)
    at += COUNT.size
    if at + count * RECORD_SIZE + CRC.size != len(data):
        raise DataLoss(f"{where}: {count} records announced in {len(data)} bytes")
    records = []
    for n in range(count):
        record = _decode_record(data, at + n * RECORD_SIZE)
        if record is None or record.kind not in (STARTED, FINISHED):
            raise DataLoss(f"{where}: record {n} does not check")
        records.append(record)
    try:
        url = data[SNAPSHOT_HEAD.size:SNAPSHOT_HEAD.size + url_length].decode()
    except UnicodeDecodeError:
        raise DataLoss(f"{where}: its URL is not UTF-8") from None
    return Snapshot(seq, url, tuple(records))
