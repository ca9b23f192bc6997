"""The commit log: segments, the append lock, queue offset assignment, raw reads.

Append protocol (RocketMQ's, with the copy batched): records are encoded outside the lock; inside
``lock`` the store time is taken (never going backwards), queue offsets are assigned from the
in-memory table, physical offsets and times are stamped into the batch buffer, and the buffer is
copied into the active segment in as few slices as possible. A record that does not fit the rest of
a segment (with 8 bytes to spare) is moved whole into the next segment, after an 8-byte blank record
that claims the remainder. Segments needed by a batch are created before any byte is copied, and so
are the consume queue files its entries will need (``reserve_queue_files``, called under the lock once
the queue offsets are known), so a full disk rejects the batch whole.

Zeroing ahead (SYNC; mqstore.log.warmer): the segment warmer writes zeros into the log ahead of the
writer. It claims the range first (:meth:`claim_for_zeroing`, under ``lock``, so no append is placing
bytes then, and only past ``written_offset``) and releases it once the zeros are durable; an append whose
batch would reach into the claimed range waits for the release. So zeros never land on a record.

Reads below the local log (issue 36): with the object storage tier's local retention, the oldest segments may
be only in the tier. ``remote(physical offset, size)`` (mqstore.tier.reads.TierReader.read), when set, serves
:meth:`read`, :meth:`record_at` and :meth:`store_timestamp_at` below the first local segment (and a read that
met a segment deleted meanwhile), so Pull and GetMessage(s) read them with the same checks; :meth:`frame`
(Tail) and :meth:`check_resume_point` too, record by record through ``remote`` (its read-ahead blocks make that
sequential), down to ``remote_floor()`` (:meth:`logical_min`: the logical log's start, the total retention's).
A tier record that does not frame (damage uploaded with its segment) is DataLoss naming its offset: unlike a
local one, the span to the next record is not scanned.

Thread-safety: ``append`` is serialised by ``lock``; ``written_offset`` is published after the copy,
so readers may read any byte below it without a lock. The zeroing claim is guarded by ``_zeroing``; ``reshaping``
keeps the segment warmer's creations apart from a replica's cut or restart of the log (taken before ``lock``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import structlog

from mqstore import codec, failpoints
from mqstore.errors import (DataLoss, FailedPrecondition, InvalidArgument, NotFound, OutOfRange, Unavailable,
                            invariant)
from mqstore.format import record, record_reader, record_scan
from mqstore.log import stamp
from mqstore.log.encoder import EncodedBatch
from mqstore.log.segment import PAGE_SIZE, SegmentClosed, SegmentQueue

log = structlog.get_logger()
# The batch's placing and stamping under the lock: compiled when the codec is (mqstore.log.stamp).
_place = stamp.place if codec.compiled is None else codec.compiled.place
_stamp = stamp.stamp if codec.compiled is None else codec.compiled.stamp
_queue_ranges = stamp.queue_ranges if codec.compiled is None else codec.compiled.queue_ranges
_NO_CLAIM = 1 << 63  # _zeroing_from while the warmer writes no zeros
ZEROING_WAIT_S = 30.0  # an append waits this long at most for the warmer's zeros ahead of it


@dataclass(slots=True)
class Written:
    """What the dispatcher needs of an appended batch: per record (physical offset, size, queue id,
    queue offset, tag code, sys flag), all with one store time; ``end`` is the log end after it;
    ``runs`` the consume queue entries per queue id (stamp.stamp). ``entries`` is a list of tuples, or the
    compiled stamp's Entries, which reads as one."""

    topic: str
    end: int
    store_timestamp_ms: int
    entries: Sequence[tuple[int, int, int, int, int, int]]
    runs: dict[int, tuple[int, bytes, int]]


# (topic, {queue id: (first queue offset, end queue offset)}) -> None; raises ResourceExhausted.
ReserveQueueFiles = Callable[[str, dict[int, tuple[int, int]]], None]


# The segments at the log's end whose reads may be answered on an event loop (CommitLog.is_hot)
HOT_SEGMENTS = 2


class CommitLog:
    def __init__(self, segments: SegmentQueue, clock, reserve_queue_files: ReserveQueueFiles | None = None):
        self.segments = segments
        self.reserve_queue_files = reserve_queue_files
        self.segment_size = segments.segment_size
        self.clock = clock
        self.lock = threading.Lock()
        # Held while a replica's log is cut back or restarted at another offset (mqstore.replication.log_ops), and by
        # the segment warmer while it creates or zeros segments from the written offset it read: a warmer that read
        # the offset before a restart would otherwise create the new log's first segment where the old one was.
        # Taken before ``lock``; appends never take it.
        self.reshaping = threading.Lock()
        self.written_offset = 0
        # SYNC: the log is zeroed and fdatasynced up to here, ahead of written_offset: the segment warmer
        # publishes how far (mqstore.log.warmer). Its own bookkeeping, never for correctness; a plain int,
        # replaced whole.
        self.resident_offset = 0
        self._zeroing = threading.Condition(threading.Lock())
        self._zeroing_from = _NO_CLAIM
        self.last_store_timestamp_ms = 0
        self.next_queue_offsets: dict[tuple[str, int], int] = {}
        self.pending: collections.deque[Written] = collections.deque()
        # Batches, records and record bytes appended by :meth:`append` (not the replicated ones), counted under
        # ``lock``; read without it (the store's metrics: one int each, replaced whole).
        self.appended_batches = self.appended_messages = self.appended_bytes = 0
        # The store's topic registry (store_topics.TopicRegistry.start_of): a batch is appended only while
        # its topic is the one it was encoded for (not deleted meanwhile, nor deleted and created again).
        self.topic_start: Callable[[str], int | None] | None = None
        # The object storage tier's reads below the local log (module docstring); None: the local log only.
        self.remote: Callable[[int, int], bytes] | None = None
        self.remote_floor: Callable[[], int] | None = None  # the logical log's start with ``remote``

    # ---- recovery hands over the state it found
    def restore(self, end_offset: int, last_store_timestamp_ms: int, next_queue_offsets: dict) -> None:
        with self.lock:
            self.written_offset = end_offset
            self.last_store_timestamp_ms = last_store_timestamp_ms
            self.next_queue_offsets = dict(next_queue_offsets)

    @property
    def min_offset(self) -> int:
        segs = self.segments.segments
        return segs[0].start if segs else self.written_offset

    # ---- append
    def append(self, batch: EncodedBatch) -> Written:
        with self.lock:
            if self.topic_start is not None and self.topic_start(batch.topic) != batch.incarnation:
                raise NotFound(f"topic {batch.topic!r} was deleted while this append was under way; nothing of "
                               f"the batch was written (create the topic again to write to it)")
            now = self.clock.now_ms()
            if now < self.last_store_timestamp_ms:
                now = self.last_store_timestamp_ms
            plan = self._plan(batch.sizes)
            end = plan[-1][1] + plan[-1][3] if plan else self.written_offset
            if end > self._zeroing_from:
                self._wait_for_zeroing(end)
            ranges = self._queue_ranges(batch)
            if self.reserve_queue_files is not None:
                self.reserve_queue_files(batch.topic, ranges)
            entries, runs = self._assign_and_stamp(batch, plan, ranges, now)
            self._copy(batch.buf, plan)
            self.last_store_timestamp_ms = now
            self.written_offset = end
            written = Written(batch.topic, end, now, entries, runs)
            self.pending.append(written)
            self.appended_batches += 1
            self.appended_messages += len(batch.sizes)
            self.appended_bytes += len(batch.buf)
        failpoints.hit("log.after_write")
        return written

    # ---- zeroing ahead (the segment warmer)
    def claim_for_zeroing(self, start: int, end: int) -> int:
        """Claim [from, end) for the warmer's zeros, from = ``start`` or, if the writer is past it, the
        first page boundary after ``written_offset``; returns from (nothing is claimed when it is at or
        past ``end``). Release with :meth:`release_zeroing`."""
        with self.lock:  # no append is placing bytes now: the next one starts at written_offset
            start = max(start, -(-self.written_offset // PAGE_SIZE) * PAGE_SIZE)
            if start < end:
                with self._zeroing:
                    invariant(self._zeroing_from == _NO_CLAIM, "one zeroing claim at a time")
                    self._zeroing_from = start
        return start

    def release_zeroing(self) -> None:
        with self._zeroing:
            self._zeroing_from = _NO_CLAIM
            self._zeroing.notify_all()

    def _wait_for_zeroing(self, end: int) -> None:
        """Under ``lock``: wait until no claimed range starts below ``end`` (the writer caught up with the
        warmer's zeros)."""
        deadline = self.clock.monotonic_s() + ZEROING_WAIT_S
        with self._zeroing:
            while end > self._zeroing_from:
                left = deadline - self.clock.monotonic_s()
                if left <= 0:
                    raise Unavailable(f"the segment warmer has been writing zeros ahead of the log for over "
                                      f"{ZEROING_WAIT_S:.0f} s (a stalled disk?); nothing of this batch was "
                                      f"written, retry")
                self._zeroing.wait(min(left, 0.5))

    def append_replicated(self, offset: int, data: bytes, next_offset: int) -> None:
        """A replica's append: the leader's bytes at the same physical offset (whole records, or a blank
        record that ends the segment: ``next_offset`` is then the next segment's start)."""
        with self.lock:
            if offset != self.written_offset:
                raise FailedPrecondition(f"replicated bytes start at physical offset {offset} but this log ends at "
                                         f"{self.written_offset}")
            end = offset + len(data)
            invariant(end <= next_offset, "replicated bytes end at or before their next offset")
            if data:
                self._ensure_segments(end)
                if end > self._zeroing_from:  # the warmer's zeros must not land on these bytes
                    self._wait_for_zeroing(end)
                seg = self.segments.find(offset)
                if end > seg.end:
                    raise FailedPrecondition(f"replicated bytes [{offset}, {end}) cross the end of segment "
                                             f"{seg.path.name}: the leader's segment size differs")
                seg.write(offset - seg.start, data)
            self.written_offset = next_offset

    def _plan(self, sizes: list[int]) -> list[stamp.Chunk]:
        """Chunks of the batch per segment (stamp.place). Creates the segments the batch needs before
        anything is written."""
        chunks, end = _place(sizes, self.written_offset, self.segment_size)
        self._ensure_segments(end)
        return chunks

    def _ensure_segments(self, end: int) -> None:
        """The segments below ``end`` (at least the one holding written_offset). The segment warmer has
        usually created them already, off this path: creating one here (the warmer is off or behind)
        includes making it durable, two fsyncs (mqstore.log.segment)."""
        first = self.written_offset - self.written_offset % self.segment_size
        self.segments.ensure(max(end, first + 1), first)

    def _queue_ranges(self, batch: EncodedBatch) -> dict[int, tuple[int, int]]:
        """The queue offsets [first, end) each queue of the batch will take (_assign_and_stamp's rule)."""
        return _queue_ranges(batch.queue_ids, batch.sys_flags, self.next_queue_offsets, batch.topic)

    def _assign_and_stamp(self, batch: EncodedBatch, plan, ranges: dict[int, tuple[int, int]], now: int):
        """Stamp the batch (stamp.stamp) and advance its queues' next offsets to the ends of ``ranges``."""
        entries, runs = _stamp(batch.buf, plan, batch.sizes, batch.queue_ids, batch.tag_codes, batch.sys_flags,
                               {qid: first for qid, (first, _) in ranges.items()}, now)
        table, topic = self.next_queue_offsets, batch.topic
        for qid, (_, end) in ranges.items():
            table[(topic, qid)] = end
        return entries, runs

    def _copy(self, buf: bytearray, plan) -> None:
        cur = self.written_offset
        view = memoryview(buf)
        for buf_from, phys_from, buf_to, length in plan:
            if phys_from != cur:  # the rest of the previous segment becomes a blank record
                seg = self.segments.find(cur)
                seg.write(cur - seg.start, record.encode_blank(phys_from - cur))
            seg = self.segments.find(phys_from)
            invariant(phys_from + length <= seg.end, "a chunk stays inside one segment")
            seg.write(phys_from - seg.start, view[buf_from:buf_to])
            cur = phys_from + length

    # ---- reads (lock-free below written_offset)
    def read(self, physical_offset: int, size: int) -> bytes:
        remote = self.remote
        if remote is not None and physical_offset < self.segments.min_offset:
            return remote(physical_offset, size)
        try:
            seg = self.segments.find(physical_offset)
            return seg.read(physical_offset - seg.start, size)
        except (SegmentClosed, OutOfRange):
            if remote is None or physical_offset >= self.segments.min_offset:
                raise
            return remote(physical_offset, size)  # deleted locally while this read ran: uploaded before

    def is_hot(self, physical_offset: int) -> bool:
        """Whether reads from ``physical_offset`` on stay in the local log's hot segments: the :data:`HOT_SEGMENTS`
        up to the one holding ``written_offset`` (it and the one written before it; not one created ahead), never
        the first local segment while the tier serves reads below the log (its local retention may delete that
        segment under a read, which then goes to the tier). Such a read opens no file and reads no tier: every
        local segment is mapped (mqstore.log.segment), and these were written last (their pages are the page
        cache's as a rule). An event loop may run it (mqstore.hot_reads)."""
        start = self.segments.hot_start(self.written_offset, HOT_SEGMENTS, spare_first=self.remote is not None)
        return start is not None and physical_offset >= start

    def _remote_below(self, physical_offset: int) -> bool:
        return self.remote is not None and physical_offset < self.segments.min_offset

    def _remote_record_at(self, physical_offset: int) -> bytes:
        head = self.read(physical_offset, record.PREFIX.size)
        size, magic = record.PREFIX.unpack_from(head) if len(head) == record.PREFIX.size else (0, 0)
        if magic == record.MAGIC_BLANK:
            raise NotFound(f"physical offset {physical_offset} is the blank end of its segment (in the tier)")
        if size < record.FIXED_OVERHEAD or size > self.segment_size:
            raise NotFound(f"no record starts at physical offset {physical_offset} (in the tier: size {size})")
        data = self.read(physical_offset, size)
        try:
            record_reader.check(data, 0, len(data), verify_crc=False)
        except record_reader.RecordError as exc:
            raise NotFound(f"no record starts at physical offset {physical_offset} (in the tier: {exc})") from None
        return data

    def record_at(self, physical_offset: int, limit: int) -> bytes:
        """The whole record starting at ``physical_offset`` (below ``limit``); NotFound if none."""
        if self._remote_below(physical_offset) and physical_offset < limit:
            return self._remote_record_at(physical_offset)
        if physical_offset < self.min_offset or physical_offset >= limit:
            raise OutOfRange(
                f"physical offset {physical_offset} is outside the log [{self.min_offset}, {limit})",
                min_value=self.min_offset, max_value=limit)
        seg = self.segments.find(physical_offset)
        pos = physical_offset - seg.start
        try:
            size = record_reader.check(seg.buffer, pos, min(seg.size, limit - seg.start), verify_crc=False)
        except record_reader.RecordError as exc:
            raise NotFound(f"no record starts at physical offset {physical_offset} ({exc})") from None
        if record_reader.is_blank(seg.buffer, pos):
            raise NotFound(f"physical offset {physical_offset} is the blank end of segment {seg.path.name}")
        return seg.read(pos, size)

    def decode_at(self, physical_offset: int, size: int, queue_offset: int | None = None) -> record_reader.Record:
        """The record at ``physical_offset``, checked (CRC included, and that it names its own physical
        offset). DataLoss names the bad record, and for a queue read its queue offset, so a consumer can
        skip it deliberately (offset + 1)."""
        data = self.read(physical_offset, size)
        try:
            return record_reader.decode(data, 0, physical_offset=physical_offset)
        except record_reader.RecordError as exc:
            raise _damaged(exc, physical_offset, queue_offset) from None

    def checked_at(self, physical_offset: int, size: int, queue_offset: int | None = None) -> bytes:
        """:meth:`decode_at` without the decoding: the record's bytes (from position 0), checked the same
        way (by the record walk, compiled when the codec is), with the same DataLoss."""
        data = self.read(physical_offset, size)
        try:
            if record_scan.walk(data, 0, len(data), base=physical_offset).records == 0:
                record_reader.decode(data, 0, physical_offset=physical_offset)  # says why (RecordError)
                invariant(False, f"the record walk refused the record at {physical_offset}, its reference not")
        except record_reader.RecordError as exc:
            raise _damaged(exc, physical_offset, queue_offset) from None
        return data

    def logical_min(self) -> int:
        """The log's start for a reader: below the local log down to ``remote_floor()`` when the tier serves."""
        if self.remote is not None and self.remote_floor is not None:
            return min(self.remote_floor(), self.min_offset)
        return self.min_offset

    def check_resume_point(self, physical_offset: int) -> None:
        """InvalidArgument unless a record starts at ``physical_offset`` (below the written offset), where
        a reader may start a Tail. A record damaged since a reader got there still names its own
        offset: it is accepted (its frame comes alone, see :meth:`frame`), or that reader could never
        go on."""
        if self._remote_below(physical_offset):
            try:
                data = self._remote_record_at(physical_offset)
            except NotFound:
                data = b""
            if not data or record_reader.stored_physical_offset(data, 0) != physical_offset:
                raise InvalidArgument(f"no record starts at physical offset {physical_offset} (in the tier); resume "
                                      f"from a next_physical_offset of a previous frame")
            return
        seg = self.segments.find(physical_offset)
        position = physical_offset - seg.start
        try:
            record_reader.check(seg.buffer, position, seg.size, verify_crc=False)
        except record_reader.RecordError:
            if (position + record.PHYSICAL_OFFSET_AT + 8 > seg.size
                    or record_reader.stored_physical_offset(seg.buffer, position) != physical_offset):
                raise InvalidArgument(f"no record starts at physical offset {physical_offset}; resume from a "
                                      f"next_physical_offset of a previous frame") from None

    def store_timestamp_at(self, physical_offset: int) -> int:
        if self._remote_below(physical_offset):
            return record_reader.store_timestamp(self._remote_record_at(physical_offset), 0)
        seg = self.segments.find(physical_offset)
        return record_reader.store_timestamp(seg.buffer, physical_offset - seg.start)

    def frame(self, start: int, limit: int, max_bytes: int, topics: frozenset[bytes],
              tx_types: frozenset[int] = frozenset()):
        """Whole records from ``start`` up to ``limit``: (records bytes, count, next offset).
        Blank records are skipped; with ``topics`` only records of those topics are returned. At least
        one record is returned when one is visible, whatever its size; with ``tx_types`` (SYSFLAG
        transaction values) a record of another topic is taken too when its type is one of them (the
        Transaction service follows its topics and every COMMIT record); a filtered scan stops after
        16 x max_bytes so a frame is bounded in time too.

        Without ``topics`` a frame is contiguous: its records are the log's bytes
        [next offset - len(records), next offset) (a frame ends before a blank record rather than
        jumping over it), so a reader knows the physical offset of every byte of it.

        Damage found after start must not misalign the stream, so a record goes into a frame only if
        it is sound (record_scan.frameable). A record that is not ends the frame before it; a frame
        that starts at one holds only the damaged bytes, up to the next record that names itself
        (record_scan.next_record_start), whatever the topic filter: readers find them failing their
        checks and go on at the next offset."""
        if self._remote_below(start):
            return self._remote_frame(start, limit, max_bytes, topics, tx_types)
        try:
            return self._local_frame(start, limit, max_bytes, topics, tx_types)
        except (OutOfRange, ValueError):  # SegmentClosed, or a mapping closed under struct: local retention
            if not self._remote_below(start):
                raise
            return self._remote_frame(start, limit, max_bytes, topics, tx_types)  # uploaded before it went

    def _local_frame(self, start: int, limit: int, max_bytes: int, topics: frozenset[bytes],
                     tx_types: frozenset[int]):
        seg = self.segments.find(start)
        buf = seg.buffer
        pos = start - seg.start
        end = min(seg.size, limit - seg.start)
        unpack, frameable, peek_topic = record.PREFIX.unpack_from, record_scan.frameable, record_reader.peek_topic
        peek_sys_flag, filtered = record_reader.peek_sys_flag, bool(topics or tx_types)
        scan_limit = pos + 16 * max_bytes
        pieces = []
        run_from = -1
        count = taken = 0
        while pos < end and pos < scan_limit:
            size, magic = unpack(buf, pos)
            if magic == record.MAGIC_BLANK:
                if not count:
                    pos = seg.size  # nothing taken: jump to the next segment
                break  # else end the frame at the blank, so an unfiltered frame is contiguous
            if not frameable(buf, pos, size, magic, end, seg.start):
                if count:
                    break
                nxt = record_scan.next_record_start(buf, pos, end, seg.start)
                log.error("tail.damaged_record", file=str(seg.path), position=pos, physical_offset=seg.start + pos,
                          next_physical_offset=seg.start + nxt)
                return seg.read(pos, nxt - pos), 1, seg.start + nxt
            if count and taken + size > max_bytes:
                break
            if (not filtered or peek_topic(buf, pos) in topics
                    or (tx_types and (peek_sys_flag(buf, pos) & record.SYSFLAG_TX_MASK) in tx_types)):
                if run_from < 0:
                    run_from = pos
                taken += size
                count += 1
            elif run_from >= 0:
                pieces.append(seg.read(run_from, pos - run_from))
                run_from = -1
            pos += size
        if run_from >= 0:
            pieces.append(seg.read(run_from, pos - run_from))
        return b"".join(pieces), count, seg.start + pos

    def _remote_frame(self, start: int, limit: int, max_bytes: int, topics: frozenset[bytes],
                      tx_types: frozenset[int]):
        """:meth:`frame` of a segment only in the tier, record by record through ``remote``, up to its end."""
        seg_end = start - start % self.segment_size + self.segment_size
        end = min(seg_end, limit)
        filtered = bool(topics or tx_types)
        scan_limit = start + 16 * max_bytes
        pieces: list[bytes] = []
        pos, count, taken = start, 0, 0
        while pos < end and pos < scan_limit:
            head = self.read(pos, record.PREFIX.size)
            size, magic = record.PREFIX.unpack_from(head) if len(head) == record.PREFIX.size else (0, 0)
            if magic == record.MAGIC_BLANK or len(head) < record.PREFIX.size:  # the segment's end
                if not count:
                    pos = seg_end
                break
            if count and taken + size > max_bytes:
                break
            if magic != record.MAGIC_V1 or size < record.FIXED_OVERHEAD or pos + size > seg_end:
                if count:
                    break
                raise DataLoss(f"the record at physical offset {pos} in the tier does not frame (size {size}, "
                               f"magic {magic:#x}); a Tail cannot go past it", physical_offset=pos)
            data = self.read(pos, size)
            try:
                record_reader.check(data, 0, len(data), verify_crc=False)
            except record_reader.RecordError as exc:
                if count:
                    break
                raise DataLoss(f"the record at physical offset {pos} in the tier is damaged ({exc}); a Tail cannot "
                               f"go past it", physical_offset=pos) from None
            if (not filtered or record_reader.peek_topic(data, 0) in topics
                    or (tx_types and (record_reader.peek_sys_flag(data, 0) & record.SYSFLAG_TX_MASK) in tx_types)):
                pieces.append(data)
                taken += size
                count += 1
            pos += size
        return b"".join(pieces), count, pos


def _damaged(exc: record_reader.RecordError, physical_offset: int, queue_offset: int | None) -> DataLoss:
    where = f"queue offset {queue_offset}, " if queue_offset is not None else ""
    skip = f"; to skip it, read from queue offset {queue_offset + 1}" if queue_offset is not None else ""
    return DataLoss(f"the record at {where}physical offset {physical_offset} fails its checks ({exc}); it "
                    f"is not served{skip}", physical_offset=physical_offset, queue_offset=queue_offset)
