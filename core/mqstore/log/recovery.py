"""Commit log recovery: find the end of valid data, tell a torn tail from corruption.

Records are re-checked (length, magic, CRC) from a start offset: the checkpoint's flushed offset (every
byte below it was covered by an fsync) or, without a checkpoint, the first segment. At the first
record that does not check out, at position P:

  what follows P                                              verdict        action
  ----------------------------------------------------------- -------------- -------------------------
  only zero bytes, up to the end of every later segment      clean end      none
  non-zero bytes, all within the record P claims to be (or   torn tail      zero them, log bytes cut
  within one page if its header is unreadable); later
  segments hold only zeros
  P at or after the checkpoint's flushed offset, and the     torn tail      zero them, log bytes cut
  non-zero bytes after it fit in one append's write
  (``max_write_bytes``); later segments hold only zeros
  anything else (more data, or data in a later segment)      corruption     refuse: CorruptLog names
                                                                            file and position; the
                                                                            operator runs `mqstore repair`

A kill -9 during the copy of a batch leaves one of the torn-tail shapes. A byte-by-byte copy leaves a
partial record followed by zeros. An optimised memcpy (glibc's for large sizes) keeps the first and
last vectors of the buffer in registers and stores them at the very end, so a copy cut short leaves
the first bytes of the batch (up to an alignment boundary) zero, then records, then zeros: the second
row. That region lies within the one write that was in progress, which no append had acknowledged,
and after the checkpoint's flushed offset (nothing in it was confirmed durable). Without a checkpoint
only the first row applies.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import structlog

from mqstore import failpoints
from mqstore.errors import CorruptLog, FailedPrecondition
from mqstore.format import record
from mqstore.log.segment import PAGE_SIZE, Segment, SegmentQueue

log = structlog.get_logger()
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RecoveryResult:
    end_offset: int
    last_store_timestamp_ms: int
    records_checked: int
    bytes_checked: int
    torn_bytes_cut: int


def recover(segments: SegmentQueue, start_offset: int, max_write_bytes: int,
            flushed_offset: int | None = None) -> RecoveryResult:
    """Scan from ``start_offset``; truncate a torn tail; raise CorruptLog on corruption.
    ``max_write_bytes`` bounds what one append copies into the log; ``flushed_offset`` is the
    checkpoint's (None without a checkpoint). See the table above."""
    damage = scan(segments, start_offset, max_write_bytes, flushed_offset)
    if damage.corrupt is not None:
        raise damage.corrupt
    if damage.torn_bytes:
        seg = segments.find(damage.end_offset)
        seg.zero_from(damage.end_offset - seg.start)
        log.warning("recovery.torn_tail_truncated", file=str(seg.path), position=damage.end_offset - seg.start,
                    physical_offset=damage.end_offset, bytes_cut=damage.torn_bytes)
    return RecoveryResult(damage.end_offset, damage.last_store_timestamp_ms, damage.records,
                          damage.end_offset - damage.start_offset, damage.torn_bytes)


@dataclass
class ScanOutcome:
    start_offset: int
    end_offset: int
    last_store_timestamp_ms: int
    records: int
    torn_bytes: int = 0
    corrupt: CorruptLog | None = None


def scan(segments: SegmentQueue, start_offset: int, max_write_bytes: int,
         flushed_offset: int | None = None) -> ScanOutcome:
    segs = segments.segments
    if not segs:
        return ScanOutcome(start_offset, start_offset, 0, 0)
    if start_offset < segs[0].start:
        start_offset = segs[0].start
    if start_offset > segs[-1].end:
        raise FailedPrecondition(
            f"the checkpoint says the log was flushed to {start_offset}, but the segments end at {segs[-1].end}: "
            f"segment files are missing from {segments.directory}")
    outcome = ScanOutcome(start_offset, start_offset, 0, 0)
    pos = start_offset
    for index, seg in enumerate(segs):
        if seg.end <= pos:
            continue
        stop, count, last_ts, error = record.walk(seg.buffer, pos - seg.start, seg.size)
        outcome.records += count
        if count:
            outcome.last_store_timestamp_ms = last_ts
        if error is not None:
            outcome.end_offset = seg.start + stop
            unconfirmed = flushed_offset is not None and seg.start + stop >= flushed_offset
            _classify(segs, index, stop, error, outcome, max_write_bytes if unconfirmed else 0)
            return outcome
        pos = seg.end  # a blank record or the exact end: the next segment
    outcome.end_offset = pos
    return outcome


def _classify(segs, index: int, position: int, exc: record.RecordError, outcome: ScanOutcome,
              torn_write_bytes: int) -> None:
    seg = segs[index]
    later_data = next((s for s in segs[index + 1:] if _last_nonzero(s, 0) > 0), None)
    extent = _last_nonzero(seg, position) - position
    if extent <= 0 and later_data is None:
        return  # clean end: zeros from here on
    claimed = PAGE_SIZE
    total, magic = record.PREFIX.unpack_from(seg.buffer, position)
    if magic == record.MAGIC_V1 and 0 < total <= seg.size - position:
        claimed = max(claimed, total)
    if later_data is None and extent <= max(claimed, torn_write_bytes):
        outcome.torn_bytes = extent
        return
    where = f"{seg.path} at position {position} (physical offset {seg.start + position})"
    detail = f"data follows in {later_data.path.name}" if later_data else f"{extent} bytes of data follow it"
    outcome.corrupt = CorruptLog(
        f"commit log corrupt: {where}: {exc}; {detail}, so this is not a torn tail. The store will not start; "
        f"run `mqstore repair --data-dir <dir>` to cut the log there (a .broken copy is kept)",
        path=str(seg.path), position=position, physical_offset=seg.start + position)


def _last_nonzero(seg: Segment, position: int) -> int:
    """Position after the last non-zero byte at or after ``position`` (``position`` if none). Only
    ranges the file system reports as data are read; zero chunks are recognised by one comparison."""
    buf = seg.buffer
    last = position
    zero = bytes(_CHUNK)
    for start, end in seg.data_ranges(position):
        for at in range(max(start, position), end, _CHUNK):
            stop = min(at + _CHUNK, end)
            chunk = buf[at:stop]
            if chunk != zero[:stop - at]:
                last = at + len(chunk.rstrip(b"\0"))
    return last


def repair(segments: SegmentQueue, max_write_bytes: int) -> dict:
    """Cut the log at the first bad record, keeping ``<segment>.broken`` copies of what is cut."""
    segs = segments.segments
    outcome = scan(segments, segs[0].start if segs else 0, max_write_bytes)
    if outcome.corrupt is None:
        if outcome.torn_bytes:
            recover(segments, outcome.start_offset, max_write_bytes)
        return {"corrupt": False, "end_offset": outcome.end_offset, "torn_bytes_cut": outcome.torn_bytes,
                "records": outcome.records, "broken_copies": []}
    cut = outcome.end_offset
    copies = []
    for seg in segments.segments:
        if seg.end > cut:
            copy = seg.path.with_name(seg.path.name + ".broken")
            shutil.copyfile(seg.path, copy)
            copies.append(str(copy))
    failpoints.hit("repair.after_copy")
    seg = segments.find(cut)
    seg.zero_from(cut - seg.start)
    segments.delete_from(seg.end)
    log.warning("repair.cut", physical_offset=cut, file=str(seg.path), broken_copies=copies)
    return {"corrupt": True, "end_offset": cut, "cut_at": str(outcome.corrupt), "records": outcome.records,
            "broken_copies": copies}
