"""The segment warmer: one named duty ("commitlog-warmer", mqstore.background) that keeps the next
``warm_ahead_bytes`` of the commit log in the page cache ahead of the write position (RocketMQ's "warm
mapped file").

Why: copying into a page of a mapped file that is not yet in memory costs a page fault with zeroing,
about 2 us per KiB here, all inside the append lock. Warming the range first moves that cost to this
thread, on the other core. How far it has warmed is published as ``commitlog.resident_offset``: below
it, large writes copy into the mapping instead of going through pwrite (mqstore.log.segment).
Segments ahead are created here too, so a roll waits neither for fallocate nor for the two fsyncs
that make the new segment durable (mqstore.log.segment). A store or OS error (a full disk creating the
next segment: appends will say so) is retried with backoff; a bug ends the duty and makes the store
unhealthy (it used to end it silently).

Two ways to warm, chosen by the store:

  mode      what this thread does to the range ahead     why
  --------- -------------------------------------------- -----------------------------------------------
  read      reads it (os.preadv); reading never changes   ASYNC: no write of its own to the disk
            the bytes, so it cannot race with the writer
  zeros     writes zeros over it and fdatasyncs them,     SYNC: an fdatasync after every append; into
            in claimed chunks of up to 1 MiB that start   preallocated (unwritten) extents each one also
            at least ZERO_LEAD_BYTES past the write       writes the extents' conversion to written (file
            position (CommitLog.claim_for_zeroing: an     system metadata), which zeroed ones do not need
            append never overlaps a chunk being zeroed)   (RocketMQ's warmMappedFile writes zeros too)

Measured here (2 vCPU VM, ext4): an fdatasync of a 115 KiB append took 2.3-3.2 ms (p50, loaded
machine) into unwritten extents against 0.36-0.63 ms into zeroed ones, with half the CPU; and writing
zeros into memory the VM had not touched cost 1.7-2.0 us of CPU per 4 KiB page against 10-16 us for
reading unwritten extents (bench/README.md, issue 20). The price: the range ahead is written to the
disk twice (zeros, then records), and after a crash start reads up to ``warm_ahead_bytes`` of zeros
past the log's end (it reads the file system's data ranges past the end to tell a torn tail).

Thread-safety: reads ``commitlog.written_offset`` (published by the writer) and creates segments
through SegmentQueue.ensure, under the queue's lock and not the append lock: appends go on while a
segment is created, and only an append that needs that very segment waits for it (it would otherwise
create it itself). Zeroing takes the append lock only to claim a chunk (no I/O under it).
"""

from __future__ import annotations

from mqstore.background import Duty
from mqstore.log.segment import PAGE_SIZE

_CHUNK = 1 << 20
ZERO_LEAD_BYTES = 1 << 20  # zeros start this far past the write position (less in a smaller window)
WARM_READ, WARM_ZEROS = "read", "zeros"


class SegmentWarmer(Duty):
    def __init__(self, commitlog, warm_ahead_bytes: int, mode: str = WARM_READ):
        super().__init__("commitlog-warmer", interval_s=1.0, backoff_initial_s=1.0, backoff_max_s=10.0)
        if mode not in (WARM_READ, WARM_ZEROS):
            raise ValueError(f"warm mode must be {WARM_READ!r} or {WARM_ZEROS!r}, not {mode!r}")
        self.commitlog = commitlog
        self.ahead = warm_ahead_bytes
        self.mode = mode
        self._scratch = bytearray(_CHUNK) if mode == WARM_READ else b""
        # A small window or segment (tests) is zeroed in smaller chunks, from nearer the write position.
        chunk = min(_CHUNK, warm_ahead_bytes // 4, commitlog.segment_size // 4)
        self._zero_chunk = max(PAGE_SIZE, chunk // PAGE_SIZE * PAGE_SIZE)
        self._zero_lead = min(ZERO_LEAD_BYTES, self._zero_chunk)
        self._zeros = bytes(self._zero_chunk) if mode == WARM_ZEROS else b""

    def start(self) -> None:
        if self.ahead > 0:
            super().start()

    def poke(self) -> None:
        """Called after appends; cheap: wakes the thread only when half the window is used."""
        if self.commitlog.written_offset + self.ahead // 2 > self.commitlog.resident_offset:
            self.wake()

    def step(self) -> None:
        log_ = self.commitlog
        zeros = self.mode == WARM_ZEROS
        start = max(log_.resident_offset, log_.written_offset + (self._zero_lead if zeros else 0))
        seg_size = log_.segment_size
        # At most into the segment after the current one: small test segments must not multiply.
        target = min(log_.written_offset + self.ahead, (log_.written_offset // seg_size + 2) * seg_size)
        while start < target and not self.stopping:
            last = log_.segments.last()
            if last is None or start >= last.end:
                log_.segments.ensure(start + 1, start - start % seg_size)
                continue
            seg = log_.segments.find(start)
            if zeros:
                stop = min(target, seg.end, start + self._zero_chunk)
                self._zero(seg, start, stop)
            else:
                stop = min(target, seg.end, start + 8 * _CHUNK)
                seg.prefetch(start - seg.start, stop - seg.start, self._scratch)
            start = stop
            log_.resident_offset = start

    def _zero(self, seg, start: int, stop: int) -> None:
        """Zeros over [start, stop) of ``seg``, or over its part the writer has not reached."""
        log_ = self.commitlog
        claimed = log_.claim_for_zeroing(start, stop)
        if claimed >= stop:
            return
        try:
            seg.write_zeros(claimed - seg.start, stop - seg.start, self._zeros)
        finally:
            log_.release_zeroing()
