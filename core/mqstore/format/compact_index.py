"""Compact index layout (RIP-65's sealed format, adapted to our entry). Derived data, immutable.

A sealed IndexFile is rewritten so the entries of one hash bucket are contiguous: a query reads the
8-byte slot, then the bucket's run, i.e. at most two ranged reads per file, which is what makes
files on a second storage tier (object store, remote directory) cheap to query. All integers
big-endian.

  offset                 size          field
  ---------------------- ------------- ----------------------------------------------------------
  0                      64            header (below)
  64                     slotCount x 8 slots: (int position of the run, int length of the run in
                                       bytes); an empty bucket is (0, 0)
  64 + 8 x slotCount     entryCount x16 runs of entries, bucket 0 first; inside a run newest first
                                       (the order of the source chain)

Header (64 bytes):

  offset size field           meaning
  ------ ---- --------------- ------------------------------------------------------------------
       0    4 magic           0x4D514943 ("MQIC"); tells a compact file from anything else by content
       4    4 version         1
       8    8 beginTimestamp  as the source IndexFile: base of every timeDiff (ms)
      16    8 endTimestamp    store time (ms) of the newest entry
      24    8 beginPhyOffset  physical offset of the oldest entry's message
      32    8 endPhyOffset    physical offset of the newest entry's message
      40    4 hashSlotCount   non-empty buckets
      44    4 entryCount      entries in this file (= sum of run lengths / 16)
      48    4 slotCount       buckets; stored so a file read from another tier needs no config
      52    4 slotsCrc        zlib CRC32 of the slot table
      56    4 entriesCrc      zlib CRC32 of all runs
      60    4 headerCrc       zlib CRC32 of bytes 0..59

Entry (16 bytes): the IndexFile entry without its prevIndex pointer (a run needs no chain):

  offset size field      meaning
  ------ ---- ---------- ----------------------------------------------------------------------
       0    4 keyHash    abs(Java hashCode(key)), Integer.MIN_VALUE => 0
       4    8 phyOffset  commit log physical offset of the message
      12    4 timeDiff   seconds since beginTimestamp

Why not RIP-65's 28-byte header: it has no begin/end physical offsets (we need them for retention,
idempotent re-feeds and the rebuild ranges) and no slot count. Why not the IndexFile's 40-byte header
as is: a compact file must be recognisable by content and protected by a CRC, because on another tier
only ranged reads are cheap; the header is read and checked once when the file is opened, the slot
and entry CRCs by :func:`verify` after writing and before the source is deleted. Positions are
32-bit ints as in RIP-65, so a compact file is smaller than 2 GiB (the defaults give 360 MB).
"""

from __future__ import annotations

import os
import pathlib
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Protocol

from mqstore.errors import invariant
from mqstore.format.index_file import (DEFAULT_MAX_SCAN_ENTRIES, INT_MAX, CorruptIndexFile, IndexFile,
                                       ScanResult, accept, key_hash)

MAGIC = 0x4D514943
VERSION = 1
HEADER = struct.Struct(
    ">"
    "I"  # 0  magic
    "I"  # 4  version
    "q"  # 8  beginTimestamp (ms)
    "q"  # 16 endTimestamp (ms)
    "q"  # 24 beginPhyOffset
    "q"  # 32 endPhyOffset
    "i"  # 40 hashSlotCount
    "i"  # 44 entryCount
    "i"  # 48 slotCount
    "I"  # 52 slotsCrc
    "I"  # 56 entriesCrc
)
HEADER_CRC = struct.Struct(">I")  # 60 headerCrc
HEADER_SIZE = HEADER.size + HEADER_CRC.size  # 64
SLOT = struct.Struct(
    ">"
    "i"  # 0 absolute position of the run
    "i"  # 4 length of the run in bytes
)
ENTRY = struct.Struct(
    ">"
    "i"  # 0  keyHash
    "q"  # 4  phyOffset
    "i"  # 12 timeDiff (seconds)
)
SLOT_SIZE = SLOT.size  # 8
ENTRY_SIZE = ENTRY.size  # 16
_WRITE_CHUNK_BYTES = 1 << 20


class RangeReader(Protocol):
    """Where a compact file's bytes come from: a local file or another storage tier."""

    name: str
    size_bytes: int

    def read(self, position: int, length_bytes: int) -> bytes: ...


class FileRangeReader:
    """Ranged reads of a local file with pread. Thread-safe (pread has no shared position)."""

    def __init__(self, path: pathlib.Path):
        self.name = str(path)
        self._fd = os.open(path, os.O_RDONLY)
        self.size_bytes = os.fstat(self._fd).st_size
        self._lock = threading.Lock()

    def read(self, position: int, length_bytes: int) -> bytes:
        return os.pread(self._fd, length_bytes, position)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


@dataclass(frozen=True, slots=True)
class CompactHeader:
    begin_timestamp_ms: int
    end_timestamp_ms: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    entry_count: int
    slot_count: int
    slots_crc: int
    entries_crc: int

    def encode(self) -> bytes:
        body = HEADER.pack(MAGIC, VERSION, self.begin_timestamp_ms, self.end_timestamp_ms,
                           self.begin_phy_offset, self.end_phy_offset, self.hash_slot_count,
                           self.entry_count, self.slot_count, self.slots_crc, self.entries_crc)
        return body + HEADER_CRC.pack(zlib.crc32(body))

    @property
    def entries_at(self) -> int:
        return HEADER_SIZE + SLOT_SIZE * self.slot_count

    @property
    def size_bytes(self) -> int:
        return self.entries_at + ENTRY_SIZE * self.entry_count


def _read_exact(reader: RangeReader, position: int, length_bytes: int) -> bytes:
    data = reader.read(position, length_bytes)
    if len(data) != length_bytes:
        raise CorruptIndexFile(reader.name, f"short read: {len(data)} of {length_bytes} bytes at "
                                            f"position {position} (truncated?)")
    return data


def read_header(reader: RangeReader) -> CompactHeader:
    """One read; checks magic, version, CRC and the file size. Raises CorruptIndexFile."""
    data = _read_exact(reader, 0, HEADER_SIZE)
    body = data[:HEADER.size]
    (crc,) = HEADER_CRC.unpack_from(data, HEADER.size)
    magic, version, *fields = HEADER.unpack(body)
    if magic != MAGIC:
        raise CorruptIndexFile(reader.name, f"magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    if version != VERSION:
        raise CorruptIndexFile(reader.name, f"version {version}, this build reads {VERSION}")
    if zlib.crc32(body) != crc:
        raise CorruptIndexFile(reader.name, "header CRC mismatch")
    header = CompactHeader(*fields)
    if header.slot_count <= 0 or header.entry_count < 0 or header.size_bytes != reader.size_bytes:
        raise CorruptIndexFile(reader.name, f"size is {reader.size_bytes} bytes, header says "
                                            f"{header.size_bytes} ({header.slot_count} slots, "
                                            f"{header.entry_count} entries)")
    return header


def _compact(source: IndexFile, write_run) -> tuple[CompactHeader, bytes]:
    """Walk every bucket in slot order and hand each run to ``write_run(position, run)``; return the
    header and the slot table."""
    slots = bytearray(SLOT_SIZE * source.slot_count)
    entries_at = HEADER_SIZE + len(slots)
    position, entries_crc, used = entries_at, 0, 0
    for slot, head in enumerate(source.slot_heads()):
        if not head:
            continue
        run = b"".join(ENTRY.pack(e.key_hash, e.phy_offset, e.time_diff_s)
                       for _, e in source.chain(slot, head))
        SLOT.pack_into(slots, SLOT_SIZE * slot, position, len(run))
        write_run(position, run)
        entries_crc = zlib.crc32(run, entries_crc)
        position, used = position + len(run), used + 1
    h = source.header
    header = CompactHeader(h.begin_timestamp_ms, h.end_timestamp_ms, h.begin_phy_offset,
                           h.end_phy_offset, used, (position - entries_at) // ENTRY_SIZE,
                           source.slot_count, zlib.crc32(slots), entries_crc)
    return header, bytes(slots)


def _write_all(fd: int, data, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view[:_WRITE_CHUNK_BYTES], position)
        view, position = view[written:], position + written


def compact_to_file(source: IndexFile, out_path: pathlib.Path) -> CompactHeader:
    """Stream the compact form of a sealed ``source`` into a new file at ``out_path`` and fsync it.
    The caller renames it into place (mqstore.fs) once this returns."""
    invariant(source.slot_count * SLOT_SIZE + HEADER_SIZE
              + (source.entry_count - 1) * ENTRY_SIZE <= INT_MAX,
              f"{source.path}: a compact file would not fit 32-bit positions")
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        header, slots = _compact(source, lambda position, run: _write_all(fd, run, position))
        _write_all(fd, slots, HEADER_SIZE)
        _write_all(fd, header.encode(), 0)
        os.ftruncate(fd, header.size_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    return header


def compact_bytes(source: IndexFile) -> bytes:
    """The compact form in memory (golden tests, small files)."""
    runs: list[bytes] = []
    header, slots = _compact(source, lambda position, run: runs.append(run))
    return header.encode() + slots + b"".join(runs)


def verify(reader: RangeReader, header: CompactHeader) -> None:
    """Read everything once: CRCs, and runs that tile the entry region exactly. Raises CorruptIndexFile."""
    slots = _read_exact(reader, HEADER_SIZE, SLOT_SIZE * header.slot_count)
    if zlib.crc32(slots) != header.slots_crc:
        raise CorruptIndexFile(reader.name, "slot table CRC mismatch")
    expected, used = header.entries_at, 0
    for position, length in SLOT.iter_unpack(slots):
        if length:
            if position != expected or length % ENTRY_SIZE:
                raise CorruptIndexFile(reader.name, f"run at {position} length {length}, "
                                                    f"expected a run at {expected}")
            expected, used = expected + length, used + 1
    if expected != header.size_bytes or used != header.hash_slot_count:
        raise CorruptIndexFile(reader.name, "runs do not cover the entry region")
    crc = 0
    for position in range(header.entries_at, header.size_bytes, _WRITE_CHUNK_BYTES):
        length = min(_WRITE_CHUNK_BYTES, header.size_bytes - position)
        crc = zlib.crc32(_read_exact(reader, position, length), crc)
    if crc != header.entries_crc:
        raise CorruptIndexFile(reader.name, "entries CRC mismatch")


def _slot_run(reader: RangeReader, header: CompactHeader, slot: int) -> tuple[int, int]:
    position, length = SLOT.unpack(_read_exact(reader, HEADER_SIZE + SLOT_SIZE * slot, SLOT_SIZE))
    if length and (length % ENTRY_SIZE or position < header.entries_at
                   or position + length > header.size_bytes):
        raise CorruptIndexFile(reader.name, f"slot {slot}: run ({position}, {length}) outside the "
                                            f"entry region [{header.entries_at}, {header.size_bytes})")
    return position, length


def query(reader: RangeReader, header: CompactHeader, key: str | int, begin_ms: int, end_ms: int,
          max_num: int, *, max_scan_entries: int = DEFAULT_MAX_SCAN_ENTRIES,
          before_phy_offset: int | None = None, start_ordinal: int = 0) -> ScanResult:
    """Matches newest first with at most two reads: the slot, then up to ``max_scan_entries`` entries
    of its run from ``start_ordinal``. Same answers as IndexFile.query on the source file."""
    wanted = key_hash(key) if isinstance(key, str) else key
    result = ScanResult(next_ordinal=start_ordinal)
    if header.entry_count == 0 or begin_ms > end_ms:
        return result
    position, length = _slot_run(reader, header, wanted % header.slot_count)
    result.reads = 1
    run_entries = length // ENTRY_SIZE
    if start_ordinal >= run_entries:
        return result
    chunk_entries = min(run_entries - start_ordinal, max_scan_entries)
    data = _read_exact(reader, position + ENTRY_SIZE * start_ordinal, ENTRY_SIZE * chunk_entries)
    result.reads = 2
    for entry_hash, phy_offset, diff_s in ENTRY.iter_unpack(data):
        if len(result.matches) >= max_num:
            result.exhausted = False
            return result
        time_ms = header.begin_timestamp_ms + diff_s * 1000
        if time_ms < begin_ms:
            return result
        result.next_ordinal += 1
        accept(result, entry_hash, phy_offset, time_ms, wanted, begin_ms, end_ms, before_phy_offset)
    result.exhausted = start_ordinal + chunk_entries >= run_entries
    return result

