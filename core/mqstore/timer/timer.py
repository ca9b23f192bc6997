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
import threading
from dataclasses import dataclass

from mqstore.timer.config import TimerConfig
from mqstore.timer.dequeue import Dequeue
from mqstore.timer.enqueue import Enqueue
from mqstore.timer.files import TimerFiles
from mqstore.timer.recovery import Recovery

ROLL_PASSES = 4


@dataclass
class TimerStats:
    scheduled: int = 0      # units added to the wheel (not rolls or cancels)
    delivered: int = 0      # copies appended
    rolled: int = 0         # records re-appended to wait another turn
    cancelled: int = 0      # units dropped by a cancel marker
    skipped_done: int = 0   # units found delivered already at recovery
    dropped: int = 0        # units whose real topic or record is gone
    pending: int = 0        # units in the wheel not delivered yet (an estimate after a restart)
    lag_ms: int = 0         # how far the read slot is behind the clock (0 while it keeps up)


class Timer(Enqueue, Dequeue, Recovery):
    """The timer: its state, and the step that runs its parts in turn. The parts are written apart, each in its
    module (mqstore.timer.enqueue, .dequeue, .recovery), and share this state: every attribute is set here."""

    def __init__(self, store, config: TimerConfig, directory: pathlib.Path, metrics=None):
        """``store``: the started MessageStore; ``metrics``: a TimerMetrics or None."""
        self.store = store
        self.config = config
        self.precision = config.timer_precision_ms
        self.files = TimerFiles(directory, self.precision, config.timer_wheel_slots)
        self.metrics = metrics
        self.stats = TimerStats()
        self.enqueue_offset = 0
        self.read_ms = 0
        self.read_log_end = 0
        self._advances: list[tuple[int, int]] = []  # (read_ms, read_log_end) not yet checkpointed
        self._current = None  # the read slot's units left, by due time (a delivery.DueUnits: Dequeue's)
        self.cancels: dict[int, int] = {}  # origin -> due of a recalled message (kept a turn past its due)
        self._done: set[int] = set()  # timer offsets delivered already (recovery's scan of TIMER_UNIT)
        self._rolled: set[int] = set()  # timer offsets re-appended already (TIMER_ROLLED_FROM): never again
        self._done_until_ms = 0  # the scan's set is needed for slots before this
        self._slot_done: set[int] = set()  # delivered from the read slot (a retried step skips them)
        self._next_jump_check = 0
        self._caught_up_at: int | None = None  # the read slot when the enqueue first caught up with the topic
        self._last_checkpoint_ms = 0
        self._checkpoint_skipped = False  # the last checkpoint write met a full disk (logged once)
        self._cp_read = self._cp_end = 0  # the read slot and log end the next checkpoint records
        self._floor_position = 0  # timer log position: every unit before it is in a slot read already
        self.retention_floor: int | None = None  # published for the store's retention (read from its thread)
        # queue offset -> (a batch's physical offsets, due times, store ms, the index of that offset's): note()
        self._notes: dict[int, tuple[object, list[int], int, int]] = {}  # object: an array of int64
        self._noted = 0  # records noted and not taken yet (at most MAX_NOTES)
        self._notes_lock = threading.Lock()

    # ---- the step
    def step(self) -> float:
        """Enqueue what the topic holds, deliver what is due; seconds until the next step is needed."""
        now = self.store.clock.now_ms()
        wait_ms = self.precision
        for _ in range(ROLL_PASSES):  # a roll re-appended in this pass may be due already: read it at once
            rolled = self.stats.rolled
            caught_up = self._enqueue()
            if not caught_up:
                break
            wait_ms = self._dequeue(now)
            if self.stats.rolled == rolled:
                break
        self.stats.lag_ms = max(0, now - self.read_ms - self.precision)
        if now - self._last_checkpoint_ms >= self.config.timer_checkpoint_interval_ms:
            self.checkpoint()
        return max(0.0, wait_ms / 1000) if caught_up else 0.0
