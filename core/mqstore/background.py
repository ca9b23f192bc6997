"""One base for every background duty of every service: a named thread with start, stop and wakeup.

A :class:`Duty` runs ``step()`` in a loop on its own daemon thread, pausing ``interval_s`` between steps
(or until :meth:`Duty.wake`). What happens when a step raises is decided here, once, for all duties:

  error raised by step()                       what the duty does
  -------------------------------------------- -------------------------------------------------------
  one of ``retry_on`` (default: MqStoreError   logs ``duty.retrying`` (name, error, wait), records it
  and OSError: the store said no, the OS       in ``state().last_error``, waits the backoff (doubling
  failed; both may pass; and FailpointHit:     from ``backoff_initial_s`` to ``backoff_max_s``), retries
  a test's armed failpoint stands for the
  I/O failing at that step)
  anything else (a bug: InvariantViolation,    logs ``duty.died`` with the traceback, ends the thread
  TypeError, ...)                              and ``problem()`` names it from then on, so the service's
                                               health turns NOT_SERVING (mqstore_rpc.server polls it)

A bug is never retried: retrying an InvariantViolation forever hides it. A duty for which no error is
harmless (the flush service: a failed fsync may have dropped dirty pages) passes ``retry_on=()``.
A successful step resets the backoff and clears ``last_error``.

Subclasses override ``step()``, and may override ``pause()`` (wait for their own condition instead of
the interval) or ``pause_s()`` (another wait per step), set ``wake_ends_backoff`` (a :meth:`Duty.wake` also
ends a retry's backoff and restarts it from ``backoff_initial_s``: the replica follower, named a new leader
while it backs off from the dead one) and
``on_stop()`` (unblock a step that waits elsewhere, e.g. cancel a stream); a step that
runs long checks :attr:`Duty.stopping` or waits with :meth:`Duty.sleep`.

Thread-safety: ``start``, ``stop``, ``wake``, ``state`` and ``problem`` may be called from any thread;
``step`` runs only on the duty's thread.

:class:`Workers` is the same model for work handed over by other threads (the answers of a check-back
stream, each stream's reader): a fixed number of named threads, a bounded queue (``submit`` waits while
it is full: back-pressure, never an unbounded backlog), start, stop(timeout), and the same rule for a
task that raises something other than the errors it was written to handle: a bug, logged as
``workers.task_failed`` and named by ``problem()`` (health NOT_SERVING); the worker goes on.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import profiling
from mqstore.errors import MqStoreError, Unavailable
from mqstore.failpoints import FailpointHit

log = structlog.get_logger("mqstore.background")


class Backoff:
    """Exponential backoff: ``initial_s``, doubling, capped at ``max_s``. Not thread-safe (one per loop)."""

    def __init__(self, initial_s: float, max_s: float):
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s, self.max_s = initial_s, max_s
        self._next_s = initial_s

    def next_s(self) -> float:
        wait_s = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        return wait_s

    def reset(self) -> None:
        self._next_s = self.initial_s


@dataclass(frozen=True, slots=True)
class DutyState:
    name: str
    alive: bool          # the thread is running (False before start, after stop, after it died)
    steps: int           # steps that completed without an error
    retries: int         # steps that failed with a retriable error
    last_error: str      # the last retriable error, "" after a good step
    died: str            # why the thread died of a bug, "" otherwise


class Duty:
    """A named background thread running ``step()``; see the module docstring for the error policy."""

    def __init__(self, name: str, *, interval_s: float, retry_on: tuple[type[BaseException], ...] = (
                 MqStoreError, OSError, FailpointHit), backoff_initial_s: float = 0.05, backoff_max_s: float = 5.0):
        if interval_s < 0:
            raise ValueError(f"interval_s must not be negative, got {interval_s}")
        self.name = name
        self.interval_s = interval_s
        self.retry_on = retry_on
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self.wake_ends_backoff = False  # True: wake() also cuts a retry's backoff short and restarts it
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._steps = 0
        self._retries = 0
        self._last_error = ""
        self._died = ""

    # ---- to override ---------------------------------------------------------------------------------
    def step(self) -> None:
        """One unit of work. Subclasses override it (the base is abstract in spirit: it raises)."""
        raise TypeError(f"{type(self).__name__} must override Duty.step")

    def pause(self) -> None:
        """Wait before the next step: :meth:`pause_s` or until woken or stopped."""
        self._wake.wait(self.pause_s())
        self._wake.clear()

    def pause_s(self) -> float:
        """How long the next :meth:`pause` waits: ``interval_s`` (a duty may choose per step)."""
        return self.interval_s

    def on_stop(self) -> None:
        """Called by ``stop()`` before joining, from the stopping thread: unblock a waiting step."""

    # ---- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"duty {self.name} was started already")
        self._thread = threading.Thread(target=profiling.run, args=(self._run,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask the thread to end and wait up to ``timeout_s``; True when it has ended."""
        self._stop.set()
        self._wake.set()
        self.on_stop()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            log.error("duty.stop_timeout", duty=self.name, timeout_s=timeout_s)
            return False
        return True

    def wake(self) -> None:
        """Run the next step now instead of after the interval."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait inside a step; True when the duty is stopping (the step should return)."""
        return self._stop.wait(seconds)

    # ---- state ---------------------------------------------------------------------------------------
    def state(self) -> DutyState:
        thread = self._thread
        with self._lock:
            return DutyState(self.name, thread is not None and thread.is_alive(), self._steps, self._retries,
                             self._last_error, self._died)

    def problem(self) -> str:
        """"" while healthy; why not once a bug has killed the thread (for the health check)."""
        with self._lock:
            return f"background duty {self.name} died: {self._died}" if self._died else ""

    # ---- the loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except self.retry_on as exc:
                if self._stop.is_set():
                    break  # the failure is the stop itself (a cancelled stream, a closed file)
                wait_s = self._backoff.next_s()
                message = f"{type(exc).__name__}: {exc}"
                log.warning("duty.retrying", duty=self.name, error=message, wait_s=wait_s)
                with self._lock:
                    self._retries += 1
                    self._last_error = message
                if self.wake_ends_backoff:
                    if self._wake.wait(wait_s):  # stop() sets it too
                        self._backoff.reset()  # woken: what failed may have changed; retry from the start
                    self._wake.clear()
                else:
                    self._stop.wait(wait_s)
                continue
            except BaseException as exc:  # a bug: recorded, reported unhealthy, never retried
                log.exception("duty.died", duty=self.name)
                with self._lock:
                    self._died = f"{type(exc).__name__}: {exc}"
                self.on_died(exc)
                return
            self._backoff.reset()
            with self._lock:
                self._steps += 1
                self._last_error = ""
            if not self._stop.is_set():
                self.pause()

    def on_died(self, exc: BaseException) -> None:
        """Called on the duty's thread after a bug killed the loop (e.g. wake waiters with an error)."""


class Workers:
    """``workers`` named threads (``name-0``, ...) running tasks from a queue of at most ``max_queued``.
    Thread-safe: any thread may submit, stop or read the state."""

    def __init__(self, name: str, *, workers: int, max_queued: int):
        if workers <= 0 or max_queued <= 0:
            raise ValueError(f"workers and max_queued must be positive, got {workers}, {max_queued}")
        self.name, self.workers = name, workers
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(max_queued)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._busy = self._done = 0
        self._bug = ""

    def start(self) -> None:
        with self._lock:
            if self._threads:
                raise RuntimeError(f"workers {self.name} were started already")
            self._threads = [threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
                             for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, task: Callable[[], None], timeout_s: float) -> None:
        """Queue ``task``; waits up to ``timeout_s`` while the queue is full. Unavailable when stopping or
        still full then (the caller decides: a stream reader passes the wait on to its producer)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._stopping:
                    raise Unavailable(f"{self.name}: stopping, the task was not taken")
            try:
                self._queue.put(task, timeout=min(0.1, max(deadline - time.monotonic(), 0)))
                return
            except queue.Full:
                if time.monotonic() >= deadline:
                    raise Unavailable(f"{self.name}: {self._queue.maxsize} tasks are queued already "
                                      f"({self.workers} workers) after {timeout_s:.1f} s; retry") from None

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Take no more tasks; queued ones still run; wait up to ``timeout_s`` for the threads."""
        with self._lock:
            self._stopping = True
            threads = list(self._threads)
        deadline = time.monotonic() + timeout_s
        for _ in threads:
            while True:  # one sentinel per thread, behind the queued tasks
                try:
                    self._queue.put(None, timeout=0.1)
                    break
                except queue.Full:
                    if time.monotonic() >= deadline:
                        break
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log.error("workers.stop_timeout", workers=self.name, alive=alive, timeout_s=timeout_s)
        return not alive

    def busy(self) -> int:
        with self._lock:
            return self._busy

    def problem(self) -> str:
        with self._lock:
            return f"workers {self.name}: a task failed with a bug: {self._bug}" if self._bug else ""

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            with self._lock:
                self._busy += 1
            try:
                task()
            except BaseException as exc:  # a bug of the task (it handles its expected errors): reported
                log.exception("workers.task_failed", workers=self.name)
                with self._lock:
                    self._bug = f"{type(exc).__name__}: {exc}"
            finally:
                with self._lock:
                    self._busy -= 1
                    self._done += 1
