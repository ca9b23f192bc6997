"""The segment warmer: one named duty ("commitlog-warmer", mqstore.background) that keeps the next
``warm_ahead_bytes`` of the commit log in the page cache ahead of the write position (RocketMQ's "warm
mapped file", done by reading).

Why: copying into a page of a mapped file that is not yet in memory costs a page fault with zeroing,
about 2 us per KiB here, all inside the append lock. Reading the range first (os.preadv, which
releases the GIL) moves that cost to this thread, on the other core; reading never changes the bytes,
so it cannot race with the writer. How far it has read is published as ``commitlog.resident_offset``:
below it, large writes copy into the mapping instead of going through pwrite (mqstore.log.segment).
Segments ahead are created here too, so a roll waits neither for fallocate nor for the two fsyncs
that make the new segment durable (mqstore.log.segment). A store or OS error (a full disk creating the
next segment: appends will say so) is retried with backoff; a bug ends the duty and makes the store
unhealthy (it used to end it silently).

Thread-safety: reads ``commitlog.written_offset`` (published by the writer) and creates segments
through SegmentQueue.ensure, under the queue's lock and not the append lock: appends go on while a
segment is created, and only an append that needs that very segment waits for it (it would otherwise
create it itself).
"""

from __future__ import annotations

from mqstore.background import Duty

_CHUNK = 1 << 20


class SegmentWarmer(Duty):
    def __init__(self, commitlog, warm_ahead_bytes: int):
        super().__init__("commitlog-warmer", interval_s=1.0, backoff_initial_s=1.0, backoff_max_s=10.0)
        self.commitlog = commitlog
        self.ahead = warm_ahead_bytes
        self._scratch = bytearray(_CHUNK)

    def start(self) -> None:
        if self.ahead > 0:
            super().start()

    def poke(self) -> None:
        """Called after appends; cheap: wakes the thread only when half the window is used."""
        if self.commitlog.written_offset + self.ahead // 2 > self.commitlog.resident_offset:
            self.wake()

    def step(self) -> None:
        log_ = self.commitlog
        start = max(log_.resident_offset, log_.written_offset)
        seg_size = log_.segment_size
        # At most into the segment after the current one: small test segments must not multiply.
        target = min(log_.written_offset + self.ahead, (log_.written_offset // seg_size + 2) * seg_size)
        while start < target and not self.stopping:
            last = log_.segments.last()
            if last is None or start >= last.end:
                log_.segments.ensure(start + 1, start - start % seg_size)
                continue
            seg = log_.segments.find(start)
            stop = min(target, seg.end, start + 8 * _CHUNK)
            seg.prefetch(start - seg.start, stop - seg.start, self._scratch)
            start = stop
            log_.resident_offset = start
