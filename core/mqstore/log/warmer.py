"""The segment warmer: one named duty ("commitlog-warmer", mqstore.background) that works ahead of the write
position, up to ``warm_ahead_bytes`` past it (RocketMQ's "warm mapped file").

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
WARM_CREATE, WARM_ZEROS = "create", "zeros"


class SegmentWarmer(Duty):
    def __init__(self, commitlog, warm_ahead_bytes: int, mode: str = WARM_CREATE):
        super().__init__("commitlog-warmer", interval_s=1.0, backoff_initial_s=1.0, backoff_max_s=10.0)
        if mode not in (WARM_CREATE, WARM_ZEROS):
            raise ValueError(f"warm mode must be {WARM_CREATE!r} or {WARM_ZEROS!r}, not {mode!r}")
        self.commitlog = commitlog
        self.ahead = warm_ahead_bytes
        self.mode = mode
        # A small window or segment (tests) is zeroed in smaller chunks, from nearer the write position.
        chunk = min(_CHUNK, warm_ahead_bytes // 4, commitlog.segment_size // 4)
        self._zero_chunk = max(PAGE_SIZE, chunk // PAGE_SIZE * PAGE_SIZE)
        self._zero_lead = min(ZERO_LEAD_BYTES, self._zero_chunk)
        self._zeros = bytes(self._zero_chunk) if mode == WARM_ZEROS else b""
        self._created = 0  # create mode: segments exist below here (zeros mode: commitlog.resident_offset)

    def start(self) -> None:
        if self.ahead > 0:
            super().start()

    def poke(self) -> None:
        """Called after appends; cheap: wakes the thread only when half the window is used."""
        ready = self.commitlog.resident_offset if self.mode == WARM_ZEROS else self._created
        if self.commitlog.written_offset + self.ahead // 2 > ready:
            self.wake()

    def step(self) -> None:
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
