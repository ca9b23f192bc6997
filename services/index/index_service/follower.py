"""TailFollower: the named thread that keeps the index in step with the commit log.

It opens ``CommitLog.Tail`` at ``IndexStore.resume_physical_offset()`` (from the earliest record when
the index is empty), decodes each frame with the shared record codec and applies the frame's records
as one batch with the frame's ``next_physical_offset`` (batching is what makes the build fast; the
store checkpoints every ``checkpoint_interval_ms``). Heartbeat frames advance the resume point past
filtered or blank bytes and tell the follower where the log ends, for the lag.

Any failure of the stream (commit log down or restarting, a timeout, a bad frame) closes it; the
follower marks itself disconnected, waits with exponential backoff (``backoff_initial_ms`` doubling to
``backoff_max_ms``) and re-opens at the store's resume offset, so it never skips a record: everything
below that offset is indexed, everything at or above it is fed again (re-feeding is idempotent).
Queries keep being answered meanwhile from what is indexed.

A record that fails its checks (CRC, lengths) is not a failure of the stream: the frame's other
records are indexed, the bad range is logged as ``index.damaged_record_skipped`` and kept in the state
(the last ``MAX_DAMAGED_RANGES`` ranges and the total bytes, shown by Stats), and the follower goes
on after it (decode.decode_frame says how the next record is found when TOTALSIZE itself is bad).
Stopping there instead would leave every later record unindexed, while queries answer OK with
nothing; the damaged record itself is known to the commit log too (Pull and GetMessage answer
DATA_LOSS for it), so nothing is hidden by going on.

One exception is deliberate and logged as ``index.follower_gap``: when retention has deleted the
log's head beyond the resume offset (Tail answers OUT_OF_RANGE below the log's minimum), those records
no longer exist and cannot be indexed; the follower restarts from the earliest record and counts the
skipped bytes. When the resume offset is above the log's end (the log lost records it had shown, or it
is still starting) the follower waits and retries, logging ``index.follower_ahead_of_log``.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import structlog
from mqstore.errors import InvalidArgument, OutOfRange, Unavailable

from .decode import DamagedRange, decode_frame
from .ports import CommitLogReader, TailStream

log = structlog.get_logger("index.follower")
MAX_DAMAGED_RANGES = 100  # kept for Stats; older ones are only in the log


@dataclass(frozen=True)
class FollowerConfig:
    """How the follower and the upkeep thread talk to the commit log. Frozen, validated."""

    max_frame_bytes: int = 1 << 20        # per Tail frame (the server clamps to 4 MiB)
    heartbeat_ms: int = 1_000             # idle Tail sends an empty frame this often (lag stays fresh)
    backoff_initial_ms: int = 50          # first wait after a failure; doubles per failure...
    backoff_max_ms: int = 5_000           # ...up to this
    retention_interval_ms: int = 10_000   # how often the index follows the log's retention
    rebuild_interval_ms: int = 10_000     # how often the upkeep thread looks for ranges to rebuild

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "heartbeat_ms", "backoff_initial_ms", "backoff_max_ms",
                     "retention_interval_ms", "rebuild_interval_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise InvalidArgument(f"backoff_max_ms {self.backoff_max_ms} < backoff_initial_ms "
                                  f"{self.backoff_initial_ms}")


class Backoff:
    """Exponential backoff: initial, doubling, capped. Not thread-safe (one per loop)."""

    def __init__(self, initial_ms: int, max_ms: int):
        self.initial_ms, self.max_ms = initial_ms, max_ms
        self._next_ms = initial_ms

    def next_s(self) -> float:
        wait_ms = self._next_ms
        self._next_ms = min(self._next_ms * 2, self.max_ms)
        return wait_ms / 1000

    def reset(self) -> None:
        self._next_ms = self.initial_ms


@dataclass(frozen=True, slots=True)
class FollowerState:
    connected: bool
    log_end_physical_offset: int     # last seen visible end of the log (-1 before the first frame)
    reconnects: int                  # streams opened after the first
    skipped_bytes: int               # log bytes deleted by retention before they were indexed
    last_error: str                  # "" while the stream is healthy
    healthy: bool                    # False while failing for a reason other than the log being away
    alive: bool                      # the thread is running (False after stop or a crash)
    damaged_ranges: tuple[DamagedRange, ...] = ()  # the last MAX_DAMAGED_RANGES skipped, oldest first
    damaged_bytes: int = 0           # log bytes skipped since start because their records fail checks


class TailFollower:
    """Thread ``index-follower``: ``start()``, ``stop(timeout_s)``, ``state()``. Thread-safe: state is
    guarded by ``_lock``; the open stream is cancelled from ``stop()`` to end a blocking read."""

    def __init__(self, store, source: CommitLogReader, config: FollowerConfig):
        self.store = store
        self.source = source
        self.config = config
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stream: TailStream | None = None
        self._connected = False
        self._log_end = -1
        self._opened = 0
        self._skipped = 0
        self._last_error = ""
        self._healthy = True
        self._damaged: collections.deque[DamagedRange] = collections.deque(maxlen=MAX_DAMAGED_RANGES)
        self._damaged_bytes = 0

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="index-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._cancel_stream()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("index.follower_stop_timeout", timeout_s=timeout_s)

    def state(self) -> FollowerState:
        alive = self._thread is not None and self._thread.is_alive()
        with self._lock:
            return FollowerState(self._connected, self._log_end, max(0, self._opened - 1), self._skipped,
                                 self._last_error, self._healthy, alive, tuple(self._damaged), self._damaged_bytes)

    # -- the loop -----------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff(self.config.backoff_initial_ms, self.config.backoff_max_ms)
        while not self._stop.is_set():
            try:
                if self._follow_once():
                    backoff.reset()
                    continue  # the stream reached its deadline, or the server ended it: re-open now
                self._set(connected=False)  # ended before a single frame: the server is stopping
            except OutOfRange as exc:
                if self._handle_out_of_range(exc):
                    backoff.reset()
                    continue
            except Unavailable as exc:
                self._failed(exc, "index.follower_disconnected", healthy=True)
            except Exception as exc:
                self._failed(exc, "index.follower_failed", healthy=False)
            self._stop.wait(backoff.next_s())
        self._set(connected=False)
        log.info("index.follower_stopped", resume_physical_offset=self.store.resume_physical_offset())

    def _follow_once(self) -> bool:
        """Follow one stream until it ends or fails; True if it delivered at least one frame."""
        start = self.store.resume_physical_offset()
        earliest = start == 0
        stream = self.source.tail(None if earliest else start, max_frame_bytes=self.config.max_frame_bytes,
                                  heartbeat_ms=self.config.heartbeat_ms)
        with self._lock:
            self._stream = stream
            self._opened += 1
        if self._stop.is_set():  # stop() ran before the stream was published: it could not cancel it
            stream.cancel()
        log.info("index.follower_opened", from_physical_offset=start, earliest=earliest)
        frames = 0
        try:
            for frame in stream:
                self._apply(frame)
                frames += 1
                if self._stop.is_set():
                    break
        finally:
            stream.cancel()
            with self._lock:
                self._stream = None
        return frames > 0

    def _apply(self, frame) -> None:
        with self._lock:  # first, so that Stats never shows progress from a stream it calls closed
            if not self._connected:
                log.info("index.follower_connected", resume_physical_offset=self.store.resume_physical_offset(),
                         log_end_physical_offset=frame.log_end_physical_offset)
            self._connected, self._last_error, self._healthy = True, "", True
            self._log_end = max(self._log_end, frame.log_end_physical_offset)
        resume = self.store.resume_physical_offset()
        records = []
        if frame.records:
            decoded = decode_frame(frame.records, frame.next_physical_offset)
            records = decoded.records
            for damaged in decoded.damaged:
                self._skip_damaged(damaged)
        if records or frame.next_physical_offset > resume:
            self.store.apply(records, frame.next_physical_offset)

    def _skip_damaged(self, damaged: DamagedRange) -> None:
        with self._lock:
            if any(d.start_physical_offset == damaged.start_physical_offset for d in self._damaged):
                return  # a frame fed again (after a reconnect) reports the same range again
            self._damaged.append(damaged)
            self._damaged_bytes += damaged.end_physical_offset - damaged.start_physical_offset
        log.error("index.damaged_record_skipped", start_physical_offset=damaged.start_physical_offset,
                  end_physical_offset=damaged.end_physical_offset, reason=damaged.reason,
                  why="the commit log holds bytes there that fail their checks; they are not indexed "
                      "(Pull and GetMessage answer DATA_LOSS for them)")

    def _handle_out_of_range(self, exc: OutOfRange) -> bool:
        """True when the follower may retry at once (it moved past a deleted head)."""
        resume = self.store.resume_physical_offset()
        low, high = exc.min_value, exc.max_value
        if low is not None and resume < low:
            # Retention deleted records before they were indexed: they no longer exist anywhere.
            log.error("index.follower_gap", from_physical_offset=resume, to_physical_offset=low,
                      skipped_bytes=low - resume, why="the commit log deleted these records (retention) "
                      "before the index read them; they cannot be indexed")
            self.store.apply([], low)
            with self._lock:
                self._skipped += low - resume
            return True
        self._failed(exc, "index.follower_ahead_of_log", healthy=True, log_end_physical_offset=high)
        return False

    # -- state --------------------------------------------------------------------------------------
    def _failed(self, exc: BaseException, event: str, *, healthy: bool, **fields) -> None:
        """Log a failed stream and remember it. ``healthy`` False: not the commit log being away but
        something needing attention (a bad frame, a full disk); health turns NOT_SERVING."""
        if self._stop.is_set():
            return  # the stream was cancelled by stop()
        message = f"{type(exc).__name__}: {exc}"
        (log.warning if healthy else log.error)(
            event, error=message, resume_physical_offset=self.store.resume_physical_offset(), **fields)
        with self._lock:
            self._connected, self._last_error, self._healthy = False, message, healthy

    def _set(self, *, connected: bool) -> None:
        with self._lock:
            self._connected = connected

    def _cancel_stream(self) -> None:
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
