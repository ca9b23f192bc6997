"""IndexUpkeep: the named thread that rebuilds damaged ranges and follows the log's retention.

Rebuild: ``IndexStore.start()`` quarantines a damaged or truncated file as a range [start, end) of
physical offsets. For each such range this thread opens a second ``CommitLog.Tail`` at the range start,
feeds the range's records to ``apply_rebuild`` and ends with ``finish_rebuild``, while the live follower
goes on indexing new records and queries outside the range keep being answered (queries overlapping
it get FAILED_PRECONDITION until it is done). If retention has already removed the start of the range,
the records that are left are rebuilt and the gap is logged (``index.rebuild_gap``).

Retention: every ``retention_interval_ms`` it asks the log for its minimum physical offset and calls
``IndexStore.delete_before`` with it, so index files never outlive the records they point at.

A failed round is logged, remembered in ``state()`` (Stats shows it) and retried with backoff.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog
from mqstore.errors import OutOfRange, Unavailable

from .decode import decode_frame
from .follower import Backoff, FollowerConfig
from .ports import CommitLogReader
from .stats import RebuildRange

log = structlog.get_logger("index.upkeep")


@dataclass(frozen=True, slots=True)
class UpkeepState:
    rebuilds_done: int
    retention_rounds: int
    last_error: str     # "" after a good round
    healthy: bool       # False while failing for a reason other than the log being away
    alive: bool


class IndexUpkeep:
    """Thread ``index-upkeep``: ``start()``, ``stop(timeout_s)``, ``wakeup()``, ``state()``;
    ``run_once()`` does one round in the caller's thread. Thread-safe (state under ``_lock``)."""

    def __init__(self, store, source: CommitLogReader, config: FollowerConfig):
        self.store = store
        self.source = source
        self.config = config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stream = None
        self._rebuilds_done = 0
        self._retention_rounds = 0
        self._last_error = ""
        self._healthy = True
        self._last_retention_s = float("-inf")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="index-upkeep", daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("index.upkeep_stop_timeout", timeout_s=timeout_s)

    def state(self) -> UpkeepState:
        alive = self._thread is not None and self._thread.is_alive()
        with self._lock:
            return UpkeepState(self._rebuilds_done, self._retention_rounds, self._last_error, self._healthy, alive)

    # -- the loop -----------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff(self.config.backoff_initial_ms, self.config.backoff_max_ms)
        idle_s = min(self.config.rebuild_interval_ms, self.config.retention_interval_ms) / 1000
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:
                if self._stop.is_set():
                    break
                healthy = isinstance(exc, Unavailable)
                (log.warning if healthy else log.error)("index.upkeep_failed", error=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self._last_error, self._healthy = f"{type(exc).__name__}: {exc}", healthy
                self._wake.wait(backoff.next_s())
                self._wake.clear()
                continue
            backoff.reset()
            with self._lock:
                self._last_error, self._healthy = "", True
            self._wake.wait(idle_s)
            self._wake.clear()

    def run_once(self) -> None:
        """Apply retention if it is due (it also drops ranges the log no longer holds), then rebuild
        every damaged range."""
        now_s = self.store.clock.monotonic_s()  # injected: tests drive retention without sleeping
        if now_s - self._last_retention_s >= self.config.retention_interval_ms / 1000:
            deleted = self.store.delete_before(self.source.min_physical_offset())
            self._last_retention_s = now_s
            with self._lock:
                self._retention_rounds += 1
            if deleted:
                log.info("index.retention_applied", files_deleted=deleted)
        for rng in self.store.rebuild_ranges():
            if self._stop.is_set():
                return
            self._rebuild(rng)

    # -- rebuilding one range ------------------------------------------------------------------------
    def _rebuild(self, rng: RebuildRange) -> None:
        start, end = rng.start_physical_offset, rng.end_physical_offset
        log.info("index.rebuild_started", start_physical_offset=start, end_physical_offset=end)
        try:
            stream = self._open(start, end)
        except _RangeGone:
            self.store.delete_before(self.source.min_physical_offset())
            return
        records = 0
        try:
            for frame in stream:
                batch = self._decode(frame) if frame.records else []
                batch = [r for r in batch if r.physical_offset < end]
                if batch:
                    self.store.apply_rebuild(start, batch)
                    records += len(batch)
                if frame.next_physical_offset >= end or self._stop.is_set():
                    break
                if not frame.records and frame.next_physical_offset >= frame.log_end_physical_offset:
                    raise Unavailable(
                        f"the commit log ends at physical offset {frame.log_end_physical_offset}, inside the "
                        f"index range [{start}, {end}) being rebuilt (is it still starting, or did it lose "
                        f"records?); the rebuild is retried")
        finally:
            stream.cancel()
            with self._lock:
                self._stream = None
        if self._stop.is_set():
            return
        self.store.finish_rebuild(start)
        with self._lock:
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
        with self._lock:
            self._stream = stream  # published before the first read, so stop() can cancel it
        if self._stop.is_set():
            stream.cancel()
        try:
            return _Peeked(stream)
        except BaseException:
            stream.cancel()
            with self._lock:
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
