"""Consume queues: per topic/queue files of 20-byte entries (mqstore.format.cq_unit), derived from
the commit log and rebuilt from it when missing or behind.

Creating files follows the creation rule of mqstore.fs, deferred off the append path: a new file's
(and a new queue directory's) entry is made durable by the next checkpoint, before the manifest that
counts on it (``flush``, QueueTable.sync_created_dirs); its size by the flush of its first entries.
What a power cut leaves of a file created after the last checkpoint (missing, size 0, cut short) is a
trailing file that ``load`` removes, and the replay from the checkpoint writes its entries again.

Files are allocated for real before they are mapped (mqstore.log.segment), and the append path
allocates the files a batch's entries need (``reserve``) before the batch is copied into the log: the
dispatcher runs after the log write, so a full disk found only then would leave records in the log
without their entries. An empty file at the end was reserved ahead for a batch that was refused or
never dispatched; ``load`` removes it.

Files in the object storage tier (issue 36): with the tier's local retention, a queue's oldest sealed files may
be only in the tier (uploaded by mqstore.tier.uploader, deleted locally by mqstore.tier.local_retention).
``remote(byte offset, length)`` (mqstore.tier.reads.TierReader.read_queue_file), when set, serves the entries
below the first local file, down to ``min_offset`` (the total retention's): :meth:`entry` and :meth:`entries`
read them there, also when the file went while the read ran (SegmentClosed). :meth:`extend_down` lowers the
minimum to the tiered files at a start (the local files begin above them then).

Thread-safety: writes (put, truncate, correct_min_offset) come from the dispatcher or the cleaner while
the store's dispatch lock is held; ``reserve`` comes from the append path under the commit log's lock
and only adds files (SegmentQueue.ensure, under the files' own lock). Reads are lock-free below
``max_offset``, which is published after the entry bytes are written.
"""

from __future__ import annotations

import pathlib
import shutil
from typing import Callable

import structlog

from mqstore import fs
from mqstore.errors import InvariantViolation
from mqstore.format import cq_unit
from mqstore.log.segment import SegmentClosed, SegmentQueue

Remote = Callable[[int, int], bytes]  # (byte offset in the queue, length) -> the entries' bytes, from the tier

log = structlog.get_logger()
ENTRY = cq_unit.ENTRY_SIZE


class ConsumeQueue:
    def __init__(self, directory: pathlib.Path, topic: str, queue_id: int, entries_per_file: int):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.files = SegmentQueue(directory, entries_per_file * ENTRY, preallocate=True, durable_create=False)
        self.entries_per_file = entries_per_file
        self.min_offset = 0
        self.max_offset = 0
        self.flushed_offset = 0
        self.max_physical_end = 0  # physical end of the last entry's record
        self.remote: Remote | None = None  # the files only in the tier (module docstring); None: local only

    # ---- load / recover
    def load(self) -> None:
        self.files.load(empty_tail_from=0)  # derived: any empty trailing file goes, replay refills it
        segs = self.files.segments
        while segs and self._valid_prefix(segs[-1]) == 0:
            log.info("consumequeue.empty_file_removed", topic=self.topic, queue_id=self.queue_id,
                     path=str(segs[-1].path))  # reserved ahead, never written: holds nothing
            self.files.delete_from(segs[-1].start)
            segs = self.files.segments
        if not segs:
            return
        self.min_offset = segs[0].start // ENTRY
        last = segs[-1]
        self.max_offset = last.start // ENTRY + self._valid_prefix(last)
        self.flushed_offset = self.max_offset
        if self.max_offset > self.min_offset:
            phys, size, _ = self.entry(self.max_offset - 1)
            self.max_physical_end = phys + size if size != cq_unit.BLANK_SIZE_FIELD else 0

    def _valid_prefix(self, seg) -> int:
        """Entries are written in order, so the valid ones form a prefix: binary search its length."""
        lo, hi = 0, self.entries_per_file
        buf = seg.buffer
        while lo < hi:
            mid = (lo + hi) // 2
            phys, size, _ = cq_unit.decode(buf, mid * ENTRY)
            if cq_unit.is_valid(phys, size):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate_to_log_end(self, log_end: int) -> int:
        """Drop entries whose record ends past ``log_end``; returns how many were dropped."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:  # first offset whose record does not fit below log_end
            mid = (lo + hi) // 2
            phys, size, _ = self.entry(mid)
            if size == cq_unit.BLANK_SIZE_FIELD or phys + size <= log_end:
                lo = mid + 1
            else:
                hi = mid
        dropped = self.max_offset - lo
        if dropped:
            self._zero_from(lo)
            log.warning("consumequeue.truncated", topic=self.topic, queue_id=self.queue_id, from_offset=lo,
                        dropped=dropped)
        return dropped

    def _zero_from(self, offset: int) -> None:
        # the entries written from ``offset`` on, not the rest of their files (zeros past the last entry: the valid
        # prefix); zeroing and flushing every file to its end made a replica's cut cost each queue ~6 MB
        byte_at, written_end = offset * ENTRY, self.max_offset * ENTRY
        for seg in self.files.segments:
            if seg.end > byte_at and seg.start < written_end:
                seg.zero_range(max(0, byte_at - seg.start), min(seg.size, written_end - seg.start))
        first_gone = (byte_at // self.files.segment_size + 1) * self.files.segment_size
        self.files.delete_from(first_gone)
        self.max_offset = max(offset, self.min_offset)
        self.flushed_offset = min(self.flushed_offset, self.max_offset)
        if self.max_offset > self.min_offset:
            phys, size, _ = self.entry(self.max_offset - 1)
            self.max_physical_end = phys + size if size != cq_unit.BLANK_SIZE_FIELD else 0
        else:
            self.max_physical_end = 0

    # ---- write
    def reserve(self, first_offset: int, end_offset: int) -> None:
        """Allocate the files for entries [first_offset, end_offset) now, so that writing them later
        cannot fail. Raises ResourceExhausted on a full disk (nothing is written then)."""
        byte_end = end_offset * ENTRY
        segs = self.files.segments  # files.last() and its end, written out: per queue of every batch
        if segs and segs[-1].start + segs[-1].size >= byte_end:
            return
        byte_first = first_offset * ENTRY
        self.files.ensure(byte_end, byte_first - byte_first % self.files.segment_size)

    def put(self, queue_offset: int, physical_offset: int, size: int, tag_code: int) -> bool:
        """Write one entry; returns False when it was there already (re-dispatch is harmless)."""
        if queue_offset < self.max_offset:
            return False
        if queue_offset > self.max_offset:
            self._fill_blanks(queue_offset)
        self._write(queue_offset, cq_unit.encode(physical_offset, size, tag_code))
        self.max_offset = queue_offset + 1
        self.max_physical_end = physical_offset + size
        return True

    def put_run(self, first_offset: int, entries: list[tuple[int, int, int]]) -> None:
        """Write entries for consecutive queue offsets from ``first_offset`` (the replay's batch path:
        one copy per queue and run instead of one per message). Idempotent like put."""
        if entries:
            pack = cq_unit.ENTRY.pack
            phys, size, _ = entries[-1]
            self.put_packed(first_offset, b"".join([pack(*entry) for entry in entries]), phys + size)

    def put_packed(self, first_offset: int, data: bytes, physical_end: int) -> None:
        """put_run with the entries already in the consume queue unit format (the append path's runs,
        mqstore.log.stamp); ``physical_end`` is the end of the last entry's record."""
        skip = self.max_offset - first_offset
        if skip > 0:
            data = data[skip * ENTRY:]
            first_offset += skip
        if not data:
            return
        if first_offset > self.max_offset:
            self._fill_blanks(first_offset)
        byte_at = first_offset * ENTRY
        segs = self.files.segments  # files.last() and its end, written out: per queue of every batch
        last = segs[-1] if segs else None
        if last is not None and 0 <= byte_at - last.start <= last.size - len(data):
            last.write(byte_at - last.start, data)  # the usual case (reserved by the append): one file
        else:
            self._write_across(byte_at, data)
        self.max_offset = first_offset + len(data) // ENTRY
        self.max_physical_end = physical_end

    def _write_across(self, byte_at: int, data: bytes) -> None:
        file_size = self.files.segment_size
        view = memoryview(data)
        while view:
            room = file_size - byte_at % file_size
            self._write(byte_at // ENTRY, view[:room])
            byte_at += min(room, len(view))
            view = view[room:]

    def _fill_blanks(self, queue_offset: int) -> None:
        first_ever = self.max_offset == 0  # no entry yet (its file may have been reserved already)
        if first_ever:
            # The log's head was deleted before this queue was built: start the files at this offset.
            start = queue_offset * ENTRY - (queue_offset * ENTRY) % self.files.segment_size
            self.files.ensure(queue_offset * ENTRY + ENTRY, start)
            self.min_offset = self.max_offset = start // ENTRY
        else:
            log.error("consumequeue.gap", topic=self.topic, queue_id=self.queue_id, expected=self.max_offset,
                      got=queue_offset)
        for offset in range(self.max_offset, queue_offset):
            self._write(offset, cq_unit.BLANK_ENTRY)
        self.max_offset = queue_offset
        if first_ever:
            self.min_offset = queue_offset

    def _write(self, queue_offset: int, data: bytes) -> None:
        byte_at = queue_offset * ENTRY
        last = self.files.last()
        if last is None or byte_at >= last.end:  # not reserved (replay at start): allocate it now
            self.files.ensure(byte_at + 1, byte_at - byte_at % self.files.segment_size)
        seg = self.files.find(byte_at)
        seg.write(byte_at - seg.start, data)

    def flush(self) -> None:
        """fdatasync the entries written since the last flush (and with them the sizes of the files
        they went into), then make the creation of new files durable."""
        target = self.max_offset
        if target > self.flushed_offset:
            from_byte, to_byte = self.flushed_offset * ENTRY, target * ENTRY
            for seg in self.files.segments:
                if seg.end > from_byte and seg.start < to_byte:
                    seg.flush(max(from_byte, seg.start) - seg.start, min(to_byte, seg.end) - seg.start)
            self.flushed_offset = target
        self.files.sync_created()

    # ---- read
    def entry(self, queue_offset: int) -> tuple[int, int, int]:
        byte_at = queue_offset * ENTRY
        if self._tiered(byte_at):
            return cq_unit.decode(self.remote(byte_at, ENTRY), 0)
        try:
            seg = self.files.find(byte_at)
            return cq_unit.decode(seg.buffer, byte_at - seg.start)
        except SegmentClosed:
            if not self._tiered(byte_at):
                raise
            return cq_unit.decode(self.remote(byte_at, ENTRY), 0)  # deleted locally meanwhile: uploaded before

    def entries(self, from_offset: int, count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` entries from ``from_offset`` (stops at max_offset and at a file end)."""
        return list(cq_unit.ENTRY.iter_unpack(self.entry_bytes(from_offset, count)))

    def entry_bytes(self, from_offset: int, count: int) -> bytes:
        """:meth:`entries` as their bytes, 20 an entry (the timer's enqueue reads them in C: no tuple an entry)."""
        end = min(self.max_offset, from_offset + count)
        if from_offset >= end:
            return b""
        byte_at = from_offset * ENTRY
        if not self._tiered(byte_at):
            try:
                seg = self.files.find(byte_at)
                stop = min(end * ENTRY, seg.end)
                return seg.read(byte_at - seg.start, stop - byte_at)
            except SegmentClosed:
                if not self._tiered(byte_at):
                    raise
        file_size = self.files.segment_size
        stop = min(end * ENTRY, byte_at - byte_at % file_size + file_size)
        return self.remote(byte_at, stop - byte_at)

    def is_hot(self, queue_offset: int) -> bool:
        """Whether the entries from ``queue_offset`` on are in the queue's last two files written (never the first
        while the tier serves the files below it: local retention may delete it under a read), so that reading
        them opens no file and reads no tier (CommitLog.is_hot's rule for the queue's files)."""
        start = self.files.hot_start(self.max_offset * ENTRY, 2, spare_first=self.remote is not None)
        return start is not None and queue_offset * ENTRY >= start and not self._tiered(queue_offset * ENTRY)

    def _tiered(self, byte_at: int) -> bool:
        """Whether the entry at ``byte_at`` is read from the tier: below the first local file, with ``remote``."""
        return self.remote is not None and byte_at < self.files.min_offset and byte_at >= self.min_offset * ENTRY

    def extend_down(self, offset: int) -> None:
        """At a start, with ``remote`` set: the queue's entries reach down to ``offset`` (a file's first entry,
        the lowest of the files uploaded right below the first local one); the total retention raises the
        minimum from there (correct_min_offset)."""
        if self.remote is not None and offset < self.min_offset and offset * ENTRY % self.files.segment_size == 0:
            log.info("consumequeue.tiered_files", topic=self.topic, queue_id=self.queue_id, from_offset=offset,
                     local_from=self.min_offset)
            self.min_offset = offset

    def start_from_tier(self, min_offset: int, first_offset: int, entries: bytes, physical_end: int) -> None:
        """A replica that joins from the tier (mqstore.replication.tier_join), on an empty queue with ``remote`` set:
        its leader's ``entries`` from ``first_offset`` (a file's first entry: the files below are in the tier), the
        minimum ``min_offset`` (the total retention's); the replica's copy of the tail appends after them."""
        if self.remote is None or self.max_offset or self.files.segments:
            raise InvariantViolation(f"consume queue {self.topic}/{self.queue_id}: a start from the tier needs an "
                                     f"empty queue reading the tier")
        if first_offset * ENTRY % self.files.segment_size:
            raise InvariantViolation(f"consume queue {self.topic}/{self.queue_id}: {first_offset} is no file's start")
        self.files.ensure(first_offset * ENTRY + max(len(entries), 1), first_offset * ENTRY)
        if entries:
            self._write_across(first_offset * ENTRY, entries)
        self.flushed_offset = first_offset  # the next flush covers the entries written here
        self.max_offset = first_offset + len(entries) // ENTRY
        self.max_physical_end = physical_end
        self.min_offset = min(min_offset, self.max_offset)
        log.info("consumequeue.started_from_tier", topic=self.topic, queue_id=self.queue_id, min_offset=self.min_offset,
                 local_from=first_offset, max_offset=self.max_offset)

    def delete_tiered_file(self) -> None:
        """Local retention (mqstore.tier.local_retention): delete the first local file, uploaded and FINISHED
        (``remote`` serves its entries from now on); the minimum stays (the total retention's). Never the last."""
        if self.remote is None or len(self.files.segments) < 2:
            raise InvariantViolation(f"consume queue {self.topic}/{self.queue_id}: no tiered read for the file")
        self.files.delete_first()

    def holds_below(self, physical_offset: int) -> bool:
        """Whether the queue's entries point below ``physical_offset`` (entries are in log order: its first
        live entry does; with none live, its last one did): a topic's queue holding records of an earlier
        topic of the same name."""
        if self.min_offset < self.max_offset:
            phys, size, _ = self.entry(self.min_offset)
            if size != cq_unit.BLANK_SIZE_FIELD:
                return phys < physical_offset
        return 0 < self.max_physical_end <= physical_offset

    def offset_by_time(self, timestamp_ms: int, upper: bool, store_time_of) -> int:
        """LOWER: first offset with store time >= ts; UPPER: last offset with store time <= ts.
        Clamped into [min_offset, max_offset]."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            phys, size, _ = self.entry(mid)
            try:
                ts = store_time_of(phys) if size != cq_unit.BLANK_SIZE_FIELD else -1
            except SegmentClosed:
                ts = -1
            if ts < timestamp_ms or (upper and ts == timestamp_ms):
                lo = mid + 1
            else:
                hi = mid
        if upper:
            return max(self.min_offset, lo - 1) if lo > self.min_offset else self.min_offset
        return lo

    def first_entry_from(self, physical_offset: int, lo: int, hi: int) -> int:
        """The first queue offset in [lo, hi) whose record starts at or above ``physical_offset`` (``hi`` when
        none does): entries are in log order, a blank entry counts as below."""
        while lo < hi:
            mid = (lo + hi) // 2
            phys, size, _ = self.entry(mid)
            if size == cq_unit.BLANK_SIZE_FIELD or phys < physical_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ---- retention
    def correct_min_offset(self, log_min_offset: int) -> None:
        """First entry whose record is still in the log becomes the minimum; older files go."""
        lo = self.first_entry_from(log_min_offset, self.min_offset, self.max_offset)
        if lo == self.min_offset:
            return
        self.min_offset = lo
        segs = self.files.segments
        while len(segs) > 1 and segs[0].end <= lo * ENTRY:
            self.files.delete_first()
            segs = self.files.segments

    def raise_min_offset(self, offset: int) -> None:
        """Logical retention (per-topic retention time): hide entries below ``offset``."""
        if offset > self.min_offset:
            if offset > self.max_offset:
                raise InvariantViolation(f"min offset {offset} past max {self.max_offset}")
            self.min_offset = offset

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        # Durable: a queue directory brought back by a power cut would serve its old entries to a
        # topic created again under the same name, or beside a rebuilt queue.
        if self.directory.parent.is_dir():
            fs.fsync_dir(self.directory.parent)
