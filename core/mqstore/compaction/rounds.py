"""A round over one queue's compaction log: one pass, linear in the data at any map budget.

A round (reference §6.4, without its cliffs; Kafka's cleaner reads and rewrites each segment once too):
  1. take the sealed segments (never the active one) and the dirty range: records after the cleaned
     offset and older than min_compaction_lag_ms;
  2. mark: read the sealed records up to the dirty range's end once, a segment per call of the compiled
     walk (:data:`segment_keys`: the keys' MD5 digests computed in C, no object per record); spill each
     keyed record's (MD5 digest, entry index) pair to one of P buckets by the digest's first 4 bytes, P =
     ceil(1.25 x dirty records / the map's capacity), into ``staging/spill/`` (a buffer per bucket,
     all of them together about the budget, at most 64 KiB each plus the share of the segment just
     read: 24 bytes per record of one segment at most); set a bit per tombstone. Then per
     bucket: put its dirty pairs into the offset map (offset_map.py; later wins), and mark every pair
     of the bucket whose key maps to a later record in the *superseded* bitset (one bit per sealed
     record). A bucket whose dirty keys do not fit the map is split in two by the next digest bit and
     each half done alike (so a round never fails for its budget: memory is the map, the buffers and
     two bitsets);
  3. rewrite with the one writer (writer.py) into ``staging/``, from the first sealed segment that
     changes (a superseded record, a tombstone to stamp seen-at or past seen-at +
     delete_retention_ms) to the last: the segments below it are kept as they are (their bytes are
     what the writer would write again), those from it on are written once, packed from its base;
  4. install the output and the new round state with mqstore.fs.install (all or nothing, crash-safe,
     the failpoint ``compaction.round.staged`` between 3 and 4), the cleaned offset now being the dirty
     range's last offset.
The mapping step is the engine's: the local one here (the buckets), or the Spark job's (key digest ->
latest offset over the whole dirty range, as an offset map handed to :func:`write_pass`); both mark
the same records and write through :func:`write_marked`, so their files are byte-identical.
``RoundStats.passes`` counts the offset map's fillings (buckets): more than one when the dirty keys
did not fit the budget.
"""

from __future__ import annotations

import bisect
from array import array
import math
import re
import os
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Callable, Iterator

from mqstore import codec, failpoints
from mqstore.errors import invariant
from mqstore.format import codec_layout  # noqa: F401  (checks the compiled codec's layouts, at import)
from mqstore.format import compaction_segment as cseg
from mqstore.format.record import PROPERTY_KEYS
from mqstore.format.record_reader import body_length_and_properties, body_of, find_property

from mqstore import message_keys as ckey
from .offset_map import PAIR, OffsetMap, capacity_of, digest
from .policy import CompactionConfig, tombstone_expired
from .qlog import Entries, QueueLog
from .qlog_files import STAGING
from .writer import RoundWriter

SPILL = "spill"              # the buckets' files, inside staging/ (gone with it)
BUCKETS_PER_CAPACITY = 1.25  # P = ceil(1.25 x dirty records / capacity): few buckets overflow the map
BUFFER_BYTES = 64 << 10      # a bucket's pairs held in memory before they go to its file
CHUNK_PAIRS = 1 << 15        # pairs read back from a bucket's file at a time
_NONZERO = re.compile(rb"[^\x00]")


@dataclass
class RoundStats:
    passes: int = 0                # the offset map's fillings (buckets): > 1 when the keys did not fit
    records_in: int = 0            # sealed records of the round
    records_out: int = 0           # ... kept
    records_rewritten: int = 0     # ... written again (from the first segment that changes)
    bytes_reclaimed: int = 0
    keys_mapped: int = 0           # dirty keys mapped, over all buckets
    records_removed: int = 0       # superseded records removed
    tombstones_removed: int = 0
    tombstones_pending: int = 0    # kept tombstones (within their retention)
    removed_keys: dict = field(default_factory=dict)  # key -> offset of the tombstone removed with it
    last_entries: Entries | None = None  # the index of the rewritten segments, and the new state
    last_state: dict | None = None
    rewritten_from: int = 0        # the position of the first rewritten segment (the ones below are kept)


@dataclass(frozen=True)
class Sealed:
    """The sealed segments a round works on: read-only, immutable while the queue's round lock is held."""

    directory: pathlib.Path
    segment_size: int
    bases: list[int]
    entries: Entries
    read: Callable[[int], bytes] | None = None  # base -> the segment's bytes (QueueLog.segment_bytes: local or
    # in the tier); None: the local file


@dataclass
class Marks:
    """What a round changes, one bit per sealed record (bit i % 8 of byte i // 8): ``superseded`` (a later
    record of its key is in the dirty range) and ``tombstones`` (a keyed tombstone at or below ``last``,
    the dirty range's last offset: the records a round may stamp or expire)."""

    superseded: bytearray
    tombstones: bytearray
    last: int


def _bit(bits: bytearray, i: int) -> bool:
    return bool(bits[i >> 3] >> (i & 7) & 1)


def _set(bits: bytearray, i: int) -> None:
    bits[i >> 3] |= 1 << (i & 7)


def sealed_segments(src: Sealed, lo: int, hi: int) -> Iterator[tuple[int, int, int, memoryview]]:
    """(base, first entry, end entry, the segment's bytes) of each sealed segment holding entries of [lo, hi):
    entries [first, end) are its, one segment in memory at a time."""
    entries, i = src.entries, lo
    positions = entries.positions
    for base in src.bases:
        end = base + src.segment_size
        if i >= hi or positions[i] >= end:
            continue
        first = i
        i = min(hi, bisect.bisect_left(positions, end, i, hi))
        data = src.read(base) if src.read else (src.directory / cseg.log_name(base)).read_bytes()
        yield base, first, i, memoryview(data)
    invariant(i >= hi, f"the segments of {src.directory} hold the entries of their index")


def sealed_raw(src: Sealed, lo: int, hi: int) -> Iterator[tuple]:
    """(index, raw record) of entries [lo, hi), one segment in memory at a time."""
    positions, sizes = src.entries.positions, src.entries.sizes
    for base, first, end, data in sealed_segments(src, lo, hi):
        for i in range(first, end):
            at = positions[i] - base
            yield i, data[at:at + sizes[i]]


def sealed_records(src: Sealed, lo: int, hi: int) -> Iterator[tuple]:
    """(index, raw record, key, is tombstone) of entries [lo, hi), one segment in memory at a time."""
    for i, raw in sealed_raw(src, lo, hi):
        yield i, raw, *key_and_tombstone(raw)


def dirty_range(entries: Entries, cleaned: int, now_ms: int, config: CompactionConfig) -> tuple[int, int]:
    """[lo, hi): the entries after the cleaned offset and older than min_compaction_lag_ms."""
    n = len(entries)
    lo = bisect.bisect_right(entries.offsets, cleaned, 0, n)
    return lo, max(lo, bisect.bisect_right(entries.store_ms, now_ms - config.min_compaction_lag_ms, lo, n))


def key_and_tombstone(raw) -> tuple[str | None, bool]:
    """The compaction key of one record and whether it is a tombstone."""
    if _compiled_fields is not None:
        key, tombstone, _ = _compiled_fields(raw)
        return key, tombstone
    body_length, props = body_length_and_properties(raw)
    return ckey.first_key(find_property(props, PROPERTY_KEYS)), ckey.is_tombstone(body_length, props)


def compaction_fields_python(raw) -> tuple[str | None, bool, bytes]:
    """(key, is tombstone, body) of one valid record: the reference of the codec's compaction_fields."""
    body_length, props = body_length_and_properties(raw)
    return (ckey.first_key(find_property(props, PROPERTY_KEYS)), ckey.is_tombstone(body_length, props),
            body_of(raw))


_compiled_fields = codec.compiled.compaction_fields if codec.compiled is not None else None
compaction_fields = _compiled_fields or compaction_fields_python


def segment_keys_python(data, positions, sizes, base: int, first: int, buckets: int) -> tuple[list, bytearray]:
    """A segment's keyed records in one call (the reference of the codec's ``_scan.segment_keys``): ``data``
    holds the segment whose first byte is at ``base``, record k is ``data[positions[k] - base:][:sizes[k]]``,
    entry ``first + k`` of the round. (pairs, tombstones): ``buckets`` bytearrays of (digest of the record's
    compaction key, entry) pairs (:data:`PAIR`), a pair in bucket ``(digest[:4] big-endian x buckets) >> 32``,
    in log order; and the keyed tombstones' entries (int64, native order) in log order. Keyless records are
    left out."""
    if len(sizes) != len(positions):
        raise ValueError(f"{len(positions)} positions but {len(sizes)} sizes")
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, not {buckets}")
    parts, tombstones, pack = [bytearray() for _ in range(buckets)], array("q"), PAIR.pack
    for k in range(len(positions)):
        at, size = positions[k] - base, sizes[k]
        if at < 0 or size < 0 or at + size > len(data):
            raise ValueError(f"record {k} ({size} bytes at {positions[k]}) is not inside the segment at {base} "
                             f"({len(data)} bytes)")
        key, tombstone, _ = compaction_fields_python(data[at:at + size])
        if key is None:
            continue
        d = digest(key)
        parts[(int.from_bytes(d[:4], "big") * buckets) >> 32] += pack(d, first + k)
        if tombstone:
            tombstones.append(first + k)
    return parts, bytearray(tombstones.tobytes())


segment_keys = codec.compiled.segment_keys if codec.compiled is not None else segment_keys_python


# ---- the local engine: marks through buckets ----------------------------------------------------------------

def mark_local(src: Sealed, lo: int, hi: int, cleaned: int, budget: int, spill: pathlib.Path,
               stats: RoundStats, progress: Callable[[RoundStats], None] = lambda stats: None) -> Marks:
    """The marks of a round over the dirty range [lo, hi) (after ``cleaned``) with an offset map of
    ``budget`` bytes (the module docstring, step 2); ``spill`` is created for the buckets' files."""
    n = len(src.entries)
    marks = Marks(bytearray((n + 7) // 8), bytearray((n + 7) // 8),
                  max(cleaned, src.entries.offsets[hi - 1] if hi > lo else cleaned))
    omap = OffsetMap(budget)
    count = max(1, math.ceil(BUCKETS_PER_CAPACITY * (hi - lo) / capacity_of(budget)))
    spill.mkdir()
    limit = max(PAIR.size, min(BUFFER_BYTES, budget // count))  # all the buffers together: about the budget
    buckets = [_Bucket(spill / f"{b}", limit) for b in range(count)]
    positions, sizes = src.entries.positions, src.entries.sizes
    for base, first, end, data in sealed_segments(src, 0, hi):
        # a keyless record (written before keys were required) is left out: kept as it is
        parts, tombstones = segment_keys(data, positions[first:end], sizes[first:end], base, first, count)
        for i in array("q", tombstones):
            _set(marks.tombstones, i)
        for bucket, pairs in zip(buckets, parts, strict=True):
            if pairs:
                bucket.add(pairs)
    for bucket in buckets:
        _resolve(bucket, omap, lo, marks.superseded, 0, stats, progress)
    return marks


class _Bucket:
    """One bucket's pairs: a file plus a buffer (the buffer goes to the file when it is full)."""

    def __init__(self, path: pathlib.Path, limit: int):
        self.path, self.limit, self.buffer, self.spilled = path, limit, bytearray(), False

    def add(self, pair: bytes) -> None:
        self.buffer += pair
        if len(self.buffer) >= self.limit:
            self.flush()

    def flush(self) -> None:
        with open(self.path, "ab") as f:
            f.write(self.buffer)
        self.buffer.clear()
        self.spilled = True

    def chunks(self) -> Iterator[bytes]:
        """The pairs in the order added, CHUNK_PAIRS at a time."""
        if self.spilled:
            with open(self.path, "rb") as f:
                while chunk := f.read(CHUNK_PAIRS * PAIR.size):
                    yield chunk
        if self.buffer:
            yield bytes(self.buffer)

    def drop(self) -> None:
        if self.spilled:
            os.unlink(self.path)
        self.buffer = bytearray()


def _resolve(bucket: _Bucket, omap, lo: int, superseded: bytearray, level: int, stats: RoundStats,
             progress: Callable[[RoundStats], None]) -> None:
    """Map the bucket's dirty pairs (index >= lo), then mark its superseded pairs; if its dirty keys do not
    fit the map, split it in two by digest bit ``level`` (of bytes 4..15) and resolve each half."""
    omap.clear()
    fits = True
    for chunk in bucket.chunks():
        if omap.put_pairs(chunk, lo) < len(chunk) // PAIR.size:
            fits = False
            break
    if fits:
        stats.passes += len(omap) > 0  # (a bucket without dirty keys fills nothing)
        stats.keys_mapped += len(omap)
        for chunk in bucket.chunks():
            omap.mark_superseded(chunk, superseded)
        bucket.drop()
        progress(stats)
        return
    invariant(level < 96, "a bucket whose keys do not fit the map splits by the digests' bits")
    halves = [_Bucket(bucket.path.with_name(f"{bucket.path.name}.{half}"), bucket.limit) for half in (0, 1)]
    byte, shift = 4 + level // 8, 7 - level % 8
    for chunk in bucket.chunks():
        for at in range(0, len(chunk), PAIR.size):
            halves[chunk[at + byte] >> shift & 1].add(chunk[at:at + PAIR.size])
    bucket.drop()
    for half in halves:
        _resolve(half, omap, lo, superseded, level + 1, stats, progress)


def run_round(qlog: QueueLog, config: CompactionConfig, now_ms: int,
              progress: Callable[[RoundStats], None] = lambda stats: None) -> RoundStats:
    """A local round (the module docstring); stats.passes is 0 when there was nothing to do. ``progress`` is
    called with the stats after each map filling and after the install."""
    stats = RoundStats()
    bases, entries = qlog.sealed()
    src = Sealed(qlog.directory, qlog.segment_size, bases, entries, qlog.segment_bytes)
    lo, hi = dirty_range(entries, qlog.cleaned_offset, now_ms, config)
    if hi <= lo and not any_expired(entries, now_ms, config):
        return stats
    staging = qlog.directory / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    marks = mark_local(src, lo, hi, qlog.cleaned_offset, config.offset_map_memory_bytes, staging / SPILL, stats,
                       progress)
    shutil.rmtree(staging / SPILL)
    files, _ = write_marked(src, marks, qlog.cleaned_offset, qlog.next_offset(), now_ms, config, stats, staging)
    stats.passes = max(stats.passes, 1)
    failpoints.hit("compaction.round.staged")
    qlog.install(files, stats.last_entries, stats.last_state, [b for b in bases if b >= stats.rewritten_from],
                 stats.removed_keys)
    shutil.rmtree(staging, ignore_errors=True)
    progress(stats)
    return stats


def any_expired(entries: Entries, now_ms: int, config: CompactionConfig) -> bool:
    return any(tombstone_expired(entries.seen[i], now_ms, config.delete_retention_ms) for i in range(len(entries))
               if entries.seen[i])


# ---- both engines: the rewrite ----------------------------------------------------------------------------------

def write_pass(src: Sealed, lo: int, hi: int, cleaned: int, next_offset: int, omap, now_ms: int,
               config: CompactionConfig, stats: RoundStats, staging: pathlib.Path | None = None) -> tuple[list, dict]:
    """The rewrite of a round whose map ``omap`` (key digest -> latest queue offset over the dirty range
    [lo, hi), ``omap.last_offset`` its last offset; the Spark job's) is given: marks the records from it
    and writes them with :func:`write_marked` into ``staging`` (the queue's staging/ by default, emptied
    first); the staged files and their manifest (``rewritten_from``: the sealed segments from that
    position on are the ones the files replace)."""
    if len(omap) == 0:
        omap.last_offset = max(cleaned, src.entries.offsets[hi - 1] if hi > lo else cleaned)
    invariant(hi <= lo or omap.last_offset > cleaned, "a pass with dirty records advances the cleaned offset")
    n = len(src.entries)
    marks = Marks(bytearray((n + 7) // 8), bytearray((n + 7) // 8), omap.last_offset)
    end = bisect.bisect_right(src.entries.offsets, omap.last_offset, 0, n)
    for i, _, key, tombstone in sealed_records(src, 0, end):
        if key is None:
            continue
        latest = omap.get(digest(key))
        if latest is not None and src.entries.offsets[i] < latest:
            _set(marks.superseded, i)
        if tombstone:
            _set(marks.tombstones, i)
    staging = staging or src.directory / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    stats.passes += 1
    stats.keys_mapped += len(omap)
    return write_marked(src, marks, cleaned, next_offset, now_ms, config, stats, staging)


def write_marked(src: Sealed, marks: Marks, cleaned: int, next_offset: int, now_ms: int, config: CompactionConfig,
                 stats: RoundStats, staging: pathlib.Path) -> tuple[list, dict]:
    """Rewrite the sealed records by ``marks`` with the one writer into ``staging`` (exists, empty), from
    the first segment that changes; the staged files and their manifest. ``stats.last_entries`` /
    ``last_state`` / ``rewritten_from`` say what to install."""
    sealed, n = src.entries, len(src.entries)
    end = bisect.bisect_right(sealed.offsets, marks.last, 0, n)  # records a round may change: [0, end)
    first = min(_first_bit(marks.superseded, end),
                next((i for i in _bits(marks.tombstones, end) if not sealed.seen[i]
                      or tombstone_expired(sealed.seen[i], now_ms, config.delete_retention_ms)), n))
    start = cseg.segment_base(sealed.positions[first], src.segment_size) if first < n else \
        (src.bases[-1] + src.segment_size if src.bases else 0)
    writer = RoundWriter(staging, src.segment_size, start)
    begin = sealed.first_at_position(start)  # the records below are kept where they are, unchanged
    stats.records_in = stats.records_out = begin
    stats.records_rewritten = 0
    stats.tombstones_pending = sum(1 for _ in _bits(marks.tombstones, min(begin, end)))
    seen_col, offsets = sealed.seen, sealed.offsets
    for i, raw in sealed_raw(src, begin, n):
        offset, mapped = offsets[i], i < end
        what, seen = fate(mapped, mapped and _bit(marks.superseded, i), mapped and _bit(marks.tombstones, i),
                          seen_col[i], now_ms, config)
        if count(stats, what, len(raw), key_and_tombstone(raw)[0] if what == EXPIRED else None, offset):
            writer.add(raw, offset, sealed.tags[i], sealed.store_ms[i], seen)
            stats.records_rewritten += 1
    state = {"cleaned_offset": max(cleaned, marks.last), "next_offset": next_offset}
    files, manifest = writer.finish(state)
    stats.last_entries, stats.last_state, stats.rewritten_from = writer.entries, state, start
    return files, manifest


KEEP, PENDING, SUPERSEDED, EXPIRED = "keep", "pending", "superseded", "expired"


def fate(mapped: bool, superseded: bool, tombstone: bool, seen: int, now_ms: int,
         config: CompactionConfig) -> tuple[str, int]:
    """What a round does with one sealed record, and its tombstone seen-at ms. ``mapped``: the record lies
    at or below the dirty range's last offset (a keyless one, written before keys were required, is never
    superseded nor a tombstone); ``superseded``: a later record of its key is in the dirty range. Both
    engines decide with this (the Spark job on its executors, one segment a task): KEEP, PENDING (a
    tombstone kept within its retention), SUPERSEDED or EXPIRED (both removed)."""
    if not mapped:
        return KEEP, seen
    if superseded:
        return SUPERSEDED, seen
    if not tombstone:
        return KEEP, seen
    seen = seen or now_ms  # stamped by the round that first maps it (the round's one clock, ms)
    return (EXPIRED if tombstone_expired(seen, now_ms, config.delete_retention_ms) else PENDING), seen


def changes(what: str, seen_before: int) -> bool:
    """Whether a record of this fate changes its segment: it is removed, or it is a tombstone stamped
    seen-at now. A round rewrites the sealed segments from the first that changes (both engines)."""
    return what in (SUPERSEDED, EXPIRED) or (what == PENDING and not seen_before)


def count(stats: RoundStats, what: str, size: int, key: str | None, offset: int) -> bool:
    """Add one record's fate to ``stats`` (``key``: needed for EXPIRED only); whether the record is kept."""
    stats.records_in += 1
    if what == SUPERSEDED:
        stats.records_removed += 1
    elif what == EXPIRED:
        stats.tombstones_removed += 1
        stats.removed_keys[key] = offset
    else:
        stats.tombstones_pending += what == PENDING
        stats.records_out += 1
        return True
    stats.bytes_reclaimed += size
    return False


def _bits(bits: bytearray, limit: int) -> Iterator[int]:
    """The indexes below ``limit`` whose bit is set, in order (zero bytes skipped in C)."""
    for match in _NONZERO.finditer(bits, 0, (limit + 7) // 8):
        byte, value = match.start(), match.group()[0]
        for k in range(8):
            if value >> k & 1 and byte * 8 + k < limit:
                yield byte * 8 + k


def _first_bit(bits: bytearray, limit: int) -> int:
    """The first index below ``limit`` whose bit is set, else len(bits) * 8 (past every record)."""
    return next(_bits(bits, limit), len(bits) * 8)
