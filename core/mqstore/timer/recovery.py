"""The timer's files over time (mqstore.timer.timer has the design): the open (recover the files or rebuild, and
read the log for the units done already), the checkpoint, the close, and the retention floor published with
each checkpoint.

Thread-safety: as the Timer's (its duty owns it); ``retention_floor`` may be read from any thread.
"""

from __future__ import annotations

import struct

import structlog

from mqstore import disk_space
from mqstore.format import record_reader
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig
from mqstore.timer.dequeue import Dequeue
from mqstore.timer.enqueue import Enqueue
from mqstore.timer.files import TimerFiles
from mqstore.timer.state import TimerPart, TimerState, TimerStats, topic_bounds

log = structlog.get_logger("mqstore.timer")

SCAN_FRAME_BYTES = 4 << 20
_SIZE = struct.Struct(">i")
_MARKERS = (tm.UNIT.encode() + b"\x01", tm.ROLLED_FROM.encode() + b"\x01")


class Recovery(TimerPart):
    """The Timer's open, checkpoint and close, a part :class:`mqstore.timer.timer.Timer` builds. It owns the
    checkpoint's bookkeeping (``last_checkpoint_ms``, ``_checkpoint_skipped``) and the retention floor
    (``retention_floor``, ``_floor_position``); at the open it sets every position of the shared ``state``
    (``enqueue_offset``, ``read_ms``, ``read_log_end``, ``cancels``, ``cp_read``, ``cp_end``) and the recovery's
    scan (``done``, ``rolled``, ``done_until_ms``); the checkpoint takes Dequeue's ``advances`` once flushed into
    ``cp_read``/``cp_end``, drops ``enqueue``'s old notes, reads whether ``dequeue``'s read slot has units left,
    drops old ``cancels`` once ``caught_up_at``, and publishes ``retention_floor``."""

    def __init__(self, store, config: TimerConfig, files: TimerFiles, state: TimerState, stats: TimerStats,
                 enqueue: Enqueue, dequeue: Dequeue):
        super().__init__(store, config, files, state, stats)
        self.enqueue = enqueue
        self.dequeue = dequeue
        self.last_checkpoint_ms = 0
        self._checkpoint_skipped = False  # the last checkpoint write met a full disk (logged once)
        self._floor_position = 0  # timer log position: every unit before it is in a slot read already
        self.retention_floor: int | None = None  # published for the store's retention (read from its thread)

    def open(self) -> None:
        """Recover the files (or rebuild) and read the log for what is done; the files are closed if it fails
        (the duty retries the open)."""
        try:
            self._open()
        except BaseException:
            self.files.close()
            raise

    def _open(self) -> None:
        now = self.store.clock.now_ms()
        cp = self.files.open()
        low, high = topic_bounds(self.store)
        if cp is not None and cp.enqueue_offset > high:
            log.warning("timer.ahead_of_topic", enqueue_offset=cp.enqueue_offset, topic_max=high)
            self.files.reset()
            cp = None
        if cp is None:
            self.state.enqueue_offset, self.state.read_ms = low, self.files.slot_ms(now)
            self.state.read_log_end = self._first_record_position(low)
        else:
            self.state.enqueue_offset = max(self.files.enqueued_to, cp.enqueue_offset, low)
            self.state.cancels = dict(self.files.cancels)
            self.state.read_ms, self.state.read_log_end = cp.read_ms, cp.read_log_end
        self.state.done, self.state.rolled = self._scan_done(self.state.read_log_end)
        self.state.done_until_ms = now + self.precision
        self.state.cp_read, self.state.cp_end = self.state.read_ms, self.state.read_log_end
        self.stats.pending = self.files.pending_from(self.state.read_ms)
        self._publish_floor()
        log.info("timer.opened", rebuilt=cp is None, enqueue_offset=self.state.enqueue_offset,
                 read_ms=self.state.read_ms,
                 behind_ms=now - self.state.read_ms, done_found=len(self.state.done))

    def close(self) -> None:
        try:
            self.checkpoint(force=True)
        finally:
            self.files.close()

    def _first_record_position(self, offset: int) -> int:
        found = self.store.pull(tm.TIMER_TOPIC, 0, offset, 1).messages if offset < topic_bounds(self.store)[1] else []
        return found[0].record.physical_offset if found else self.store.log_end()

    def _scan_done(self, start: int) -> tuple[set[int], set[int]]:
        """TIMER_UNIT and TIMER_ROLLED_FROM of the log's records from ``start``: the units done already."""
        done: set[int] = set()
        rolled: set[int] = set()
        pos, end = max(start, self.store.log_min()), self.store.visible_offset()
        while pos < end:
            data, count, nxt = self.store.commitlog.frame(pos, end, SCAN_FRAME_BYTES, frozenset())
            at = 0
            while at + 4 <= len(data):
                size = _SIZE.unpack_from(data, at)[0]
                if size <= 0:
                    break
                raw = data[at:at + size]
                if _MARKERS[0] in raw or _MARKERS[1] in raw:
                    rec = record_reader.decode(raw, 0, verify_crc=False)
                    if tm.UNIT in rec.properties and rec.topic != tm.TIMER_TOPIC:
                        done.add(int(rec.properties[tm.UNIT]))
                    if tm.ROLLED_FROM in rec.properties and rec.topic == tm.TIMER_TOPIC:
                        rolled.add(int(rec.properties[tm.ROLLED_FROM]))
                at += size
            if nxt <= pos:
                break
            pos = nxt
        return done, rolled

    def checkpoint(self, force: bool = False) -> None:
        """fsync and record what holds: the enqueue offset, and the latest slot advance whose log end is
        flushed (a copy not fsynced yet would be lost by a power cut after a checkpoint that counted it)."""
        flushed = self.store.flushed_offset()
        if self.state.advances and self.state.advances[-1][1] > flushed:
            flushed = self.store.flusher.flush_now()
        while self.state.advances and self.state.advances[0][1] <= flushed:
            self.state.cp_read, self.state.cp_end = self.state.advances.pop(0)
        now = self.store.clock.now_ms()
        self.last_checkpoint_ms = now
        self.enqueue._drop_old_notes()
        # The log starts over when no unit is left: the estimate says so, the wheel confirms it (rarely read).
        empty = (self.stats.pending <= 0 and not self.dequeue._current and self.state.cp_read == self.state.read_ms
                 and self.files.log_end > 0 and not self.files.pending_from(self.state.read_ms))
        # Every copy of a recalled message has come by a whole turn after its due slot was read, once the records
        # this run found in the topic (a rebuild's, a late roll's) were put in the wheel and their slot read.
        if self.state.caught_up_at is not None and self.state.cp_read > self.state.caught_up_at:
            self.state.cancels = {k: v for k, v in self.state.cancels.items()
                                  if v + self.config.span_ms > self.state.cp_read}
        try:
            self.files.checkpoint(self.state.enqueue_offset, self.state.cp_read, self.state.cp_end, now,
                                  self.state.cancels, empty=empty)
        except OSError as exc:
            # A full disk: the checkpoint before stays valid (a restart reads the log again from it and skips what
            # was delivered), so the timer goes on and tries again at the next one; the floor stays the old
            # checkpoint's. Any other failure is raised (the duty's backoff and health).
            if not disk_space.is_no_space(exc):
                raise
            if not self._checkpoint_skipped:
                log.warning("timer.checkpoint_skipped", reason="disk full", error=str(exc),
                            action="the previous checkpoint stays; a restart re-reads the timer topic from it")
            self._checkpoint_skipped = True
            return
        self._checkpoint_skipped = False
        self._publish_floor()

    def _publish_floor(self) -> None:
        """:attr:`retention_floor`: the lowest of the checkpoint's log end (recovery reads the copies from there),
        the oldest unit of a slot not passed by the checkpoint's read slot (a restart reads its slot again), and
        the first record not enqueued yet (the dispatched end when there is none: a record the queue shows after
        this read lies above it)."""
        unenqueued = self.store.dispatcher.dispatched_offset
        if self.state.enqueue_offset < topic_bounds(self.store)[1]:
            unenqueued = self._first_record_position(self.state.enqueue_offset)
        if self._floor_position > self.files.log_end:
            self._floor_position = 0  # the log started over
        self._floor_position, unit = self.files.first_pending(self._floor_position, self.state.cp_read)
        floor = min(self.state.cp_end, unenqueued)
        self.retention_floor = floor if unit is None else min(floor, unit.physical_offset)
