"""The timer: delayed messages wait in the timer topic and are delivered at their time as new appends to their
real topic (issue 35; RocketMQ's RIP-43 in mqstore's shape, with its known failures fixed).

* **Enqueue**: the timer reads the timer topic's queue 0 from its enqueue offset and adds a unit per record to
  the wheel (mqstore.timer.files) in the slot of its due time, or of the slot being read if that time has
  passed. A due time at or past the wheel's span (from the slot being read) is parked as a *roll* unit near the
  span's end: when that slot is read the record is appended to the timer topic again and waits another turn,
  so a delay of any length fits a wheel of fixed size. A cancel marker adds a cancel unit to its target's slot.
  A batch's units go to the files in one write (TimerFiles.add_many). A record the Scheduler appended on this
  leadership was *noted* (:meth:`Timer.note`: its offsets, due time and store time) and is not read back once its
  header matches the note; any other record's properties are read from the log.
* **Dequeue**: the slot being read (``read_ms``) is loaded once the clock reaches it; its units are delivered
  one by one once the clock reaches each one's own due time (never early, and not a precision late either:
  lateness is the duty's pause and the append), cancelled units dropped; the slot is done when it is empty and
  the clock has passed its end, then ``read_ms`` moves one precision on. Slots are read only while the enqueue
  has caught up with the topic, so no record is overtaken by the wheel.
* **Idempotence** (RocketMQ re-delivers every slot since its last checkpoint: #6984, #11047): a copy carries
  TIMER_UNIT (the timer record's queue offset), a rolled record TIMER_ROLLED_FROM. The checkpoint keeps, with
  ``read_ms``, the commit log's end when that slot was reached (``read_log_end``): every delivery of a later
  slot lies above it. At open the timer reads the log from there and skips the units it finds done.
* **Downtime longer than the wheel** (RocketMQ skips those messages): ``read_ms`` is the checkpoint's, however
  old; the slots from there are read in turn (each slot time is stored in the slot, so a slot of an earlier
  turn reads as empty), and once a whole span has been read with nothing left the timer jumps to now.
* **Failed appends** are retried with back-off by the duty (mqstore.background), never dropped (#7927); they are
  counted (``mqstore_timer_delivery_failures_total``) and the duty's state names the last error. A copy whose
  real topic was deleted is dropped with a log line and counted (there is nowhere to deliver it).
* **Retention floor** (RocketMQ's retention deletes timer records before their turn): :attr:`Timer.retention_floor`
  is the lowest log offset the timer still needs: the oldest unit not delivered or rolled yet (its slot not read:
  the timer log is in topic order, so a cursor finds it), the first timer record not enqueued yet, and the log
  end of the checkpoint (where recovery reads the copies made). Published at each checkpoint; the store's
  retention deletes nothing from there (TimerDuty.retention_floor). Rolls keep it within about one wheel span
  of the clock while the timer keeps up; after downtime it is as old as the oldest message not delivered.
* **Rebuild**: without usable files the timer starts from the topic's lowest offset with ``read_ms`` at now,
  every unit already due delivered at once, and the whole log from that record read for TIMER_UNIT first.

Thread-safety: none; the timer's duty (mqstore.timer.leadership) owns it; :meth:`Timer.stats` may be read from
any thread (plain int reads).
"""

from __future__ import annotations

import pathlib

from mqstore.timer.config import TimerConfig
from mqstore.timer.dequeue import Dequeue
from mqstore.timer.enqueue import Enqueue
from mqstore.timer.files import TimerFiles
from mqstore.timer.recovery import Recovery
from mqstore.timer.state import TimerState, TimerStats

__all__ = ["Timer", "TimerStats"]

ROLL_PASSES = 4


class Timer:
    """The timer: it builds its parts (mqstore.timer.enqueue, .dequeue, .recovery), each with its own state and
    given what it reads (the files, the shared positions, the stats, and the other parts it calls), runs them in
    turn (:meth:`step`) and is their face to the duty, the Scheduler and the tests."""

    def __init__(self, store, config: TimerConfig, directory: pathlib.Path, metrics=None):
        """``store``: the started MessageStore; ``metrics``: a TimerMetrics or None."""
        self.store = store
        self.config = config
        self.precision = config.timer_precision_ms
        self.files = TimerFiles(directory, self.precision, config.timer_wheel_slots)
        self.metrics = metrics
        self.stats = TimerStats()
        self.state = TimerState()
        self.dequeue = Dequeue(store, config, self.files, self.state, self.stats, metrics, self.checkpoint)
        self.enqueue = Enqueue(store, config, self.files, self.state, self.stats, metrics, self.dequeue)
        self.recovery = Recovery(store, config, self.files, self.state, self.stats, self.enqueue, self.dequeue)

    # ---- the face: the duty's (open, step, checkpoint, close, retention_floor), the Scheduler's (note)
    def open(self) -> None:
        """Recover the files (or rebuild) and read the log for what is done (Recovery.open)."""
        self.recovery.open()

    def close(self) -> None:
        self.recovery.close()

    def checkpoint(self, force: bool = False) -> None:
        """Record what holds (Recovery.checkpoint)."""
        self.recovery.checkpoint(force)

    def note(self, results, dues: list[int]) -> None:
        """A delayed batch the Scheduler appended to the timer topic, from the appending thread (Enqueue.note)."""
        self.enqueue.note(results, dues)

    @property
    def retention_floor(self) -> int | None:
        """The lowest log offset the timer still needs (Recovery's; read from the store's retention thread)."""
        return self.recovery.retention_floor

    @property
    def enqueue_offset(self) -> int:
        return self.state.enqueue_offset

    @enqueue_offset.setter
    def enqueue_offset(self, offset: int) -> None:
        self.state.enqueue_offset = offset

    @property
    def read_ms(self) -> int:
        return self.state.read_ms

    @property
    def _notes(self) -> dict:
        """The enqueue's notes (the tests look at them)."""
        return self.enqueue._notes

    @property
    def _noted(self) -> int:
        return self.enqueue._noted

    # ---- the step
    def step(self) -> float:
        """Enqueue what the topic holds, deliver what is due; seconds until the next step is needed."""
        now = self.store.clock.now_ms()
        wait_ms = self.precision
        for _ in range(ROLL_PASSES):  # a roll re-appended in this pass may be due already: read it at once
            rolled = self.stats.rolled
            caught_up = self.enqueue._enqueue()
            if not caught_up:
                break
            wait_ms = self.dequeue._dequeue(now)
            if self.stats.rolled == rolled:
                break
        self.stats.lag_ms = max(0, now - self.state.read_ms - self.precision)
        if now - self.recovery.last_checkpoint_ms >= self.config.timer_checkpoint_interval_ms:
            self.checkpoint()
        return max(0.0, wait_ms / 1000) if caught_up else 0.0
