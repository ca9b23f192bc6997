"""The segment warmer: one named duty ("commitlog-warmer", mqstore.background) that works ahead of the write
position, up to ``warm_ahead_bytes`` past it (RocketMQ's "warm mapped file"), and behind it: what was flushed more
than ``page_cache_keep_bytes`` ago is given back to the kernel (drop-behind, below).

It creates the segments ahead, so that a roll waits neither for fallocate nor for the two fsyncs that make
the new segment durable (mqstore.log.segment). A store or OS error (a full disk creating the next segment:
appends will say so) is retried with backoff; a bug ends the duty and makes the store unhealthy (it used to
end it silently).

Two modes, chosen by the store:

  mode      what this thread does to the range ahead     why
  --------- -------------------------------------------- -----------------------------------------------
  create    creates its segments; nothing else: batches  ASYNC: a pwrite into pages the page cache does
            go into the page cache by pwrite, small      not hold yet fills them without zeroing them
            writes through the mapping                   first (the cheapest way in)
  zeros     also writes zeros over it and fdatasyncs     SYNC: an fdatasync after every append; into
            them, in claimed chunks of up to 1 MiB that  preallocated (unwritten) extents each one also
            start at least ZERO_LEAD_BYTES past the      writes the extents' conversion to written (file
            write position (CommitLog.claim_for_zeroing: system metadata), which zeroed ones do not need
            an append never overlaps a chunk being       (RocketMQ's warmMappedFile writes zeros too)
            zeroed); how far is published as
            ``commitlog.resident_offset``

Measured for zeros (2 vCPU VM, ext4): an fdatasync of a 115 KiB append took 2.3-3.2 ms (p50, loaded
machine) into unwritten extents against 0.36-0.63 ms into zeroed ones, with half the CPU (bench/README.md,
issue 20). Measured again on 2026-11-29 (a single writer, 110 KB pwrite + fdatasync each): 0.13-0.14 ms against
0.29-0.30 ms, but the zeros cost about as much CPU as they save, and the SYNC group-commit rate was the same
either way. The price: the range ahead is written to the disk twice (zeros, then records), and after a crash
start reads up to ``warm_ahead_bytes`` of zeros past the log's end (it reads the file system's data ranges
past the end to tell a torn tail).

ASYNC used to read the range ahead into the page cache (os.preadv) and copy batches into the mapping below
it. On this machine that cost more than it saved: reading a never-written extent allocates and zeroes each
page, then copies it out to the reader, and the later copy through the mapping takes a fault per page to map
it; a pwrite allocates the page and copies into it once. Append 100 x 1 KiB, 32 producers, ASYNC, two
alternating runs of three rounds: 190,000-215,000 msgs/s reading ahead against 231,000-288,000 creating only,
600-650 against 360-470 us of server CPU a call (the reading thread alone 175 us); single-message appends
the same within the noise (bench/README.md, *The warmer under ASYNC*).

Drop-behind. A log is written once and read mostly near its end, yet every byte written takes a new page of the page
cache, kept until memory runs short. On a virtual machine whose free memory goes back to its host (free page
reporting, balloons: the Firecracker VM this project's benchmarks ran on) a page the guest has not used lately
costs a fault in the host as well: there, writing into the page cache cost 75-83 us a 256 KiB pwrite for the first
~1.5 GiB and 850-1,200 us after it, steadily (bench/README.md, *Drop-behind*), system time the writing thread pays.
So once ``page_cache_keep_bytes`` of the log lie between a range and the flushed offset, the range's pages are
dropped (Segment.drop_cache: the mapping's pages, then the page cache's), in steps of ``_DROP_STEP``, and the next
writes take the pages just freed: 104-139 us a pwrite throughout the same 5 GiB. Reads within the window are
served from memory as before; a reader further behind reads from the disk, as it would once the page cache had
filled. Only flushed ranges: a dirty page cannot be dropped (the advice would start its writeback instead).
``page_cache_keep_bytes`` 0 turns it off.

A reader below the window brings pages back that nothing drops again (they are below ``dropped_to``). The one the
store runs itself, the object storage tier's uploader, reads each sealed segment twice (its checksum, its put), so
it gives them back when it is done (``drop_read_back``): the store's CPU a GB uploaded 0.69-0.82 s against
1.25-1.59 without it, the append rate as noisy as before (bench/README.md, *Drop-behind and the tier*). Holding the
segments in the page cache until their upload instead (a floor under drop-behind, tried with and without a bound of
one more window) made the appends slower on this VM: the append rate with the tier on 38.5% and 45.7% below the
tier off, the loop thread's CPU a message 1.4-1.6x, against 4.1-22.4% without the hold.

Thread-safety: reads ``commitlog.written_offset`` (published by the writer) and the flushed offset (published by
the flush service after each fsync; drop-behind never goes above it), drops pages readers may fault back in at any
time (Segment.drop_cache copes with retention closing a segment meanwhile; ``drop_read_back`` runs on the caller's
thread, the tier uploader's, and reads ``dropped_to`` as last published: a stale value only gives back less), and
creates segments through SegmentQueue.ensure, under the queue's lock and not the append lock: appends go on while a
segment is created, and only an append that needs that very segment waits for it (it would otherwise create it
itself). Zeroing takes the append lock only to claim a chunk (no I/O under it). A step of warming holds the log's
``reshaping`` lock (before the append lock), which a replica's cut or restart of its log takes too: the written offset
it read stays the log's until it is done.
"""

from __future__ import annotations

from mqstore.background import Duty
from mqstore.log.segment import PAGE_SIZE

_CHUNK = 1 << 20
_DROP_STEP = 16 << 20  # drop-behind gives back at least this much at a time (less with a smaller window)
ZERO_LEAD_BYTES = 1 << 20  # zeros start this far past the write position (less in a smaller window)
WARM_CREATE, WARM_ZEROS = "create", "zeros"


class SegmentWarmer(Duty):
    def __init__(self, commitlog, warm_ahead_bytes: int, mode: str = WARM_CREATE, *, keep_bytes: int = 0,
                 flushed_offset=None):
        super().__init__("commitlog-warmer", interval_s=1.0, backoff_initial_s=1.0, backoff_max_s=10.0)
        if mode not in (WARM_CREATE, WARM_ZEROS):
            raise ValueError(f"warm mode must be {WARM_CREATE!r} or {WARM_ZEROS!r}, not {mode!r}")
        if keep_bytes and flushed_offset is None:
            raise ValueError("drop-behind needs the flushed offset")
        self.commitlog = commitlog
        self.ahead = warm_ahead_bytes
        self.mode = mode
        # Drop-behind: ranges this far below the flushed offset leave the page cache, from ``dropped_to`` on.
        self.keep = keep_bytes
        self._flushed_offset = flushed_offset
        self._drop_step = max(PAGE_SIZE, min(_DROP_STEP, keep_bytes // 4) // PAGE_SIZE * PAGE_SIZE)
        self.dropped_to = 0  # below here the log's pages were given back (none yet: start at the log's start)
        # A small window or segment (tests) is zeroed in smaller chunks, from nearer the write position.
        chunk = min(_CHUNK, warm_ahead_bytes // 4, commitlog.segment_size // 4)
        self._zero_chunk = max(PAGE_SIZE, chunk // PAGE_SIZE * PAGE_SIZE)
        self._zero_lead = min(ZERO_LEAD_BYTES, self._zero_chunk)
        self._zeros = bytes(self._zero_chunk) if mode == WARM_ZEROS else b""
        self._created = 0  # create mode: segments exist below here (zeros mode: commitlog.resident_offset)

    def start(self) -> None:
        if self.ahead > 0 or self.keep > 0:
            super().start()

    def poke(self) -> None:
        """Called after appends; cheap: wakes the thread only when half the window is used, or a step of the
        log is to leave the page cache."""
        written = self.commitlog.written_offset
        ready = self.commitlog.resident_offset if self.mode == WARM_ZEROS else self._created
        if ((self.ahead and written + self.ahead // 2 > ready)
                or (self.keep and self._flushed_offset() - self.keep - self.dropped_to >= self._drop_step)):
            self.wake()

    def step(self) -> None:
        if self.ahead > 0:
            self._warm()
        if self.keep > 0:
            self.drop_behind()

    def drop_behind(self) -> None:
        """Give back the pages of the log from ``dropped_to`` up to ``keep`` below the flushed offset (whole
        steps)."""
        log_ = self.commitlog
        flushed = self._flushed_offset()
        if flushed < self.dropped_to:  # the log was cut back below what was dropped (a replica's truncation)
            self.dropped_to = max(0, flushed - self.keep)
        dropped = max(self.dropped_to, log_.segments.min_offset)
        target = flushed - self.keep
        if target - dropped < self._drop_step:
            return
        target = dropped + (target - dropped) // self._drop_step * self._drop_step
        self._drop_range(dropped, target)
        self.dropped_to = target

    def drop_read_back(self, start: int, end: int) -> None:
        """Give back the pages of [start, end) below ``dropped_to`` that a reader brought back into the page cache
        (the tier's uploader, after it read a sealed segment); any thread (as ``drop_behind``'s)."""
        if self.keep:
            self._drop_range(start, min(end, self.dropped_to))

    def _drop_range(self, start: int, end: int) -> None:
        """The pages of the log's physical [start, end), segment by segment (those retention removed passed over)."""
        for seg in self.commitlog.segments.segments:
            if seg.end > start and seg.start < end:
                seg.drop_cache(max(start, seg.start) - seg.start, min(end, seg.end) - seg.start)

    def _warm(self) -> None:
        """Segments (and zeros) ahead of the written offset, read and acted on under the log's ``reshaping`` lock: a
        replica's restart of its log at another offset waits for this, and this for it."""
        with self.commitlog.reshaping:
            self._warm_locked()

    def _warm_locked(self) -> None:
        log_ = self.commitlog
        written, seg_size = log_.written_offset, log_.segment_size
        # At most into the segment after the current one: small test segments must not multiply.
        target = min(written + self.ahead, (written // seg_size + 2) * seg_size)
        if self.mode == WARM_CREATE:
            log_.segments.ensure(target, written - written % seg_size)
            self._created = target
            return
        start = max(log_.resident_offset, written + self._zero_lead)
        while start < target and not self.stopping:
            last = log_.segments.last()
            if last is None or start >= last.end:
                log_.segments.ensure(start + 1, start - start % seg_size)
                continue
            seg = log_.segments.find(start)
            stop = min(target, seg.end, start + self._zero_chunk)
            self._zero(seg, start, stop)
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
