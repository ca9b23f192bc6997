"""The flush service: one named thread that fsyncs the commit log.

ASYNC: every ``flush_interval_ms``, when at least ``flush_min_dirty_pages`` pages are dirty (all dirty
data every ``flush_thorough_interval_ms``). Appends do not wait.
SYNC (group commit): an append waits in ``wait_flushed`` until an fsync covers its end offset. The
thread flushes everything written so far, so appends that arrive while an fsync runs share the next
one. A wait that outlives ``sync_flush_timeout_ms`` raises FlushTimeout.

Thread-safety: all state is guarded by ``_cond``. A failure in the loop marks the service failed
(``error``), wakes every waiter with Unavailable, and is logged once.
"""

from __future__ import annotations

import threading

import structlog

from mqstore import failpoints
from mqstore.config import FLUSH_SYNC, StoreConfig
from mqstore.errors import FlushTimeout, Unavailable
from mqstore.log.commitlog import CommitLog
from mqstore.log.segment import PAGE_SIZE

log = structlog.get_logger()


class Flusher:
    def __init__(self, commitlog: CommitLog, config: StoreConfig, clock, on_flushed):
        self.commitlog = commitlog
        self.config = config
        self.clock = clock
        self.sync = config.flush_mode == FLUSH_SYNC
        self.on_flushed = on_flushed
        self.flushed_offset = commitlog.written_offset
        self.physic_msg_timestamp_ms = commitlog.last_store_timestamp_ms
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._wanted = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="commitlog-flush", daemon=True)
        self._last_thorough_s = clock.monotonic_s()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        self.flush_now()

    def abandon(self, timeout_s: float) -> None:
        """Stop the thread without the final flush (crash tests: what kill -9 would leave)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def wait_flushed(self, offset: int) -> None:
        timeout_s = self.config.sync_flush_timeout_ms / 1000
        deadline = self.clock.monotonic_s() + timeout_s
        with self._cond:
            if offset > self._wanted:
                self._wanted = offset
                self._cond.notify_all()
            while self.flushed_offset < offset:
                if self.error is not None:
                    raise Unavailable(f"the flush service failed: {self.error}; the store needs a restart")
                left = deadline - self.clock.monotonic_s()
                if left <= 0:
                    raise FlushTimeout(
                        f"records up to physical offset {offset} are written but no fsync confirmed them within "
                        f"{self.config.sync_flush_timeout_ms} ms; they may survive, so a retry may duplicate them")
                self._cond.wait(min(left, 0.5))

    def flush_now(self) -> int:
        """Flush everything written so far; returns the flushed offset."""
        target = self.commitlog.written_offset
        stamp = self.commitlog.last_store_timestamp_ms
        start = self.flushed_offset
        if target > start:
            for seg in self.commitlog.segments.segments:
                if seg.end > start and seg.start < target:
                    seg.flush(max(start, seg.start) - seg.start, min(target, seg.end) - seg.start)
            failpoints.hit("log.after_flush")
        with self._cond:
            if target > self.flushed_offset:
                self.flushed_offset = target
                self.physic_msg_timestamp_ms = stamp
            self._cond.notify_all()
        self.on_flushed(target)
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

    def _run(self) -> None:
        interval_s = self.config.flush_interval_ms / 1000
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        return
                    if self.sync:
                        if self._wanted <= self.flushed_offset:
                            self._cond.wait(interval_s)
                    else:
                        self._cond.wait(interval_s)
                    if self._stopping:
                        return
                if self._due():
                    self.flush_now()
        except BaseException as exc:  # noqa: BLE001 - a dead flusher must fail loudly, not silently
            log.exception("flush.failed")
            with self._cond:
                self.error = exc
                self._cond.notify_all()
