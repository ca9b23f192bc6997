"""The flush service: one named duty ("commitlog-flush", mqstore.background) that fsyncs the commit log.

ASYNC: every ``flush_interval_ms``, when at least ``flush_min_dirty_pages`` pages are dirty (all dirty
data every ``flush_thorough_interval_ms``). Appends do not wait.
SYNC (group commit): an append waits in ``wait_flushed`` until an fsync covers its end offset. The
thread flushes everything written so far, so appends that arrive while an fsync runs share the next
one. A wait that outlives ``sync_flush_timeout_ms`` raises FlushTimeout.

The flush delay (``sync_flush_delay_us``, 2 ms by default; 0 turns it off): once an append asks, the thread
waits up to that long before its fsync for more appends to join it, and starts the fsync as soon as as many
appends wait as the last fsync acknowledged. Under many producers each fsync then covers several appends
(fewer fsyncs, and fewer hand-offs between this thread and the handlers). The count learns: an fsync raises
it to the number it covered, and a delay that runs out halves it first, so when producers go away their
count falls within a few fsyncs. There is no delay while the count is under three (``_MIN_GROUP``): a lone
producer's fsync starts at once, and two producers' fsyncs overlap their appends instead of waiting for
them. This is MySQL's binlog_group_commit_sync_delay with binlog_group_commit_sync_no_delay_count, the
count learned rather than set, and PostgreSQL's commit_siblings; ``mqstore_commitlog_flush_appends`` and
``mqstore_commitlog_flush_delays_total`` show what it does (bench/README.md, *The flush delay*).

No error is retried (``retry_on=()``): after a failed fsync the kernel may have dropped the dirty
pages, so a retry that succeeds would confirm data that is gone. The duty dies instead: ``error`` is
set, every waiter is woken with Unavailable, and ``problem()`` makes the store unhealthy.

Thread-safety: ``flushed_offset``, ``_wanted``, ``_parked`` and ``error`` are guarded by ``_lock``. The
duty's thread waits on ``_wanted_more`` (notified when an append wants more flushed than asked so far).
A SYNC append parks a waiter of its own (:meth:`flushed`: a mqstore.waits.ThreadWaiter's lock on a
thread, a LoopWaiter on an event loop), held in ``_parked`` (a heap by end offset); after an fsync
the flush runs the dispatch (``on_flushed``), then releases exactly the appends that fsync covers. One
condition for all waiters woke every waiting append after every fsync, and each one the fsync did not
cover went back to sleep: with fsyncs of a few hundred microseconds (mqstore.log.warmer) that herd cost
more than the fsyncs saved. Releasing before the dispatch made each woken append wait once more, on the
dispatcher's lock. An append re-checks ``flushed_offset`` after every wake-up (and every 0.5 s), so only
an fsync that covers it lets it return. ``flush_now`` runs on the duty's thread,
and on the starting or stopping thread while the duty is not running.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time

from mqstore import failpoints, waits
from mqstore.background import Duty
from mqstore.config import FLUSH_SYNC, StoreConfig
from mqstore.errors import FlushTimeout, Unavailable
from mqstore.log.commitlog import CommitLog
from mqstore.log.segment import PAGE_SIZE
from mqstore.metrics import Registry


# The flush delay applies only once an fsync has acknowledged this many appends: with two producers each
# fsync would wait for the other's append rather than run while it is handled (-6% measured; the delay
# pays from three on). PostgreSQL's commit_siblings, counted in the group commit's size.
_MIN_GROUP = 3


class Flusher(Duty):
    def __init__(self, commitlog: CommitLog, config: StoreConfig, clock, on_flushed, metrics: Registry | None = None):
        super().__init__("commitlog-flush", interval_s=config.flush_interval_ms / 1000, retry_on=())
        self.commitlog = commitlog
        self.config = config
        self.clock = clock
        self.sync = config.flush_mode == FLUSH_SYNC
        self.on_flushed = on_flushed
        self.flushed_offset = commitlog.written_offset
        self.physic_msg_timestamp_ms = commitlog.last_store_timestamp_ms
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._wanted_more = threading.Condition(self._lock)
        self._wanted = 0
        self._gather = 1  # the flush delay ends once this many appends wait: what the last fsync acknowledged
        self._gathering = False  # the duty is in the delay: an append wakes it only once _gather appends wait
        self._parked: list[tuple[int, int, waits.ThreadWaiter | waits.LoopWaiter]] = []  # (offset, seq, waiter): a heap
        self._seq = itertools.count()
        self._last_thorough_s = clock.monotonic_s()
        metrics = metrics or Registry()
        self._flushes = metrics.counter("mqstore_commitlog_flushes_total", "fsyncs of the commit log that covered "
                                        "new records")
        self._flushed_bytes = metrics.counter("mqstore_commitlog_flushed_bytes_total", "record bytes made durable")
        self._flush_seconds = metrics.histogram("mqstore_commitlog_flush_seconds", "time of one flush (fsync of "
                                                "the dirty range)")
        self._flush_appends = metrics.histogram("mqstore_commitlog_flush_appends", "SYNC: appends that one fsync "
                                                "acknowledged (the group commit's size)",
                                                buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self._delays = metrics.counter("mqstore_commitlog_flush_delays_total", "SYNC fsyncs that waited for more "
                                       "appends (sync_flush_delay_us), by how the wait ended: enough appends "
                                       "joined, or the delay ran out", ("ended",))
        self._delays_joined = self._delays.labels("joined")
        self._delays_ran_out = self._delays.labels("ran_out")

    def stop(self, timeout_s: float = 10.0) -> bool:
        """End the duty, then flush what is left."""
        stopped = super().stop(timeout_s)
        self.flush_now()
        return stopped

    def abandon(self, timeout_s: float) -> None:
        """End the duty without the final flush (crash tests: what kill -9 would leave)."""
        super().stop(timeout_s)

    async def flushed(self, offset: int) -> None:
        """Until an fsync covers ``offset`` (SYNC): the append parks a waiter (mqstore.waits.waiter) that the
        fsync wakes, with the rest of its waiters (a loop's in one hand-off). On an event loop it is awaited;
        on a thread, :meth:`wait_flushed` blocks there (the handler pool runs others meanwhile: group commit).
        FlushTimeout after sync_flush_timeout_ms; Unavailable once the duty died."""
        if self.flushed_offset >= offset:
            return
        deadline = self.clock.monotonic_s() + self.config.sync_flush_timeout_ms / 1000
        waiter = waits.waiter()
        if not self._park(offset, waiter):
            return
        while self.flushed_offset < offset:  # an int published under _lock, never lowered
            await waiter.wait(min(self._left_s(offset, deadline), 0.5))

    wait_flushed = waits.blocking_version(flushed)

    def _park(self, offset: int, waiter: waits.ThreadWaiter | waits.LoopWaiter) -> bool:
        """Park ``waiter`` until an fsync covers ``offset``, asking the duty for it; False when one has."""
        with self._lock:
            if self.flushed_offset >= offset:
                return False
            heapq.heappush(self._parked, (offset, next(self._seq), waiter))
            wake = False
            if offset > self._wanted:
                self._wanted = offset
                wake = not self._gathering
            if self._gathering and len(self._parked) >= self._gather:  # parked threads may come in any order
                wake = True
            if wake:
                self._wanted_more.notify()
        return True

    def _left_s(self, offset: int, deadline: float) -> float:
        """The seconds an append may still wait for ``offset``: Unavailable once the duty died, FlushTimeout
        past ``deadline``."""
        if self.error is not None:
            raise Unavailable(f"the flush service failed: {self.error}; the store needs a restart")
        left = deadline - self.clock.monotonic_s()
        if left <= 0:
            raise FlushTimeout(
                f"records up to physical offset {offset} are written but no fsync confirmed them within "
                f"{self.config.sync_flush_timeout_ms} ms; they may survive, so a retry may duplicate them")
        return left

    def flush_now(self) -> int:
        """Flush everything written so far; returns the flushed offset."""
        target = self.commitlog.written_offset
        stamp = self.commitlog.last_store_timestamp_ms
        start = self.flushed_offset
        if target > start:
            began = self.clock.monotonic_s()
            for seg in self.commitlog.segments.segments:
                if seg.end > start and seg.start < target:
                    seg.flush(max(start, seg.start) - seg.start, min(target, seg.end) - seg.start)
            self._flush_seconds.observe(self.clock.monotonic_s() - began)
            self._flushes.inc()
            self._flushed_bytes.inc(target - start)
            failpoints.hit("log.after_flush")
        covered = []
        with self._lock:
            if target > self.flushed_offset:
                self.flushed_offset = target
                self.physic_msg_timestamp_ms = stamp
            parked = self._parked
            while parked and parked[0][0] <= self.flushed_offset:
                covered.append(heapq.heappop(parked)[2])
            if covered:
                self._gather = max(len(covered), self._gather)
        if covered:
            self._flush_appends.observe(len(covered))
        # Dispatch first, then wake the appends it covers: woken first, each would wait for the dispatch
        # on the dispatcher's lock (a second sleep and wake-up each). When only appends on an event loop
        # wait, the loop dispatches, in the same hand-off that wakes them: this thread then holds the GIL
        # only for that hand-off, rather than taking turns with the loop for the dispatch.
        if covered and all(isinstance(waiter, waits.LoopWaiter) for waiter in covered):
            waits.wake(covered, first=lambda: self.on_flushed(target))
            return target
        try:
            self.on_flushed(target)
        finally:
            waits.wake(covered)
        return target

    def _due(self) -> bool:
        if self.sync:
            return self._wanted > self.flushed_offset or self.commitlog.written_offset > self.flushed_offset
        dirty = self.commitlog.written_offset - self.flushed_offset
        if dirty <= 0:
            return False
        now = self.clock.monotonic_s()
        if now - self._last_thorough_s >= self.config.flush_thorough_interval_ms / 1000:
            self._last_thorough_s = now
            return True
        return dirty >= self.config.flush_min_dirty_pages * PAGE_SIZE

    # ---- the duty
    def step(self) -> None:
        if self._due():
            if self.sync and self.config.sync_flush_delay_us and self._wanted > self.flushed_offset:
                self._delay()
            self.flush_now()

    def _delay(self) -> None:
        """Wait up to ``sync_flush_delay_us`` for more appends to join the next fsync: until as many wait as
        the last fsync acknowledged (``_gather``, which the fsync then raises to what it covers), if that
        is at least ``_MIN_GROUP``. A delay that runs out halves it."""
        deadline = time.monotonic() + self.config.sync_flush_delay_us / 1e6
        with self._lock:
            if self._gather < _MIN_GROUP:
                return
            self._gathering = True
            try:
                while len(self._parked) < self._gather:
                    left = deadline - time.monotonic()
                    if self.stopping:
                        return
                    if left <= 0:
                        self._gather = max(1, self._gather // 2)
                        self._delays_ran_out.inc()
                        return
                    self._wanted_more.wait(left)
                self._delays_joined.inc()
            finally:
                self._gathering = False

    def pause(self) -> None:
        """The interval; in SYNC mode not at all while an append waits for more than is flushed."""
        with self._lock:
            if self.stopping or (self.sync and self._wanted > self.flushed_offset):
                return
            self._wanted_more.wait(self.interval_s)

    def on_stop(self) -> None:
        with self._lock:
            self._wanted_more.notify_all()

    def on_died(self, exc: BaseException) -> None:
        with self._lock:
            self.error = exc
            waits.wake([parked for _, _, parked in self._parked])
            self._parked.clear()

