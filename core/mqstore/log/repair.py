"""`mqstore repair` and `mqstore check`: offline tools for a stopped store's commit log.

Both take the same directory lock as the server, so they refuse to run while a store runs there.

repair:
  1. remove the leftovers (``*.tmp``) of an interrupted repair in ``commitlog/`` (fs.copy_durably), and
     the empty tail a start would remove (segment.empty_tail: trailing segments past the checkpoint's
     flushed offset of size 0, cut short or holding only zeros, left by a power cut);
  2. another segment file whose size is not the segment size (cut short by hand or by a file system that lost
     its tail, or grown): keep a durable ``.broken`` copy, then pad it with zeros to the segment size
     (or cut what is beyond it); a record the truncation cut short is then cut in step 3 as a torn
     tail, or, with data after it, as corruption;
  3. cut the log at its first bad record, keeping durable ``.broken`` copies of every segment from
     there (recovery.repair). Copies never overwrite older ones (``.broken.1``, ...);
  4. remove the checkpoint: the next start re-checks the whole log. Consume queues need nothing here;
     the next start cuts their entries past the new log end and replays the rest.

check: walks every record of every segment (length, magic, PHYSICALOFFSET, body CRC), changing
nothing, and gives the verdict the next start would reach with ``--check-all``: ``ok``, ``torn tail``
(the start cuts it), ``corrupt`` or ``wrong segment size`` (the start refuses; run repair). The empty
tail is left out of the walk and named in the detail (the start removes it).

The segment size is the difference between consecutive segment names (each name is the segment's
first physical offset), or the size of a single file; ``segment_size`` (``--segment-size-bytes``)
overrides it, as it must when the only segment is the one cut short.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import pathlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import structlog

from mqstore import failpoints, fs
from mqstore.config import StoreConfig, max_write_bytes
from mqstore.errors import DataLoss, FailedPrecondition, InvalidArgument, ResourceExhausted
from mqstore.format import checkpoint as cpfmt, segment_name
from mqstore.log import recovery
from mqstore.log.segment import SegmentQueue, empty_tail, segment_paths

log = structlog.get_logger()
# Offline tools run without the server's configuration: the default append limits bound a torn tail.
_DEFAULT_MAX_WRITE_BYTES = max_write_bytes(StoreConfig.max_batch_body_bytes, StoreConfig.max_batch_messages)
_DEFAULT_SEGMENT_SIZE = StoreConfig.segment_size_bytes


@dataclass(frozen=True)
class ResizedSegment:
    file: str
    from_bytes: int
    to_bytes: int
    broken_copy: str


@dataclass(frozen=True)
class RepairReport(recovery.LogRepair):
    """What `mqstore repair` did: the log's repair, and the segment files it resized first."""

    resized_segments: list[ResizedSegment]
    segment_size_bytes: int
    removed_empty_segments: list[str]  # the empty tail (segment.empty_tail), removed


@dataclass(frozen=True)
class CheckReport:
    verdict: str               # ok | torn tail | corrupt | wrong segment size
    detail: str                # what was found and what to do
    segments: int
    records: int
    bytes_checked: int         # the log span whose records were checked
    seconds: float
    segment_size_bytes: int
    start_offset: int
    end_offset: int            # end of valid data
    checkpoint: str            # what the checkpoint claims

    @property
    def will_start(self) -> bool:
        return self.verdict in ("ok", "torn tail")


def repair(data_dir: str | os.PathLike, segment_size: int | None = None) -> RepairReport:
    with _locked(data_dir) as (root, log_dir):
        fs.remove_leftovers(log_dir)
        size = infer_segment_size(log_dir, segment_size)
        cp = _checkpoint(root)
        flushed = cp.flushed_physical_offset if cp else None
        tail = empty_tail(segment_paths(log_dir), size, flushed)
        resized = [_fix_size(path, size) for path, _ in _wrong_sizes(_segment_files(log_dir), size, tail)]
        segments = SegmentQueue(log_dir, size, preallocate=False)
        segments.load(flushed)  # removes the empty tail
        try:
            repaired = recovery.repair(segments, _DEFAULT_MAX_WRITE_BYTES, flushed)
        finally:
            segments.close()
        # The checkpoint may point past the cut; without it the next start re-checks the whole log.
        (root / "checkpoint").unlink(missing_ok=True)
        fs.fsync_dir(root)
        return RepairReport(**vars(repaired), resized_segments=resized, segment_size_bytes=size,
                            removed_empty_segments=[str(e.path) for e in tail])


def check(data_dir: str | os.PathLike, segment_size: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> CheckReport:
    """``progress(bytes done, bytes in segment files)`` is called every few tens of MiB."""
    began = time.monotonic()
    with _locked(data_dir) as (root, log_dir):
        size = infer_segment_size(log_dir, segment_size)
        files = _segment_files(log_dir)
        cp = _checkpoint(root)
        claim = (f"every record in [{cp.checked_from_physical_offset}, {cp.checked_to_physical_offset}) passed its "
                 f"checks at the last start; flushed to {cp.flushed_physical_offset}" if cp else "no checkpoint")
        tail = empty_tail(segment_paths(log_dir), size, cp.flushed_physical_offset if cp else None)
        wrong = _wrong_sizes(files, size, tail)
        if wrong:
            detail = "; ".join(f"{path.name} is {actual} bytes, not {size}" for path, actual in wrong)
            return CheckReport("wrong segment size", f"{detail}: run `mqstore repair --data-dir {root} "
                               f"--segment-size-bytes {size}` (pads with zeros, keeps .broken copies)",
                               len(files), 0, 0, time.monotonic() - began, size, 0, 0, claim)
        segments = SegmentQueue(log_dir, size, preallocate=False)
        segments.load(cp.flushed_physical_offset if cp else None, remove_empty_tail=False)
        try:
            return _check_segments(segments, root, cp, claim, progress, began, tail)
        finally:
            segments.close()


def _check_segments(segments: SegmentQueue, root: pathlib.Path, cp, claim: str,
                    progress: Callable[[int, int], None] | None, began: float, tail) -> CheckReport:
    first = segments.min_offset
    total = sum(s.size for s in segments.segments)
    on_step = (lambda offset: progress(offset - first, total)) if progress else None
    outcome = recovery.scan(segments, first, _DEFAULT_MAX_WRITE_BYTES, cp.flushed_physical_offset if cp else None,
                            on_step)
    if outcome.corrupt is not None:
        verdict, detail = "corrupt", str(outcome.corrupt)
    elif outcome.torn_bytes:
        verdict, detail = "torn tail", (f"{outcome.torn_bytes} bytes of a write cut short at physical offset "
                                        f"{outcome.end_offset}; the next start cuts them")
    else:
        verdict, detail = "ok", "every record checks out"
    if tail:
        detail += (f"; the start removes {len(tail)} empty segment(s) past the flushed offset: "
                   f"{', '.join(e.path.name for e in reversed(tail))}")
    return CheckReport(verdict, detail, len(segments.segments), outcome.records,
                       outcome.end_offset - outcome.start_offset, time.monotonic() - began, segments.segment_size,
                       outcome.start_offset, outcome.end_offset, claim)


def infer_segment_size(log_dir: pathlib.Path, given: int | None = None) -> int:
    if given:
        if given < 4096 or given % 4096:
            raise InvalidArgument(f"segment size must be a multiple of 4096, not {given}")
        return given
    files = _segment_files(log_dir)
    starts = [segment_name.parse(path.name) for path, _ in files]
    gaps = {b - a for a, b in itertools.pairwise(starts)}
    if gaps:
        return min(gaps)  # a missing segment makes a larger gap; start reports it
    if files:
        actual = files[0][1]
        if actual < 4096 or actual % 4096:
            raise FailedPrecondition(f"{files[0][0]} is {actual} bytes, which is no segment size: it was cut "
                                     f"short; pass --segment-size-bytes (the store's --segment-size-bytes)")
        return actual
    return _DEFAULT_SEGMENT_SIZE


def _segment_files(log_dir: pathlib.Path) -> list[tuple[pathlib.Path, int]]:
    return [(path, path.stat().st_size) for path in segment_paths(log_dir)]


def _wrong_sizes(files: list[tuple[pathlib.Path, int]], size: int, tail) -> list[tuple[pathlib.Path, int]]:
    """Files of another size than ``size``, but for the empty tail (load removes it)."""
    removed = {empty.path for empty in tail}
    return [(path, actual) for path, actual in files if actual != size and path not in removed]


def _fix_size(path: pathlib.Path, size: int) -> ResizedSegment:
    """Keep a durable .broken copy, then pad the file with zeros to ``size`` (or cut it there)."""
    actual = path.stat().st_size
    copy = fs.copy_durably(path, fs.free_name(path, ".broken"))
    failpoints.hit("repair.after_copy")
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
        if size > actual:
            try:  # real blocks, as a new segment gets: a full disk fails here, not on a later write
                os.posix_fallocate(fd, actual, size - actual)
            except OSError as exc:
                raise ResourceExhausted(f"cannot pad {path} to {size} bytes: {exc}") from exc
        os.fsync(fd)
    finally:
        os.close(fd)
    fs.fsync_dir(path.parent)
    log.warning("repair.segment_resized", file=str(path), from_bytes=actual, to_bytes=size, broken_copy=str(copy))
    return ResizedSegment(str(path), actual, size, str(copy))


def _checkpoint(root: pathlib.Path) -> cpfmt.Checkpoint | None:
    try:
        return cpfmt.decode((root / "checkpoint").read_bytes())
    except (FileNotFoundError, DataLoss):
        return None


@contextlib.contextmanager
def _locked(data_dir: str | os.PathLike) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    root = pathlib.Path(data_dir)
    log_dir = root / "commitlog"
    if not log_dir.is_dir():
        raise FailedPrecondition(f"{log_dir} does not exist: is {root} an mqstore data directory?")
    fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)  # not durable: the flock is the lock
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FailedPrecondition(f"{root} is in use by a running mqstore; stop it first") from None
        yield root, log_dir
    finally:
        os.close(fd)
