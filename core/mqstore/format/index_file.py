"""IndexFile, RocketMQ's broker key index, byte for byte (derived data: rebuilt from the commit log).

File = header (40) | hash slots (slot_count x 4) | entries (entry_count x 20). All integers big-endian.
Defaults 5,000,000 slots and 20,000,000 entries => 420,000,040 bytes. No CRC (as in RocketMQ): the
header and the slot table are checked on open, every chain pointer is checked while walking.

Header (40 bytes):

  offset size field             meaning
  ------ ---- ----------------- ---------------------------------------------------------------
       0    8 beginTimestamp    store time (ms) of the first entry; the base of every timeDiff
       8    8 endTimestamp      store time (ms) of the last entry
      16    8 beginPhyOffset    physical offset of the first entry's message
      24    8 endPhyOffset      physical offset of the last entry's message
      32    4 hashSlotCount     number of non-empty slots
      36    4 indexCount        next entry number; starts at 1 (entry 0 is never used)

Slot (4 bytes) at 40 + 4*s: number of the newest entry of bucket s (0 = empty).
s = keyHash % slot_count.

Entry (20 bytes) number k at 40 + 4*slot_count + 20*k (k >= 1; capacity entry_count - 1):

  offset size field      meaning
  ------ ---- ---------- ----------------------------------------------------------------------
       0    4 keyHash    abs(Java String.hashCode(key)); Integer.MIN_VALUE => 0
       4    8 phyOffset  commit log physical offset of the message
      12    4 timeDiff   (storeTime - beginTimestamp) / 1000, SECONDS, clamped to [0, INT_MAX];
                         0 for the first entry (RocketMQ computes a rolled file's first entry
                         against the previous file's end time and then resets begin to the
                         entry's own time, so it reads back late; 0 reads back exactly)
      16    4 prevIndex  previous (older) entry of the same bucket; 0 ends the chain

Head insertion: a new entry points at the old slot head and becomes the head, so a chain is newest
first and its entry numbers strictly decrease (a walk that sees otherwise has found corruption).

Write order of one put (differs from RocketMQ on purpose): entry, then header, then slot. A crash
between them leaves an entry that no chain reaches yet (when the follower re-feeds the message at
endPhyOffset, :meth:`IndexFile.relink_last_message` finishes its slot writes), never a slot that
points past indexCount (RocketMQ then treats the whole bucket as empty and loses its older entries).

Time granularity is one second: an entry's time reads back as begin + timeDiff*1000, which is at most
999 ms earlier than its real store time. Queries compare that value with [begin_ms, end_ms] as RocketMQ
does; callers that must not miss a message widen begin_ms by 999 ms and check the real store time.
"""

from __future__ import annotations

import functools
import mmap
import os
import pathlib
import struct
from array import array
from dataclasses import dataclass, field

from mqstore import codec
from mqstore.disk_space import is_no_space
from mqstore.errors import DataLoss, ResourceExhausted, invariant
from mqstore.format import record
from mqstore.javahash import java_hash_continue, java_string_hash

HEADER = struct.Struct(
    ">"
    "q"  # 0  beginTimestamp (ms)
    "q"  # 8  endTimestamp (ms)
    "q"  # 16 beginPhyOffset
    "q"  # 24 endPhyOffset
    "i"  # 32 hashSlotCount
    "i"  # 36 indexCount (next entry number, starts at 1)
)
SLOT = struct.Struct(
    ">"
    "i"  # 0 newest entry number of the bucket (0 = empty)
)
ENTRY = struct.Struct(
    ">"
    "i"  # 0  keyHash
    "q"  # 4  phyOffset
    "i"  # 12 timeDiff (seconds since beginTimestamp)
    "i"  # 16 prevIndex
)
HEADER_SIZE = HEADER.size  # 40
SLOT_SIZE = SLOT.size  # 4
ENTRY_SIZE = ENTRY.size  # 20
INT_MAX = 0x7FFF_FFFF
INT_MIN = -0x8000_0000
DEFAULT_MAX_SCAN_ENTRIES = 16_384


class IndexFileFull(ResourceExhausted):
    """The file has no room for the entries asked for; the caller starts the next file."""


class CorruptIndexFile(DataLoss):
    """An index file fails a sanity check; ``path`` and ``reason`` say which file and what is wrong."""

    def __init__(self, path: pathlib.Path | str, reason: str):
        super().__init__(f"index file {path}: {reason}")
        self.path = str(path)
        self.reason = reason


def key_hash(key: str) -> int:
    """abs(Java hashCode) as RocketMQ's IndexFile; Integer.MIN_VALUE (whose abs overflows) => 0."""
    h = java_string_hash(key)
    return 0 if h == INT_MIN else abs(h)


def _key_hashes_python(prefix_state: int, suffixes) -> list[int]:
    """``key_hash(prefix + s)`` for each suffix, from ``java_hash_prefix(prefix)``: the hashes of
    ``topic#key`` for the keys of one message without building the strings."""
    out = []
    for suffix in suffixes:
        h = java_hash_continue(prefix_state, suffix)
        out.append(0 if h == INT_MIN else abs(h))
    return out


# The compiled hashes (mqstore.codec) when in use: the same results (tests/property/test_codec_scan.py).
key_hashes = (_key_hashes_python if codec.compiled is None
              else functools.partial(codec.compiled.key_hashes, fallback=java_hash_continue))
# The compiled put (IndexFile.put_columns) writes this layout and reads these record flags.
invariant(codec.compiled is None or codec.compiled.index_layout == {
    "tx_mask": record.SYSFLAG_TX_MASK, "tx_rollback": record.SYSFLAG_TX_ROLLBACK, "header_size": HEADER_SIZE,
    "slot_size": SLOT_SIZE, "entry_size": ENTRY_SIZE, "header": HEADER.format, "entry": ENTRY.format,
    "slot": SLOT.format}, "the compiled index build (mqstore.codec._index) disagrees with index_file's layout: "
                          "rebuild it (make setup) after changing the layout")


def file_size_bytes(slot_count: int, entry_count: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slot_count + ENTRY_SIZE * entry_count


def time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    if begin_timestamp_ms <= 0:
        return 0
    return min(max((store_timestamp_ms - begin_timestamp_ms) // 1000, 0), INT_MAX)


@dataclass(slots=True)
class Header:  # not frozen: one is built per indexed message; replaced whole, never mutated
    begin_timestamp_ms: int = 0
    end_timestamp_ms: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def encode(self) -> bytes:
        return HEADER.pack(self.begin_timestamp_ms, self.end_timestamp_ms, self.begin_phy_offset,
                           self.end_phy_offset, self.hash_slot_count, self.index_count)

    @classmethod
    def decode(cls, buf, position: int = 0) -> Header:
        return cls(*HEADER.unpack_from(buf, position))

    @property
    def entries(self) -> int:
        return self.index_count - 1


@dataclass(frozen=True, slots=True)
class Entry:
    key_hash: int
    phy_offset: int
    time_diff_s: int
    prev_index: int

    def encode(self) -> bytes:
        return ENTRY.pack(self.key_hash, self.phy_offset, self.time_diff_s, self.prev_index)


@dataclass(frozen=True, slots=True)
class Match:
    physical_offset: int
    timestamp_ms: int  # begin + timeDiff*1000: second granularity, never later than the real time


@dataclass(slots=True)
class ScanResult:
    """What one file query found and where it stopped.

    ``exhausted``: nothing older in this file can match (chain end or an entry older than begin_ms).
    Otherwise the scan stopped at max_num or max_scan_entries; ``next_entry`` (unsealed layout) and
    ``next_ordinal`` (position in the chain, both layouts) say where to continue.
    """

    matches: list[Match] = field(default_factory=list)
    next_entry: int = 0
    next_ordinal: int = 0
    exhausted: bool = True
    reads: int = 0


def accept(result: ScanResult, entry_hash: int, phy_offset: int, time_ms: int, wanted_hash: int,
           begin_ms: int, end_ms: int, before_phy_offset: int | None) -> None:
    """The match rule shared by both layouts, so they give the same answers."""
    if entry_hash != wanted_hash or not begin_ms <= time_ms <= end_ms:
        return
    if before_phy_offset is not None and phy_offset >= before_phy_offset:
        return
    result.matches.append(Match(phy_offset, time_ms))


class IndexFile:
    """One unsealed index file over a shared mmap.

    Not thread-safe: the owner serialises puts, flush and close. Once no more puts come (the file is
    sealed), ``query``, ``chain`` and ``contains`` may run from several threads at once.
    """

    def __init__(self, path: pathlib.Path, mm: mmap.mmap, slot_count: int, entry_count: int, fd: int = -1):
        self.path = path
        self._fd = fd  # kept open for fdatasync (the file may be renamed while open)
        self.slot_count = slot_count
        self.entry_count = entry_count
        self._mm = mm
        self._entries_at = HEADER_SIZE + SLOT_SIZE * slot_count
        self.header = Header.decode(mm, 0)

    @classmethod
    def create(cls, path: pathlib.Path, slot_count: int, entry_count: int, *,
               prev_end_phy_offset: int = 0, prev_end_timestamp_ms: int = 0) -> IndexFile:
        """A new zeroed file; begin/end start at the previous file's end values, as in RocketMQ.

        The file is allocated for real before it is mapped: a page of a mapping without a disk block
        behind it would be allocated by the write that first touches it, and on a full disk that
        write is a SIGBUS. So a full disk fails here, with ResourceExhausted and no file left."""
        invariant(slot_count > 0 and entry_count > 1, f"bad index file sizes {slot_count}/{entry_count}")
        size_bytes = file_size_bytes(slot_count, entry_count)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.posix_fallocate(fd, 0, size_bytes)
            mm = mmap.mmap(fd, 0)
        except BaseException as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            if is_no_space(exc):
                raise ResourceExhausted(f"disk full: cannot create index file {path} of {size_bytes} bytes; "
                                        f"free space (the index resumes from its checkpoint)") from exc
            raise
        header = Header(prev_end_timestamp_ms, prev_end_timestamp_ms, prev_end_phy_offset,
                        prev_end_phy_offset, 0, 1)
        mm[0:HEADER_SIZE] = header.encode()
        return cls(path, mm, slot_count, entry_count, fd)

    @classmethod
    def open(cls, path: pathlib.Path, slot_count: int, entry_count: int) -> IndexFile:
        """Map an existing file; raise CorruptIndexFile when its size, header or slots are not sane."""
        size_bytes = path.stat().st_size
        expected_bytes = file_size_bytes(slot_count, entry_count)
        if size_bytes != expected_bytes:
            raise CorruptIndexFile(path, f"size is {size_bytes} bytes, expected {expected_bytes} for "
                                         f"{slot_count} slots and {entry_count} entries (truncated?)")
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        file = cls(path, mm, slot_count, entry_count, fd)
        try:
            file._check()
        except CorruptIndexFile:
            file.close()
            raise
        return file

    def _check(self) -> None:
        h = self.header
        if not 1 <= h.index_count <= self.entry_count:
            self._corrupt(f"indexCount {h.index_count} outside [1, {self.entry_count}]")
        if not 0 <= h.hash_slot_count <= min(self.slot_count, h.entries):
            self._corrupt(f"hashSlotCount {h.hash_slot_count} with {h.entries} entries")
        if h.entries and not (0 <= h.begin_phy_offset <= h.end_phy_offset
                              and 0 <= h.begin_timestamp_ms <= h.end_timestamp_ms):
            self._corrupt(f"begin/end out of order: {h}")
        if h.entries:
            last = self.entry(h.index_count - 1)
            if last.phy_offset != h.end_phy_offset or last.prev_index >= h.index_count - 1:
                self._corrupt(f"last entry {last} disagrees with header {h}")
        slots = self.slot_heads()
        if slots and (min(slots) < 0 or max(slots) >= h.index_count):
            self._corrupt(f"a slot points outside [0, {h.index_count - 1}]")
        used = len(slots) - slots.count(0)
        if used != h.hash_slot_count:
            self._corrupt(f"{used} non-empty slots but hashSlotCount {h.hash_slot_count}")

    def _corrupt(self, reason: str):
        raise CorruptIndexFile(self.path, reason)

    # -- reading -------------------------------------------------------------------------------
    @property
    def free_entries(self) -> int:
        return self.entry_count - self.header.index_count

    def slot_head(self, slot: int) -> int:
        (head,) = SLOT.unpack_from(self._mm, HEADER_SIZE + SLOT_SIZE * slot)
        return head

    def slot_heads(self) -> array:
        """The whole slot table as native ints (one copy, C speed)."""
        slots = array("i")
        slots.frombytes(self._mm[HEADER_SIZE:self._entries_at])
        if struct.pack("=i", 1) != SLOT.pack(1):
            slots.byteswap()
        return slots

    def entry(self, number: int) -> Entry:
        return Entry(*ENTRY.unpack_from(self._mm, self._entries_at + ENTRY_SIZE * number))

    def entry_time_ms(self, entry: Entry) -> int:
        return self.header.begin_timestamp_ms + entry.time_diff_s * 1000

    def chain(self, slot: int, start_entry: int = 0):
        """Yield (entry number, Entry) of a bucket, newest first, checking every pointer."""
        number = start_entry or self.slot_head(slot)
        limit = self.header.index_count
        while number:
            if not 0 < number < limit:
                self._corrupt(f"slot {slot}: entry number {number} outside [1, {limit - 1}]")
            entry = self.entry(number)
            yield number, entry
            if entry.prev_index >= number:
                self._corrupt(f"slot {slot}: entry {number} points forward to {entry.prev_index}")
            number = entry.prev_index

    def contains(self, hash_: int, phy_offset: int) -> bool:
        """True if the bucket holds (hash, phy_offset). Walks only entries with phy >= phy_offset."""
        for _, entry in self.chain(hash_ % self.slot_count):
            if entry.phy_offset < phy_offset:
                return False
            if entry.key_hash == hash_ and entry.phy_offset == phy_offset:
                return True
        return False

    def query(self, key: str | int, begin_ms: int, end_ms: int, max_num: int, *,
              max_scan_entries: int = DEFAULT_MAX_SCAN_ENTRIES, before_phy_offset: int | None = None,
              start_entry: int = 0, start_ordinal: int = 0) -> ScanResult:
        """Matches of ``key`` (a string or its keyHash) newest first; at most ``max_scan_entries``
        chain entries are looked at. Resume a stopped scan with ``start_entry``/``start_ordinal``."""
        wanted = key_hash(key) if isinstance(key, str) else key
        result = ScanResult(next_ordinal=start_ordinal)
        if self.header.entries == 0 or begin_ms > end_ms:
            return result
        for number, entry in self.chain(wanted % self.slot_count, start_entry):
            if len(result.matches) >= max_num or result.next_ordinal - start_ordinal >= max_scan_entries:
                result.next_entry, result.exhausted = number, False
                return result
            time_ms = self.entry_time_ms(entry)
            if time_ms < begin_ms:
                return result
            result.next_ordinal += 1
            accept(result, entry.key_hash, entry.phy_offset, time_ms, wanted, begin_ms, end_ms,
                   before_phy_offset)
        return result

    # -- writing -------------------------------------------------------------------------------
    def put(self, key: str, phy_offset: int, store_timestamp_ms: int) -> None:
        self.put_hash(key_hash(key), phy_offset, store_timestamp_ms)

    def put_hash(self, hash_: int, phy_offset: int, store_timestamp_ms: int) -> None:
        """Head-insert one entry. Raise IndexFileFull when no entry is free. The caller skips
        messages below endPhyOffset (idempotent re-dispatch), as RocketMQ does."""
        h = self.header
        if h.index_count >= self.entry_count:
            raise IndexFileFull(f"index file {self.path} is full: {h.entries} of "
                                f"{self.entry_count - 1} entries used")
        invariant(0 <= hash_ <= INT_MAX, f"key hash {hash_} is not a non-negative int")
        slot = hash_ % self.slot_count
        old_head = self.slot_head(slot)
        if not 0 <= old_head < h.index_count:
            self._corrupt(f"slot {slot} points at {old_head}, indexCount is {h.index_count}")
        number = h.index_count
        first = h.entries == 0
        begin_ts = store_timestamp_ms if first else h.begin_timestamp_ms
        entry = Entry(hash_, phy_offset, time_diff_s(store_timestamp_ms, 0 if first else begin_ts),
                      old_head)
        ENTRY.pack_into(self._mm, self._entries_at + ENTRY_SIZE * number, *_fields(entry))
        self.header = Header(
            begin_timestamp_ms=begin_ts,
            end_timestamp_ms=store_timestamp_ms,
            begin_phy_offset=phy_offset if first else h.begin_phy_offset,
            end_phy_offset=phy_offset,
            hash_slot_count=h.hash_slot_count + (old_head == 0),
            index_count=number + 1,
        )
        self._mm[0:HEADER_SIZE] = self.header.encode()
        SLOT.pack_into(self._mm, HEADER_SIZE + SLOT_SIZE * slot, number)

    def put_hashes(self, hashes: list[int], phy_offset: int, store_timestamp_ms: int) -> None:
        """Head-insert the keys of one message: every entry, then the header once, then the slots
        (the order of put_hash, so a crash can only leave this message's entries unreachable, which
        relink_last_message repairs when the writer is fed the message at endPhyOffset again)."""
        h = self.header
        number = h.index_count
        if number + len(hashes) > self.entry_count:
            raise IndexFileFull(f"index file {self.path} has no room for {len(hashes)} more entries: "
                                f"{h.entries} of {self.entry_count - 1} used")
        first = number == 1
        begin_ts = store_timestamp_ms if first else h.begin_timestamp_ms
        # time_diff_s inlined: this runs once per indexed message
        diff = 0 if first or begin_ts <= 0 else min(max((store_timestamp_ms - begin_ts) // 1000, 0), INT_MAX)
        mm, slot_count, entries_at = self._mm, self.slot_count, self._entries_at
        heads: dict[int, int] = {}
        new_slots = 0
        for hash_ in hashes:
            if not 0 <= hash_ <= INT_MAX:
                invariant(False, f"key hash {hash_} is not a non-negative int")
            slot = hash_ % slot_count
            old = heads.get(slot)
            if old is None:
                old = SLOT.unpack_from(mm, HEADER_SIZE + SLOT_SIZE * slot)[0]
                if not 0 <= old < h.index_count:
                    self._corrupt(f"slot {slot} points at {old}, indexCount is {h.index_count}")
                new_slots += old == 0
            ENTRY.pack_into(mm, entries_at + ENTRY_SIZE * number, hash_, phy_offset, diff, old)
            heads[slot] = number
            number += 1
        begin_phy = phy_offset if first else h.begin_phy_offset
        self.header = Header(begin_ts, store_timestamp_ms, begin_phy, phy_offset, h.hash_slot_count + new_slots,
                             number)
        HEADER.pack_into(mm, 0, begin_ts, store_timestamp_ms, begin_phy, phy_offset, h.hash_slot_count + new_slots,
                         number)
        for slot, head in heads.items():
            SLOT.pack_into(mm, HEADER_SIZE + SLOT_SIZE * slot, head)

    def relink_last_message(self) -> int:
        """Finish the slot writes of the last put (the message at endPhyOffset), as put_hashes would
        have done them: a crash between the header and the slots leaves that message's entries counted
        but unreachable. Its entries are the trailing ones with that physical offset; each becomes its
        bucket's head unless the slot already points at it or a later one of them. Returns the number
        of slots written (0 when the put was whole). The result is byte for byte the untorn put."""
        h = self.header
        if h.entries == 0:
            return 0
        first = h.index_count
        while first > 1 and self.entry(first - 1).phy_offset == h.end_phy_offset:
            first -= 1
        written = 0
        for number in range(first, h.index_count):
            slot = self.entry(number).key_hash % self.slot_count
            if self.slot_head(slot) < number:
                SLOT.pack_into(self._mm, HEADER_SIZE + SLOT_SIZE * slot, number)
                written += 1
        return written

    def put_columns(self, columns, start: int) -> tuple[int, int, int]:
        """The compiled put_hashes for many messages (mqstore.codec IndexColumns from record ``start``):
        each message as put_hashes writes it, records without keys skipped, stopping before the first
        message that does not fit. Returns (record stopped at, messages put, records skipped); raises
        CorruptIndexFile as put_hashes does (the header then covers the messages put before)."""
        h = self.header
        stop, applied, skipped, fields, bad = columns.put(
            self._mm, self.slot_count, self.entry_count, (h.begin_timestamp_ms, h.end_timestamp_ms,
                                                          h.begin_phy_offset, h.end_phy_offset,
                                                          h.hash_slot_count, h.index_count), start)
        self.header = Header(*fields)
        if bad is not None:
            self._corrupt(f"slot {bad[0]} points at {bad[1]}, indexCount is {bad[2]}")
        return stop, applied, skipped

    def flush(self) -> None:
        """Durable when it returns. fdatasync covers pages dirtied through the mapping and, unlike
        mmap.flush over a 420 MB mapping, releases the GIL while it waits."""
        if self._fd >= 0:
            os.fdatasync(self._fd)
        else:
            self._mm.flush()

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._mm.closed


def _fields(entry: Entry) -> tuple[int, int, int, int]:
    return entry.key_hash, entry.phy_offset, entry.time_diff_s, entry.prev_index
