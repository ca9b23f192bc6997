"""One Tail follower for every service that derives its data from the commit log (no grpc here).

A :class:`Follower` is a background :class:`~mqstore.background.Duty` that keeps a *projection* (the
index, a compaction log, a transaction's pending set) in step with the log. It opens a Tail stream of
a :class:`TailSource` at ``projection.resume_offset()`` (``None``: from the earliest record the log
holds; 0 is an offset like any other), hands every frame to ``projection.apply(frame)`` and re-opens
the stream when it ends. Everything below the resume offset is applied; everything at or above it
is fed again after a reconnect, so ``apply`` must be idempotent by physical offset.

  what happens                              what the follower does
  ----------------------------------------- ----------------------------------------------------------
  a frame                                   apply it; heartbeats (no records) apply too: they move the
                                            resume point past filtered bytes and give the log's end
  the stream ends after a frame (deadline)  re-open at once at the resume offset
  the stream ends before any frame          the log is stopping: re-open after a backoff
  Unavailable (the log is away)             disconnected, healthy; re-open after a backoff
  OutOfRange above the resume offset:       ``follower.gap``; SKIP: move the projection to the log's
  retention deleted records that were       first record (an empty frame there), count the skipped
  never applied                             bytes, go on. STOP: stay at the offset, report the gap in
                                            the state and in ``problem()`` (health NOT_SERVING), keep
                                            retrying after a backoff (in case the records come back)
  OutOfRange otherwise (the resume offset   ``follower.ahead_of_log``: healthy, retried after a backoff
  is past the log's end: it is starting or
  lost records it had shown)
  another error the Duty retries (a bad     ``follower.failed``: unhealthy (``problem()`` says so),
  frame, a full disk: MqStoreError, OSError) retried after a backoff
  anything else (a bug)                     the duty dies and ``problem()`` names it (never retried)

The gap policy is the projection's to choose: SKIP for data that can be rebuilt from the log (an
index), STOP for data that cannot (a compaction log: once the log has expired a segment it is the
only copy, so skipping would lose keys silently). A STOP follower may still skip a gap that its
``gap_skippable(gap)`` says can hold no record it needs (the compactor's, when every compaction topic
of the gap was deleted); it is then skipped as under SKIP.

A record that fails its checks is not a failure of the stream: ``apply`` returns the damaged ranges it
skipped (objects with ``start_physical_offset``, ``end_physical_offset`` and ``reason``); the follower
logs each once as ``follower.damaged_record_skipped`` and keeps the last ``MAX_DAMAGED_RANGES`` in its
state. A projection that must not skip one raises DataLoss instead (unhealthy, retried).
"""

from __future__ import annotations

import collections
import enum
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock, SystemClock
from mqstore.errors import InvalidArgument, OutOfRange, Unavailable
from mqstore.metrics import Registry
from mqstore.model import TailFrame

log = structlog.get_logger("mqstore.follow")
MAX_DAMAGED_RANGES = 100  # kept in the state; older ones are only in the log


class TailStream(Protocol):
    """An open Tail: iterate for frames; ``cancel()`` (from any thread) ends the iteration. Errors
    are mqstore errors (Unavailable, OutOfRange with ``min_value``/``max_value``, ...)."""

    def __iter__(self) -> Iterator[TailFrame]: ...

    def cancel(self) -> None: ...


class TailSource(Protocol):
    """Where frames come from (mqstore_rpc's CommitLogClient over gRPC; a fake in tests). Thread-safe."""

    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int) -> TailStream:
        """Frames from ``from_physical_offset`` (a record start), or from the earliest record when None."""


class DamagedRange(Protocol):
    """Log bytes [start, end) that a projection skipped because their record fails its checks."""

    start_physical_offset: int
    end_physical_offset: int
    reason: str


class Projection(Protocol):
    """What a follower keeps in step with the log. Called only from the follower's thread (others may
    read it concurrently: its own locks)."""

    def resume_offset(self) -> int | None:
        """Where to (re)open the stream: every record below it is applied. None: nothing yet, from the
        earliest record the log holds."""

    def apply(self, frame: TailFrame) -> Sequence[DamagedRange]:
        """Apply one frame (idempotent); the ranges it skipped as damaged (usually none)."""


class GapPolicy(enum.Enum):
    SKIP = "skip"   # retention removed records before they were applied: go on from the log's head
    STOP = "stop"   # ...: stay, report, never advance past them


@dataclass(frozen=True)
class FollowConfig:
    """How a follower reads the log. Frozen, validated; the fields are flags of the services."""

    max_frame_bytes: int = 1 << 20        # per Tail frame (the server clamps to 4 MiB)
    heartbeat_ms: int = 1_000             # idle Tail sends an empty frame this often (lag stays fresh)
    backoff_initial_ms: int = 50          # first wait after a failure; doubles per failure...
    backoff_max_ms: int = 5_000           # ...up to this

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "heartbeat_ms", "backoff_initial_ms", "backoff_max_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise InvalidArgument(f"backoff_max_ms {self.backoff_max_ms} < backoff_initial_ms "
                                  f"{self.backoff_initial_ms}")


@dataclass(frozen=True, slots=True)
class Gap:
    """Log bytes [start, end) that retention deleted before the projection applied them."""

    start_physical_offset: int
    end_physical_offset: int


@dataclass(frozen=True, slots=True)
class FollowerState:
    connected: bool
    log_end_physical_offset: int | None  # last seen visible end of the log; None before the first frame
    reconnects: int                      # streams opened after the first
    skipped_bytes: int                   # bytes deleted by retention before they were applied (SKIP)
    last_error: str                      # "" while the stream is healthy
    healthy: bool                        # False while failing for a reason other than the log being away
    alive: bool                          # the thread is running (False before start, after stop or death)
    damaged_ranges: tuple[DamagedRange, ...] = ()  # the last MAX_DAMAGED_RANGES skipped, oldest first
    damaged_bytes: int = 0               # bytes skipped since start because their records fail checks
    gap: Gap | None = None               # STOP: the gap the follower is stopped at
    died: str = ""                       # the bug that killed the thread, "" otherwise


class Follower(Duty):
    """Thread ``name``: ``start()``, ``stop(timeout_s)``, ``state()``, ``problem()``. Thread-safe: the
    state is guarded by ``_state_lock``; the open stream is cancelled from ``stop()`` to end a read."""

    def __init__(self, name: str, source: TailSource, projection: Projection, config: FollowConfig, *,
                 gap_policy: GapPolicy = GapPolicy.SKIP, gap_skippable: Callable[[Gap], bool] | None = None,
                 clock: Clock | None = None):
        super().__init__(name, interval_s=0.0, backoff_initial_s=config.backoff_initial_ms / 1000,
                         backoff_max_s=config.backoff_max_ms / 1000)
        self.source, self.projection, self.config, self.gap_policy = source, projection, config, gap_policy
        self.gap_skippable = gap_skippable
        self._state_lock = threading.Lock()
        self._stream: TailStream | None = None
        self._connected = False
        self._log_end: int | None = None
        self._opened = 0
        self._skipped = 0
        self._stream_error = ""
        self._healthy = True
        self._gap: Gap | None = None
        self._damaged: collections.deque = collections.deque(maxlen=MAX_DAMAGED_RANGES)
        self._damaged_bytes = 0
        self._clock = clock or SystemClock()
        self._caught_up_s = self._clock.monotonic_s()  # when the follower last had applied the log's end

    def register_metrics(self, metrics: Registry) -> None:
        """Its lag behind the log, in bytes and in seconds (how long since it last had applied
        everything it had seen of the log), whether it is connected, and its reconnects, labelled with
        the follower's name."""
        label = (self.name,)

        def lag_bytes() -> dict:
            lag = self.lag_bytes()
            return {} if lag is None else {label: lag}

        metrics.gauge_fn("mqstore_follower_lag_bytes", "log bytes between what the follower has applied and the "
                         "log's end (absent until a Tail frame has told it where the log ends)", lag_bytes,
                         ("follower",))
        metrics.gauge_fn("mqstore_follower_lag_seconds", "seconds since the follower had applied everything up to "
                         "the log's end (0 while caught up; counted from its start until a Tail frame has shown "
                         "it caught up)", lambda: {label: self.lag_seconds()}, ("follower",))
        metrics.gauge_fn("mqstore_follower_connected", "1 while the follower's Tail stream is open",
                         lambda: {label: int(self.state().connected)}, ("follower",))
        metrics.counter_fn("mqstore_follower_reconnects_total", "Tail streams re-opened",
                           lambda: {label: self.state().reconnects}, ("follower",))

    def lag_bytes(self) -> int | None:
        """Bytes between what the follower has applied and the log's end; None until a Tail frame has told
        it where the log ends (a follower that never reached the log is not "caught up")."""
        with self._state_lock:
            end = self._log_end
        if end is None:
            return None
        resume = self.projection.resume_offset()
        return max(0, end - (resume if resume is not None else end))

    def lag_seconds(self) -> float:
        """0 while caught up; else the seconds since it last was, counted from its start if it never was
        (so a follower that cannot reach the log shows a lag that grows)."""
        if self.lag_bytes() == 0:
            return 0.0
        with self._state_lock:
            since = self._caught_up_s
        return max(0.0, self._clock.monotonic_s() - since)

    # ---- state ---------------------------------------------------------------------------------------
    def state(self) -> FollowerState:
        duty = super().state()
        with self._state_lock:
            return FollowerState(self._connected, self._log_end, max(0, self._opened - 1), self._skipped,
                                 self._stream_error, self._healthy, duty.alive, tuple(self._damaged),
                                 self._damaged_bytes, self._gap, duty.died)

    def problem(self) -> str:
        """"" while healthy (the log being away is not a problem of ours); else why not."""
        died = super().problem()
        if died:
            return died
        with self._state_lock:
            if self._gap is not None:
                return (f"{self.name} stopped at physical offset {self._gap.start_physical_offset}: the commit "
                        f"log deleted [{self._gap.start_physical_offset}, {self._gap.end_physical_offset}) "
                        f"(retention) before it was applied, and this data cannot be rebuilt without it")
            return "" if self._healthy else f"{self.name}: {self._stream_error}"

    # ---- the duty ------------------------------------------------------------------------------------
    def step(self) -> None:
        """Follow one stream until it ends; raises (for the backoff) when it failed."""
        start = self.projection.resume_offset()
        try:
            frames = self._follow(start)
        except OutOfRange as exc:
            if not self._out_of_range(exc, start):
                raise
            return  # moved past a deleted head: re-open at once
        except Unavailable as exc:
            self._failed(exc, "follower.disconnected", healthy=True)
            raise
        except self.retry_on as exc:
            self._failed(exc, "follower.failed", healthy=False)
            raise
        if frames == 0 and not self.stopping:
            with self._state_lock:
                self._connected = False
            raise Unavailable("the Tail stream ended before its first frame (is the commit log stopping?)")

    def _follow(self, start: int | None) -> int:
        """Open a stream at ``start`` and apply its frames until it ends; the number of frames."""
        stream = self.source.tail(start, max_frame_bytes=self.config.max_frame_bytes,
                                  heartbeat_ms=self.config.heartbeat_ms)
        with self._state_lock:
            self._stream = stream
            self._opened += 1
        if self.stopping:  # stop() ran before the stream was published: it could not cancel it
            stream.cancel()
        log.info("follower.opened", follower=self.name, from_physical_offset=start, earliest=start is None)
        frames = 0
        try:
            for frame in stream:
                self._on_frame(frame)
                frames += 1
                if self.stopping:
                    break
        finally:
            stream.cancel()
            with self._state_lock:
                self._stream = None
        return frames

    def on_stop(self) -> None:
        with self._state_lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def stop(self, timeout_s: float = 10.0) -> bool:
        done = super().stop(timeout_s)
        with self._state_lock:
            self._connected = False
        log.info("follower.stopped", follower=self.name, resume_physical_offset=self.projection.resume_offset())
        return done

    # ---- frames --------------------------------------------------------------------------------------
    def _on_frame(self, frame: TailFrame) -> None:
        with self._state_lock:  # first, so that the state never shows progress from a stream it calls closed
            if not self._connected:
                log.info("follower.connected", follower=self.name, resume_physical_offset=self.projection.
                         resume_offset(), log_end_physical_offset=frame.log_end_physical_offset)
            self._connected, self._stream_error, self._healthy, self._gap = True, "", True, None
            self._log_end = max(self._log_end or 0, frame.log_end_physical_offset)
        for damaged in self.projection.apply(frame):
            self._skip_damaged(damaged)
        if frame.next_physical_offset >= frame.log_end_physical_offset:
            with self._state_lock:
                self._caught_up_s = self._clock.monotonic_s()

    def _skip_damaged(self, damaged: DamagedRange) -> None:
        with self._state_lock:
            if any(d.start_physical_offset == damaged.start_physical_offset for d in self._damaged):
                return  # a frame fed again (after a reconnect) reports the same range again
            self._damaged.append(damaged)
            self._damaged_bytes += damaged.end_physical_offset - damaged.start_physical_offset
        log.error("follower.damaged_record_skipped", follower=self.name,
                  start_physical_offset=damaged.start_physical_offset,
                  end_physical_offset=damaged.end_physical_offset, reason=damaged.reason,
                  why="the commit log holds bytes there that fail their checks; they are not applied "
                      "(Pull and GetMessage answer DATA_LOSS for them)")

    def _out_of_range(self, exc: OutOfRange, start: int | None) -> bool:
        """True when the follower skipped a gap and may re-open at once."""
        low, high = exc.min_value, exc.max_value
        if start is None or low is None or start >= low:
            self._failed(exc, "follower.ahead_of_log", healthy=True, log_end_physical_offset=high)
            return False
        gap = Gap(start, low)
        if self.gap_policy is GapPolicy.STOP and not (self.gap_skippable is not None and self.gap_skippable(gap)):
            with self._state_lock:
                new = self._gap != gap
                self._connected, self._gap, self._healthy = False, gap, False
                self._stream_error = f"{type(exc).__name__}: {exc}"
            if new:
                log.error("follower.gap", follower=self.name, policy="stop", from_physical_offset=start,
                          to_physical_offset=low, why="the commit log deleted these records (retention) "
                          "before they were applied; this data cannot be rebuilt, so the follower stays here")
            return False
        log.error("follower.gap", follower=self.name, policy="skip", from_physical_offset=start,
                  to_physical_offset=low, skipped_bytes=low - start, why="the commit log deleted these "
                  "records (retention) before they were applied; they no longer exist anywhere")
        self.projection.apply(TailFrame(b"", 0, low, low if high is None else high))
        with self._state_lock:
            self._skipped += low - start
        return True

    def _failed(self, exc: BaseException, event: str, *, healthy: bool, **fields) -> None:
        """Log a failed stream and remember it. ``healthy`` False: not the log being away but something
        needing attention (a bad frame, a full disk); ``problem()`` then says so."""
        if self.stopping:
            return  # the stream was cancelled by stop()
        message = f"{type(exc).__name__}: {exc}"
        (log.warning if healthy else log.error)(
            event, follower=self.name, error=message, resume_physical_offset=self.projection.resume_offset(),
            **fields)
        with self._state_lock:
            self._connected, self._stream_error, self._healthy = False, message, healthy
