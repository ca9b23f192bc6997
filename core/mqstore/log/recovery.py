"""Commit log recovery: find the end of valid data, tell a torn tail from corruption.

What is re-checked at start (length, magic, field lengths, PHYSICALOFFSET, body CRC): everything from
:func:`check_start`: the last ``recheck_segments`` segments up to the one holding the checkpoint's
flushed offset (RocketMQ re-checks the last three files too) and everything after that offset; the
whole log without a checkpoint or with ``check_all``. Damage older than that window is found by the
Pull that reads it (DATA_LOSS) or by ``mqstore check``.

At the first record that does not check out, at position P:

  P is                what follows P                                    verdict       action
  ------------------- ------------------------------------------------- ------------- ------------------
  anywhere            only zero bytes, up to the end of every later     clean end     none (below the
                      segment                                                         flushed offset:
                                                                                      logged)
  anywhere            non-zero bytes, all within the record P claims    torn tail     zero them, log
                      (or one page if its header is unreadable); later                bytes cut
                      segments hold only zeros; and, below the flushed
                      offset, that record is cut short (its last bytes
                      are zero) and no record naming itself follows
  at or after the     the non-zero bytes after it fit in one append's   torn tail     zero them, log
  flushed offset      write (``max_write_bytes``); later segments hold                bytes cut
                      only zeros
  anywhere            anything else (more data, data in a later         corruption    refuse: CorruptLog
                      segment, a whole record failing its CRC below                   names file and
                      the flushed offset)                                             position; the
                                                                                      operator runs
                                                                                      `mqstore repair`

A kill -9 during the copy of a batch leaves one of the torn-tail shapes. A byte-by-byte copy leaves a
partial record followed by zeros. An optimised memcpy (glibc's for large sizes) keeps the first and
last vectors of the buffer in registers and stores them at the very end, so a copy cut short leaves
the first bytes of the batch (up to an alignment boundary) zero, then records, then zeros: the third
row. That region lies within the one write that was in progress, which no append had acknowledged,
and after the checkpoint's flushed offset (nothing in it was confirmed durable). Without a checkpoint
only the second row applies, without its last condition.

Below the flushed offset an fsync covered every byte, so no crash tears anything there: a record cut
short at the log's end (zeros after it, e.g. a file truncated by hand after a clean stop) is still cut
as a torn tail, but a record whose bytes are all there and fail, or one followed by a record that names
its own physical offset (a damaged TOTALSIZE must not swallow good records), is corruption. Damage in
a segment older than the last one that holds data is always corruption: data follows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import failpoints, fs
from mqstore.errors import CorruptLog, FailedPrecondition
from mqstore.format import record, record_scan
from mqstore.format.record_reader import RecordError
from mqstore.log.segment import PAGE_SIZE, Segment, SegmentQueue

log = structlog.get_logger()
_CHUNK = 1 << 20
_PROGRESS_STEP = 64 << 20  # bytes walked between two progress calls


@dataclass(frozen=True)
class RecoveryResult:
    end_offset: int
    last_store_timestamp_ms: int
    records_checked: int
    bytes_checked: int
    torn_bytes_cut: int
    checked_from: int = 0  # every record in [checked_from, end_offset) passed its checks
    seconds: float = 0.0


def check_start(segments: SegmentQueue, flushed_offset: int | None, recheck_segments: int,
                check_all: bool = False) -> int:
    """Where start re-checks from: the first of the last ``recheck_segments`` segments up to the one
    holding ``flushed_offset`` (segments created ahead of the writer hold nothing yet), or the
    flushed offset if that is lower; the log's start with ``check_all`` or without a checkpoint."""
    segs = segments.segments
    if not segs:
        return flushed_offset or 0
    if check_all or flushed_offset is None:
        return segments.min_offset
    if recheck_segments <= 0:
        return flushed_offset
    holding = min(max((flushed_offset - segs[0].start) // segments.segment_size, 0), len(segs) - 1)
    if flushed_offset == segs[holding].start and holding > 0:
        holding -= 1  # the flushed offset is the end of the previous segment: that one holds the data
    first = segs[max(0, holding - recheck_segments + 1)].start
    return max(segs[0].start, min(flushed_offset, first))


def recover(segments: SegmentQueue, start_offset: int, max_write_bytes: int,
            flushed_offset: int | None = None, progress: Callable[[int], None] | None = None) -> RecoveryResult:
    """Scan from ``start_offset``; truncate a torn tail; raise CorruptLog on corruption.
    ``max_write_bytes`` bounds what one append copies into the log; ``flushed_offset`` is the
    checkpoint's (None without a checkpoint). See the table above."""
    began = time.monotonic()
    damage = scan(segments, start_offset, max_write_bytes, flushed_offset, progress)
    if damage.corrupt is not None:
        raise damage.corrupt
    if damage.torn_bytes:
        seg = segments.find(damage.end_offset)
        seg.zero_from(damage.end_offset - seg.start)
        log.warning("recovery.torn_tail_truncated", file=str(seg.path), position=damage.end_offset - seg.start,
                    physical_offset=damage.end_offset, bytes_cut=damage.torn_bytes)
    if flushed_offset is not None and damage.end_offset < flushed_offset:
        log.warning("recovery.log_ends_before_checkpoint", end_offset=damage.end_offset,
                    flushed_physical_offset=flushed_offset, bytes_lost=flushed_offset - damage.end_offset,
                    why="records the checkpoint says were flushed are cut short or zero")
    return RecoveryResult(damage.end_offset, damage.last_store_timestamp_ms, damage.records,
                          damage.end_offset - damage.start_offset, damage.torn_bytes, damage.start_offset,
                          time.monotonic() - began)


@dataclass
class ScanOutcome:
    start_offset: int
    end_offset: int
    last_store_timestamp_ms: int
    records: int
    torn_bytes: int = 0
    corrupt: CorruptLog | None = None


def scan(segments: SegmentQueue, start_offset: int, max_write_bytes: int, flushed_offset: int | None = None,
         progress: Callable[[int], None] | None = None) -> ScanOutcome:
    """Check every record from ``start_offset`` and classify the first failure (changes nothing).
    ``progress`` is called with the physical offset reached, every few tens of MiB."""
    segs = segments.segments
    if not segs:
        if flushed_offset:
            raise FailedPrecondition(
                f"the checkpoint says the log was flushed to {flushed_offset}, but {segments.directory} holds no "
                f"segment file: segment files are missing; restore them (a new empty log would reuse offsets "
                f"that consume queues and followers hold)")
        return ScanOutcome(start_offset, start_offset, 0, 0)
    if start_offset < segs[0].start:
        start_offset = segs[0].start
    flushed_to = max(start_offset, flushed_offset or 0)
    if flushed_to > segs[-1].end:
        raise FailedPrecondition(
            f"the checkpoint says the log was flushed to {flushed_to}, but the segments end at {segs[-1].end}: "
            f"segment files are missing from {segments.directory}")
    outcome = ScanOutcome(start_offset, start_offset, 0, 0)
    pos = start_offset
    for index, seg in enumerate(segs):
        if seg.end <= pos:
            continue
        stop, error = _walk_segment(seg, pos - seg.start, outcome, progress)
        if error is not None:
            outcome.end_offset = seg.start + stop
            below_flushed = flushed_offset is not None and seg.start + stop < flushed_offset
            unconfirmed = flushed_offset is not None and not below_flushed
            _classify(segs, index, stop, error, outcome, max_write_bytes if unconfirmed else 0, below_flushed)
            return outcome
        pos = seg.end  # a blank record or the exact end: the next segment
    outcome.end_offset = pos
    return outcome


def _walk_segment(seg: Segment, position: int, outcome: ScanOutcome,
                  progress: Callable[[int], None] | None) -> tuple[int, RecordError | None]:
    """record_scan.walk over one segment, CRC and PHYSICALOFFSET included, in steps when there is a
    ``progress`` to call. Returns (stop position, error): error None at a blank record or the end."""
    step = _PROGRESS_STEP
    while True:
        step_end = seg.size if progress is None else min(seg.size, position + step)
        walked = record_scan.walk(seg.buffer, position, step_end, base=seg.start)
        stop, error = walked.stop, walked.error
        outcome.records += walked.records
        if walked.records:
            outcome.last_store_timestamp_ms = walked.last_store_timestamp_ms
        if progress is not None:
            progress(seg.start + stop)
        ended_inside_step = error is None and stop < step_end  # a blank record
        if step_end == seg.size or ended_inside_step or (error is not None and error.reason != "short"):
            return stop, error
        # The step ended at a record's end, or inside a record: go on from there (a record larger
        # than a step is then walked with a larger one).
        step = step * 2 if stop == position else _PROGRESS_STEP
        position = stop


def _classify(segs, index: int, position: int, exc: RecordError, outcome: ScanOutcome,
              torn_write_bytes: int, below_flushed: bool) -> None:
    seg = segs[index]
    later_data = next((s for s in segs[index + 1:] if _last_nonzero(s, 0) > 0), None)
    last = _last_nonzero(seg, position)
    extent = last - position
    if extent <= 0 and later_data is None:
        return  # clean end: zeros from here on
    claimed = PAGE_SIZE
    total, magic = record.PREFIX.unpack_from(seg.buffer, position)
    whole_header = magic == record.MAGIC_V1 and record.FIXED_OVERHEAD <= total <= seg.size - position
    if whole_header:
        claimed = max(claimed, total)
    torn = later_data is None and extent <= max(claimed, torn_write_bytes)
    detail = f"data follows in {later_data.path.name}" if later_data else f"{extent} bytes of data follow it"
    if torn and below_flushed:
        if whole_header and extent >= total - 2:  # only PROPERTIESLENGTH 0 may end a whole record in zeros
            torn, detail = False, "the record is whole (not cut short) below the checkpoint's flushed offset"
        elif record_scan.next_record_start(seg.buffer, position, last, seg.start) < last:
            torn, detail = False, "a record naming its own physical offset follows it"
    if torn:
        outcome.torn_bytes = extent
        return
    where = f"{seg.path} at position {position} (physical offset {seg.start + position})"
    data_dir = seg.path.parent.parent  # segments live in <data dir>/commitlog
    outcome.corrupt = CorruptLog(
        f"commit log corrupt: {where}: {exc}; {detail}, so this is not a torn tail. The store will not start; "
        f"run `mqstore repair --data-dir {data_dir}` to cut the log there (every record from there on is cut; "
        f".broken copies of the files are kept)",
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


@dataclass(frozen=True)
class LogRepair:
    """What :func:`repair` did to the log."""

    corrupt: bool              # the log was cut at its first bad record (else at most a torn tail was cut)
    end_offset: int            # the log's end afterwards
    records: int               # records before that end, all of which passed their checks
    torn_bytes_cut: int        # the bytes of a torn tail cut (when not corrupt)
    cut_at: str | None         # what was wrong where the log was cut (when corrupt)
    broken_copies: list[str]   # the .broken copies kept of the segments that were cut


def repair(segments: SegmentQueue, max_write_bytes: int, flushed_offset: int | None = None) -> LogRepair:
    """Cut the log at the first bad record, keeping durable ``<segment>.broken`` copies of what is
    cut: each copy is complete and fsynced (file and directory) before anything is cut, so a crash at
    any point leaves either the uncut log or the copy (fs.copy_durably)."""
    segs = segments.segments
    outcome = scan(segments, segs[0].start if segs else 0, max_write_bytes, flushed_offset)
    if outcome.corrupt is None:
        if outcome.torn_bytes:
            recover(segments, outcome.start_offset, max_write_bytes, flushed_offset)
        return LogRepair(False, outcome.end_offset, outcome.records, outcome.torn_bytes, None, [])
    cut = outcome.end_offset
    copies = []
    for seg in segments.segments:
        if seg.end > cut:
            copies.append(str(fs.copy_durably(seg.path, fs.free_name(seg.path, ".broken"))))
    failpoints.hit("repair.after_copy")
    seg = segments.find(cut)
    seg.zero_from(cut - seg.start)
    segments.delete_from(seg.end)
    fs.fsync_dir(segments.directory)
    log.warning("repair.cut", physical_offset=cut, file=str(seg.path), broken_copies=copies)
    return LogRepair(True, cut, outcome.records, 0, str(outcome.corrupt), copies)
