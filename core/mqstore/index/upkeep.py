"""IndexUpkeep: the named thread that rebuilds damaged ranges and follows the log's retention.

Rebuild: ``IndexStore.start()`` quarantines a damaged or truncated file as a range [start, end) of
physical offsets. For each such range this thread opens a second ``CommitLog.Tail`` at the range start,
feeds the range's records to ``apply_rebuild`` and ends with ``finish_rebuild``, while the live follower
goes on indexing new records and queries outside the range keep being answered (queries overlapping
it get FAILED_PRECONDITION until it is done). If retention has already removed the start of the range,
the records that are left are rebuilt and the gap is logged (``index.rebuild_gap``).

Retention: every ``retention_interval_ms`` it asks the log for its minimum physical offset and calls
``IndexStore.delete_before`` with it, so index files never outlive the records they point at.

A failed round is logged, remembered in ``state()`` (Stats shows it) and retried with backoff; a bug
is not retried (mqstore.background.Duty).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog
from mqstore.background import Duty
from mqstore.errors import OutOfRange, Unavailable

from .decode import decode_frame
from .follower import FollowerConfig
from .ports import CommitLogReader
from .stats import RebuildRange

log = structlog.get_logger("index.upkeep")
THREAD_NAME = "index-upkeep"


@dataclass(frozen=True, slots=True)
class UpkeepState:
    rebuilds_done: int
    retention_rounds: int
    last_error: str     # "" after a good round
    healthy: bool       # False while failing for a reason other than the log being away
    alive: bool
    died: str = ""      # the bug that killed the thread, "" otherwise


class IndexUpkeep(Duty):
    """Thread ``index-upkeep`` (a Duty): ``start()``, ``stop(timeout_s)``, ``wake()``, ``state()``;
    ``run_once()`` does one round in the caller's thread. Store and OS errors are logged
    (``index.upkeep_failed``), kept in the state and retried with the follower's backoff; a bug kills
    the thread (the service turns NOT_SERVING). Thread-safe (state under ``_state_lock``)."""

    def __init__(self, store, source: CommitLogReader, config: FollowerConfig):
        super().__init__(THREAD_NAME, interval_s=min(config.rebuild_interval_ms, config.retention_interval_ms) / 1000,
                         backoff_initial_s=config.backoff_initial_ms / 1000,
                         backoff_max_s=config.backoff_max_ms / 1000)
        self.store = store
        self.source = source
        self.config = config
        self._state_lock = threading.Lock()
        self._stream = None
        self._rebuilds_done = 0
        self._retention_rounds = 0
        self._round_error = ""
        self._healthy = True
        self._last_retention_s = float("-inf")

    def on_stop(self) -> None:
        with self._state_lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def state(self) -> UpkeepState:
        duty = super().state()
        with self._state_lock:
            return UpkeepState(self._rebuilds_done, self._retention_rounds, self._round_error, self._healthy,
                               duty.alive, duty.died)

    # -- the loop -----------------------------------------------------------------------------------
    def step(self) -> None:
        try:
            self.run_once()
        except self.retry_on as exc:
            if not self.stopping:
                healthy = isinstance(exc, Unavailable)
                message = f"{type(exc).__name__}: {exc}"
                (log.warning if healthy else log.error)("index.upkeep_failed", error=message)
                with self._state_lock:
                    self._round_error, self._healthy = message, healthy
            raise
        with self._state_lock:
            self._round_error, self._healthy = "", True

    def run_once(self) -> None:
        """Apply retention if it is due (it also drops ranges the log no longer holds), then rebuild
        every damaged range."""
        now_s = self.store.clock.monotonic_s()  # injected: tests drive retention without sleeping
        if now_s - self._last_retention_s >= self.config.retention_interval_ms / 1000:
            deleted = self.store.delete_before(self.source.store_info().min_physical_offset)
            self._last_retention_s = now_s
            with self._state_lock:
                self._retention_rounds += 1
            if deleted:
                log.info("index.retention_applied", files_deleted=deleted)
        for rng in self.store.rebuild_ranges():
            if self.stopping:
                return
            self._rebuild(rng)

    # -- rebuilding one range ------------------------------------------------------------------------
    def _rebuild(self, rng: RebuildRange) -> None:
        start, end = rng.start_physical_offset, rng.end_physical_offset
        log.info("index.rebuild_started", start_physical_offset=start, end_physical_offset=end)
        try:
            stream = self._open(start, end)
        except _RangeGone:
            self.store.delete_before(self.source.store_info().min_physical_offset)
            return
        records = 0
        try:
            for frame in stream:
                batch = self._decode(frame) if frame.records else []
                batch = [r for r in batch if r.physical_offset < end]
                if batch:
                    self.store.apply_rebuild(start, batch)
                    records += len(batch)
                if frame.next_physical_offset >= end or self.stopping:
                    break
                if not frame.records and frame.next_physical_offset >= frame.log_end_physical_offset:
                    raise Unavailable(
                        f"the commit log ends at physical offset {frame.log_end_physical_offset}, inside the "
                        f"index range [{start}, {end}) being rebuilt (is it still starting, or did it lose "
                        f"records?); the rebuild is retried")
        finally:
            stream.cancel()
            with self._state_lock:
                self._stream = None
        if self.stopping:
            return
        self.store.finish_rebuild(start)
        with self._state_lock:
            self._rebuilds_done += 1
        log.info("index.rebuild_finished", start_physical_offset=start, end_physical_offset=end, records=records)

    @staticmethod
    def _decode(frame) -> list:
        """The frame's good records; damaged ones are skipped and logged, as the follower does."""
        decoded = decode_frame(frame.records, frame.next_physical_offset)
        for damaged in decoded.damaged:
            log.error("index.rebuild_damaged_record_skipped", start_physical_offset=damaged.start_physical_offset,
                      end_physical_offset=damaged.end_physical_offset, reason=damaged.reason)
        return decoded.records

    def _open(self, start: int, end: int) -> _Peeked:
        """A Tail from the range start, or from the log's head when retention removed the start."""
        try:
            return self._peeked(start)
        except OutOfRange as exc:
            low = exc.min_value
            if low is None or low <= start:
                raise
            if low >= end:
                log.error("index.rebuild_gap", start_physical_offset=start, end_physical_offset=end,
                          log_min_physical_offset=low, why="the commit log no longer holds any record of "
                          "the range (retention); it is dropped")
                raise _RangeGone() from None
            log.error("index.rebuild_gap", start_physical_offset=start, end_physical_offset=low,
                      why="the commit log no longer holds these records (retention); the rest of the range "
                      "is rebuilt")
            return self._peeked(low)

    def _peeked(self, from_physical_offset: int) -> _Peeked:
        stream = self.source.tail(from_physical_offset, max_frame_bytes=self.config.max_frame_bytes,
                                  heartbeat_ms=self.config.heartbeat_ms)
        with self._state_lock:
            self._stream = stream  # published before the first read, so stop() can cancel it
        if self.stopping:
            stream.cancel()
        try:
            return _Peeked(stream)
        except BaseException:
            stream.cancel()
            with self._state_lock:
                self._stream = None
            raise


class _RangeGone(Exception):
    """The whole range was removed from the log by retention (internal to IndexUpkeep)."""


class _Peeked:
    """A Tail stream whose first frame has been read, so an OUT_OF_RANGE at open time surfaces in
    ``_open`` (gRPC reports a stream's status on the first read, not when it is opened)."""

    def __init__(self, stream):
        self._stream = stream
        self._iterator = iter(stream)
        self._first = next(self._iterator, None)

    def __iter__(self):
        if self._first is not None:
            yield self._first
        yield from self._iterator

    def cancel(self) -> None:
        self._stream.cancel()
