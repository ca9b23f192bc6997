"""Segment files: equally sized, memory-mapped, named by their first offset (mqstore.format.segment_name).

Used for commit log segments and consume queue files alike (RocketMQ's MappedFile/MappedFileQueue).
A Segment knows its start offset and size; the *write position* and *flush position* are tracked by
the owner (CommitLog or ConsumeQueue), which serialises writes. Reads copy bytes out of the mapping
(``read``), so a segment can be closed by retention while readers exist: a read of a closed segment
raises ``SegmentClosed`` instead of touching unmapped memory.

A page of a shared mapping that has no disk block behind it is allocated when it is first written; on
a full disk that write kills the process with SIGBUS. So segments are allocated for real
(posix_fallocate) before they are mapped: a full disk fails the creation with ResourceExhausted, and
the caller refuses the write that needed the file. ``preallocate=False`` (sparse files) is only for
commit log tests on a disk that cannot fill up.

Creation follows the creation rule of mqstore.fs. A commit log segment is made durable as it is created
(its size fsynced, then its directory), before any record is copied into it: otherwise a power cut
could drop the file, or leave it empty, under records an fsync had confirmed. The segment warmer
creates the next segment ahead of the writer, so this happens off the append path. Consume queue files
are derived: their creation is made durable by the checkpoint that first counts on them
(``durable_create=False`` and :meth:`SegmentQueue.sync_created`), not on the append path.

What a power cut leaves of a creation that was not durable yet is a trailing segment of size 0, cut
short, or holding only zeros. :meth:`SegmentQueue.load` removes every such trailing segment that starts
at or after the offset the caller names (the commit log: the checkpoint's flushed offset), logging
each, and never one below it: a file below it that is cut short refuses the start.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import pathlib
import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import failpoints, fs
from mqstore.disk_space import is_no_space
from mqstore.errors import FailedPrecondition, OutOfRange, ResourceExhausted
from mqstore.format import segment_name

log = structlog.get_logger()

# Writes of at least this many bytes go through pwrite instead of the mapping. Copying into a mapped page
# that is not resident costs a page fault with zeroing, ~12 us per 4 KiB page here (bench: 300 us per
# 100 KiB against 28 us with pwrite), under the append lock and holding the GIL; pwrite fills the page
# cache directly, without zeroing first (and releases the GIL while it copies). Both reach the same
# page-cache pages, so readers of the mapping see the bytes at once, and fdatasync makes both durable.
# Small writes (consume queue runs, blank records, single small records) stay on the mapping, where a
# system call costs more than the copy. Reading the range ahead into the page cache so that batches could
# be copied through the mapping instead cost more than it saved (mqstore.log.warmer).
_PWRITE_MIN_BYTES = 4096
PAGE_SIZE = mmap.PAGESIZE
_SCAN_CHUNK_BYTES = 1 << 20


def holds_nonzero_bytes(path: pathlib.Path) -> bool:
    """Whether the file holds a byte that is not zero. Only ranges the file system reports as data
    (SEEK_DATA) are read, so a preallocated, never-written segment costs no reading."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            try:
                position = os.lseek(fd, position, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data at or after position
                    return False
                raise
            end = min(os.lseek(fd, position, os.SEEK_HOLE), size)
            while position < end:
                chunk = os.pread(fd, min(_SCAN_CHUNK_BYTES, end - position), position)
                if not chunk:
                    return False  # cut shorter while reading
                if chunk.count(0) != len(chunk):
                    return True
                position += len(chunk)
        return False
    finally:
        os.close(fd)


def segment_paths(directory: pathlib.Path) -> list[pathlib.Path]:
    """The segment files of ``directory`` in the order of their start offsets (other files, such as
    temporary files and .broken copies, are left out)."""
    names = []
    for path in directory.iterdir():
        try:
            names.append((segment_name.parse(path.name), path))
        except ValueError:
            continue
    return [path for _, path in sorted(names)]


@dataclass(frozen=True)
class EmptySegment:
    path: pathlib.Path
    start: int
    size_bytes: int
    holds_data: bool  # non-zero bytes in a file cut short (written, never flushed)


def empty_tail(paths: list[pathlib.Path], segment_size: int, removable_from: int | None) -> list[EmptySegment]:
    """The empty tail of the segment files ``paths`` (sorted), last first: the trailing files that start
    at or after ``removable_from`` and are empty, that is of size 0, cut short or holding only zeros:
    what a power cut leaves of a creation not yet durable. A whole file that holds data ends it, and
    so does a whole first file: kept even if empty, it holds the log's position, so that a directory
    with no segment at all means that files are missing (recovery refuses that when the checkpoint
    says data was flushed). None: no flushed offset is known, the first file is never part of it."""
    if not paths:
        return []
    first = segment_name.parse(paths[0].name)
    bound = first + 1 if removable_from is None else removable_from
    tail = []
    for index in range(len(paths) - 1, -1, -1):
        path = paths[index]
        start = segment_name.parse(path.name)
        if start < bound:
            break
        size = path.stat().st_size
        holds_data = holds_nonzero_bytes(path)
        if size >= segment_size and (holds_data or index == 0):
            break  # (a file grown past the segment size is refused by Segment.open)
        tail.append(EmptySegment(path, start, size, holds_data))
    return tail


class SegmentClosed(OutOfRange):
    """The segment was deleted (retention) while it was being read."""


class Segment:
    """One fixed-size mapped file. Not thread-safe for writes (the owner's lock is held);
    ``read`` and ``flush`` may run concurrently with writes to other positions."""

    __slots__ = ("path", "start", "size", "_fd", "_mm")

    def __init__(self, path: pathlib.Path, start: int, size: int, fd: int, mm: mmap.mmap):
        self.path = path
        self.start = start
        self.size = size
        self._fd = fd
        self._mm = mm

    @classmethod
    def create(cls, directory: pathlib.Path, start: int, size: int, *, preallocate: bool,
               durable: bool) -> "Segment":
        """A new segment; ``durable``: its creation is made durable before it is returned (the creation
        rule of mqstore.fs; otherwise the owner does it later, see the module docstring)."""
        path = directory / segment_name.name_for(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if preallocate:
                # Reserve real blocks so a full disk fails here, not as SIGBUS on a page write later.
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            if durable:
                fs.sync_created(fd, path)  # the creation rule (mqstore.fs): size, then directory entry
            failpoints.hit("segment.after_create")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            if is_no_space(exc):
                raise ResourceExhausted(f"disk full: cannot create segment {path} of {size} bytes") from exc
            raise
        return cls(path, start, size, fd, mm)

    @classmethod
    def open(cls, path: pathlib.Path, size: int, wrong_size_advice: str = "") -> "Segment":
        start = segment_name.parse(path.name)
        actual = path.stat().st_size
        if actual != size:
            raise FailedPrecondition(
                f"{path} is {actual} bytes but segments are {size} bytes: the file was cut short (or grown), "
                f"or the configured segment size is wrong. "
                f"{wrong_size_advice or f'Move {path.parent} aside: a consume queue is rebuilt from the log'}")
        fd = os.open(path, os.O_RDWR)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path, start, size, fd, mm)

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping, for struct.unpack_from and slicing by the owner. Raises SegmentClosed."""
        if self._mm is None:
            raise SegmentClosed(f"segment {self.path.name} was deleted by retention")
        return self._mm

    def write(self, position: int, data) -> None:
        """Write ``data`` at ``position`` (_PWRITE_MIN_BYTES says how)."""
        length = len(data)
        if length < _PWRITE_MIN_BYTES:
            self._mm[position:position + length] = data
            return
        if not 0 <= position <= self.size - length:  # pwrite would grow the file where the mapping refuses
            raise ValueError(f"write of {length} bytes at {position} overruns segment {self.path.name}")
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, position)
            view = view[written:]
            position += written

    def read(self, position: int, length: int) -> bytes:
        mm = self._mm
        if mm is None:
            raise SegmentClosed(f"segment {self.path.name} was deleted by retention")
        try:
            return mm[position:position + length]
        except ValueError as exc:  # closed between the check and the slice
            raise SegmentClosed(f"segment {self.path.name} was deleted by retention") from exc

    def flush(self, from_position: int, to_position: int) -> None:
        """Make the byte range durable. fdatasync writes back every dirty page of the file, including
        pages dirtied through the mapping, and (unlike mmap.flush) releases the GIL while it waits. It
        suffices for a preallocated file: the size was made durable at creation, and the one metadata a
        write into fallocated space changes (its extent turns from unwritten to written) is "needed for a
        subsequent data retrieval", which fdatasync(2) makes durable too (ext4 writes the extent tree); that
        commit is what makes it slower there than in zeroed space (mqstore.log.warmer). msync(MS_SYNC)
        would do the same work (Linux runs the file's fsync for the range, data only) but mmap.flush
        holds the GIL."""
        if to_position <= from_position or self._mm is None:
            return
        os.fdatasync(self._fd)

    def drop_cache(self, from_position: int, to_position: int) -> None:
        """Let the kernel have back the memory of [from_position, to_position), which must be flushed (its pages
        clean): this process's mapping of its whole pages (madvise DONTNEED: a shared file mapping's data stays
        in the file), then their page cache (posix_fadvise DONTNEED drops clean pages). A later read faults them
        in from the disk. A segment closed meanwhile is left alone (its memory went with it)."""
        start = -(-from_position // PAGE_SIZE) * PAGE_SIZE
        end = to_position // PAGE_SIZE * PAGE_SIZE
        mm = self._mm
        if mm is None or end <= start:
            return
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except (ValueError, OSError):  # closed by retention between the check and the calls
            return

    def write_zeros(self, from_position: int, to_position: int, zeros: bytes) -> None:
        """Write zeros over [from_position, to_position) and make them durable (the segment warmer's
        zeroing ahead of the writer, mqstore.log.warmer; the caller holds the range's claim, so no record
        is there). Through a descriptor of its own: an fdatasync reports a failed writeback once per open
        file, and the flush service's fdatasync, on the segment's own descriptor, must see every failure
        of the records' pages, none taken by this one."""
        if self._mm is None:
            return
        fd = os.open(self.path, os.O_WRONLY)
        try:
            position = from_position
            while position < to_position:
                position += os.pwrite(fd, memoryview(zeros)[:to_position - position], position)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def data_ranges(self, position: int):
        """(start, end) ranges at or after ``position`` that may hold data, from SEEK_DATA/SEEK_HOLE.
        Preallocated, never-written space is a hole here, so scanning for the end of data does not
        have to read (and so fault in) the empty rest of a 1 GiB segment. Where the file system cannot
        tell, the whole rest is one range."""
        try:
            while position < self.size:
                start = os.lseek(self._fd, position, os.SEEK_DATA)
                end = min(os.lseek(self._fd, start, os.SEEK_HOLE), self.size)
                if start >= self.size:
                    return
                yield start, end
                position = end
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data at or after position
                return
            yield position, self.size

    def zero_from(self, position: int) -> None:
        """Zero [position, size): used when truncating a torn or repaired tail."""
        self.zero_range(position, self.size)

    def zero_range(self, start: int, end: int) -> None:
        """Zero [start, end) and flush it (a replica's diverged tail: only what was written there, not the rest of
        a segment of up to a GiB, which writing and flushing took seconds)."""
        step = 1 << 20
        for at in range(start, end, step):
            n = min(step, end - at)
            self._mm[at:at + n] = bytes(n)
        self.flush(start, end)

    def close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            mm.close()
            os.close(self._fd)

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class SegmentQueue:
    """The ordered segments of one directory (RocketMQ's MappedFileQueue).

    ``durable_create``: each new segment's creation is made durable as it is created; without it the
    owner calls :meth:`sync_created` before it counts on the new files (see the module docstring).

    Thread-safety: creating (with its fsyncs), deleting and truncating take ``self.lock``; lookups read
    ``self.segments``, a tuple replaced atomically, so readers never lock.
    """

    def __init__(self, directory: pathlib.Path, segment_size_bytes: int, *, preallocate: bool,
                 wrong_size_advice: str = "", durable_create: bool = True):
        self.directory = directory
        self.segment_size = segment_size_bytes
        self.preallocate = preallocate
        self.durable_create = durable_create
        self.wrong_size_advice = wrong_size_advice  # what to do about a file of another size (load)
        self.lock = threading.Lock()
        self._retention_lock = threading.Lock()  # one delete_expired pass at a time
        self.segments: tuple[Segment, ...] = ()
        self._created_unsynced = False  # a file was created whose directory entry is not durable yet

    def load(self, empty_tail_from: int | None = None, *, remove_empty_tail: bool = True) -> None:
        """Open the segments of the directory (created durably if missing), but not the empty tail
        (:func:`empty_tail`, from ``empty_tail_from``): its files are deleted, each logged, or with
        ``remove_empty_tail=False`` (``mqstore check``, which changes nothing) left alone."""
        fs.make_dirs(self.directory)  # the creation rule (mqstore.fs)
        paths = segment_paths(self.directory)
        tail = empty_tail(paths, self.segment_size, empty_tail_from)
        if tail and remove_empty_tail:
            for empty in tail:
                # Short with data: written past the flushed offset, never confirmed durable.
                log.warning("segment.empty_removed", path=str(empty.path), start=empty.start,
                            size_bytes=empty.size_bytes, unflushed_data=empty.holds_data,
                            why="created but never made durable before a crash")
                empty.path.unlink()
            fs.fsync_dir(self.directory)  # a removal undone by a power cut is redone, but keep them in step
        segments = []
        try:
            for path in paths[:len(paths) - len(tail)]:
                segments.append(Segment.open(path, self.segment_size, self.wrong_size_advice))
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        for prev, cur in itertools.pairwise(segments):
            if cur.start != prev.end:
                raise FailedPrecondition(
                    f"segment gap in {self.directory}: {prev.path.name} ends at {prev.end} but the next "
                    f"file is {cur.path.name}; a segment is missing")
        self.segments = tuple(segments)

    @property
    def min_offset(self) -> int:
        segs = self.segments
        return segs[0].start if segs else 0

    def last(self) -> Segment | None:
        segs = self.segments
        return segs[-1] if segs else None

    def hot_start(self, end: int, count: int, spare_first: bool) -> int | None:
        """Where the ``count`` segments up to the one holding ``end`` start (the one written now and those written
        just before it; a segment created ahead of ``end`` is not one of them), never below the first segment, nor
        in it when ``spare_first`` (retention may delete it under a read); None without a segment."""
        segs = self.segments
        if not segs:
            return None
        start = end - end % self.segment_size - (count - 1) * self.segment_size
        return max(start, segs[0].end if spare_first else segs[0].start)

    def find(self, offset: int) -> Segment:
        segs = self.segments
        if not segs or offset < segs[0].start or offset >= segs[-1].end:
            lo = segs[0].start if segs else 0
            hi = segs[-1].end if segs else 0
            raise OutOfRange(f"offset {offset} is outside the files [{lo}, {hi})", min_value=lo, max_value=hi)
        seg = segs[(offset - segs[0].start) // self.segment_size]
        return seg

    def create(self, start: int) -> Segment:
        """Create the segment starting at ``start`` (must follow the last one)."""
        with self.lock:
            last = self.last()
            if last is not None and start != last.end:
                raise FailedPrecondition(f"new segment at {start} does not follow {last.path.name}")
            return self._create_locked(start)

    def ensure(self, end: int, first_start: int) -> None:
        """Create segments until they cover every byte below ``end``; the first one (when there is
        none) starts at ``first_start``. Idempotent: several threads may ask for the same range, and a
        caller that needs a segment another thread is creating waits for it on ``self.lock``."""
        last = self.last()
        if last is not None and last.end >= end:
            return
        with self.lock:
            last = self.last()
            next_start = last.end if last is not None else first_start
            while next_start < end:
                next_start = self._create_locked(next_start).end

    def _create_locked(self, start: int) -> Segment:
        seg = Segment.create(self.directory, start, self.segment_size, preallocate=self.preallocate,
                             durable=self.durable_create)
        if not self.durable_create:
            self._created_unsynced = True
        self.segments = self.segments + (seg,)
        log.info("segment.created", path=str(seg.path), start=start, durable=self.durable_create)
        return seg

    def sync_created(self) -> None:
        """Make the directory entries of the files created since the last call durable (the creation
        rule of mqstore.fs, for ``durable_create=False``). A file's size is made durable by the flush
        of its first bytes; a file that never got any is an empty tail that load removes."""
        if self._created_unsynced:
            self._created_unsynced = False  # before the fsync: a file created meanwhile is covered or flagged
            fs.fsync_dir(self.directory)

    def delete_first(self) -> Segment:
        with self.lock:
            seg = self.segments[0]
            self.segments = self.segments[1:]
        seg.delete()
        return seg

    def delete_expired(self, limit_offset: int, now_ms: int, retention_ms: int,
                       before_delete: Callable[[int], None]) -> int:
        """Retention: delete whole segments, oldest first, that end at or below ``limit_offset`` and
        were last written ``retention_ms`` or more before ``now_ms``; never the last one (the active
        segment), and never one after a segment that stays (never from the middle).
        ``before_delete(new min offset)`` runs before each deletion. Returns how many were deleted.
        Passes are serialised: two at once would both judge the first segment, and the second's
        delete_first would then delete the segment after it, unjudged."""
        deleted = 0
        with self._retention_lock:
            for seg in self.segments[:-1]:
                if seg.end > limit_offset:
                    break
                mtime_ms = int(seg.path.stat().st_mtime * 1000)
                if mtime_ms + retention_ms > now_ms:
                    break
                before_delete(seg.end)
                self.delete_first()
                log.info("retention.segment_deleted", path=str(seg.path), start=seg.start, age_ms=now_ms - mtime_ms)
                deleted += 1
        return deleted

    def delete_first_at(self, start: int) -> bool:
        """Delete the first segment if it starts at ``start`` and is not the last one (the object storage tier's
        local retention: its consume queue entries stay); serialised with :meth:`delete_expired`."""
        with self._retention_lock:
            segs = self.segments
            if len(segs) < 2 or segs[0].start != start:
                return False
            self.delete_first()
            return True

    def delete_from(self, offset: int) -> list[Segment]:
        """Delete every segment starting at or after ``offset`` (truncation). The deletion is made
        durable: later writes count on the files being gone (a file brought back by a power cut would
        bring back entries or records that were cut)."""
        with self.lock:
            keep = tuple(s for s in self.segments if s.start < offset)
            gone = [s for s in self.segments if s.start >= offset]
            self.segments = keep
        for seg in gone:
            seg.delete()
        if gone:
            fs.fsync_dir(self.directory)
        return gone

    def close(self) -> None:
        with self.lock:
            segs, self.segments = self.segments, ()
        for seg in segs:
            seg.close()
