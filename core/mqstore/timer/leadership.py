"""The timer's duty: it runs on the node that takes writes (a single node, or a replication group's leader once
its copied log is visible), and each leadership opens the timer afresh from its files (mqstore.timer.timer).

  this node                     TimerDuty does
  ----------------------------- -----------------------------------------------------------------------------
  a replica (or candidate)      nothing (the timer topic and the copies are records of the log: they replicate)
  leads, its log visible        opens the Timer (recovery: checkpoint, log re-check, the log read for copies made
                                after it, so nothing is delivered twice) and steps it
  stops leading                 closes the Timer (checkpoint, files closed); the next leader resumes from its own
                                files and the log

The duty gives the store's retention a floor (:meth:`TimerDuty.retention_floor`, Retention.add_floor): no segment
holding a timer record the timer has not delivered or rolled yet is deleted.

  this node                     the floor
  ----------------------------- -----------------------------------------------------------------------------
  its timer open                the timer's own (Timer.retention_floor: exact)
  leads, timer not open yet     the timer topic's first record (open reads the wheel or rebuilds: all kept)
  a replica                     the first timer record stored within one wheel span (and a precision) of the
                                clock: the leader's timer delivers or rolls each record within a span while it
                                keeps up, so a replica keeps what a failover's timer may still need

A step that fails with a store or OS error (an append refused, the disk full) is retried with back-off by the
duty (mqstore.background): nothing is dropped; :meth:`TimerDuty.problem` names a failure that lasted more than
``FAILING_PROBLEM_S`` (health turns NOT_SERVING), and the failures are counted.

Thread-safety: ``wake``, ``stats`` and ``problem`` from any thread; the rest on the duty's thread or after it
stopped (``close``).
"""

from __future__ import annotations

import pathlib
import threading
import time
from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig
from mqstore.timer.timer import Timer, TimerStats

log = structlog.get_logger("mqstore.timer")

MAX_PAUSE_S = 0.05  # how soon new timer records are read when nothing is due sooner
FAILING_PROBLEM_S = 30.0


class TimerMetrics:
    def __init__(self, registry, stats: Callable[[], TimerStats], retained: Callable[[], int] = lambda: 0):
        self.scheduled = registry.counter("mqstore_timer_scheduled_total", "delayed messages added to the timer wheel")
        self.delivered = registry.counter("mqstore_timer_delivered_total",
                                          "delayed messages delivered to their real topic")
        self.failures = registry.counter("mqstore_timer_delivery_failures_total",
                                         "timer steps whose append failed (retried with back-off)")
        self.late = registry.histogram("mqstore_timer_late_seconds", "how late a delayed message was delivered",
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60))
        registry.gauge_fn("mqstore_timer_pending", "delayed messages in the wheel not delivered yet",
                          lambda: stats().pending)
        registry.gauge_fn("mqstore_timer_lag_seconds", "how far the timer's read slot is behind the clock",
                          lambda: stats().lag_ms / 1000)
        registry.gauge_fn("mqstore_timer_retained_bytes",
                          "commit log bytes kept from the timer's retention floor to the log end", retained)


class TimerDuty(Duty):
    def __init__(self, store, config: TimerConfig, directory: pathlib.Path, *, leading: Callable[[], bool],
                 registry=None):
        """``leading()``: this node takes writes and shows the log it copied (always True on a single node)."""
        super().__init__("timer", interval_s=MAX_PAUSE_S, backoff_initial_s=0.05, backoff_max_s=2.0)
        self.store = store
        self.config = config
        self.directory = directory
        self.leading = leading
        self.timer: Timer | None = None
        self._stats = TimerStats()
        self.metrics = TimerMetrics(registry, self.stats, self.retained_bytes) if registry is not None else None
        self._wait_s = MAX_PAUSE_S
        self._failing_since: float | None = None
        self.leaderships = 0
        self._timer_lock = threading.Lock()  # the timer as retention_floor sees it: set and cleared under it
        store.retention.add_floor("timer", self.retention_floor)

    def retention_floor(self) -> int | None:
        """The log offset below which the store's retention deletes nothing (None: no timer record is kept); from
        any thread (the maintenance duty's)."""
        with self._timer_lock:
            timer = self.timer
            if timer is not None:
                return timer.retention_floor
        cq = self.store.queues.get(tm.TIMER_TOPIC, 0)
        if cq is None or cq.min_offset >= cq.max_offset:
            return None
        offset = cq.min_offset
        if not self.leading():
            since = self.store.clock.now_ms() - self.config.span_ms - self.config.timer_precision_ms
            offset = cq.offset_by_time(since, False, self.store.commitlog.store_timestamp_at)
            if offset >= cq.max_offset:
                return None
        return cq.entry(offset)[0]

    def retained_bytes(self) -> int:
        """The log bytes from the retention floor to the log end (0: the timer keeps nothing)."""
        floor = self.retention_floor()
        return 0 if floor is None else max(0, self.store.log_end() - floor)

    def note(self, results, dues: list[int]) -> None:
        """The Scheduler's ``noted``: a delayed batch appended (Timer.note), from any thread; nothing while no
        timer is open here (a replica's, or between leaderships: the timer reads those records from the log)."""
        timer = self.timer
        if timer is not None:
            timer.note(results, dues)

    def stats(self) -> TimerStats:
        timer = self.timer
        return timer.stats if timer is not None else self._stats

    def step(self) -> None:
        if not self.leading():
            self._close()
            self._wait_s = MAX_PAUSE_S
            return
        try:
            if self.timer is None:
                timer = Timer(self.store, self.config, self.directory, self.metrics)
                timer.open()
                with self._timer_lock:
                    self.timer, self.leaderships = timer, self.leaderships + 1
            self._wait_s = min(self.timer.step(), MAX_PAUSE_S)
        except BaseException:
            self._failing_since = self._failing_since or time.monotonic()
            raise
        self._failing_since = None

    def pause_s(self) -> float:
        return self._wait_s

    def problem(self) -> str:
        since = self._failing_since
        if since is not None and time.monotonic() - since > FAILING_PROBLEM_S:
            return (f"timer: delayed messages are not being delivered since {time.monotonic() - since:.0f} s "
                    f"(retrying): {self.state().last_error}")
        return super().problem()

    def close(self) -> None:
        """After the duty stopped: the last checkpoint, files closed."""
        self._close()

    def _close(self) -> None:
        with self._timer_lock:
            timer, self.timer = self.timer, None
        if timer is not None:
            self._stats = timer.stats
            timer.close()
