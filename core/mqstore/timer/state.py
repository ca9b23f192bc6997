"""What the timer's parts (mqstore.timer.enqueue, .dequeue, .recovery) share, each given it by the Timer that builds
them: the positions one part moves and another reads (:class:`TimerState`), the counters (:class:`TimerStats`), and
the timer topic's bounds (:func:`topic_bounds`).

Thread-safety: as the Timer's (its duty owns it); ``enqueue_offset`` is read by Enqueue.note on the appending thread
and the stats from any thread (plain int reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqstore.timer import messages as tm


@dataclass
class TimerStats:
    scheduled: int = 0  # units added to the wheel (not rolls or cancels)
    delivered: int = 0  # copies appended
    rolled: int = 0  # records re-appended to wait another turn
    cancelled: int = 0  # units dropped by a cancel marker
    skipped_done: int = 0  # units found delivered already at recovery
    dropped: int = 0  # units whose real topic or record is gone
    pending: int = 0  # units in the wheel not delivered yet (an estimate after a restart)
    lag_ms: int = 0  # how far the read slot is behind the clock (0 while it keeps up)


@dataclass(eq=False)
class TimerState:
    """The positions the parts share; the part that moves each is named (Recovery sets them all at the open)."""

    enqueue_offset: int = 0  # the next timer record to enqueue: Enqueue's
    read_ms: int = 0  # the read slot: Dequeue's
    read_log_end: int = 0  # the log end when the read slot was reached: Dequeue's
    # (read_ms, read_log_end) not yet checkpointed: Dequeue appends, Recovery's checkpoint takes
    advances: list[tuple[int, int]] = field(default_factory=list)
    cp_read: int = 0  # the read slot the next checkpoint records: Recovery's
    cp_end: int = 0  # the log end the next checkpoint records: Recovery's
    cancels: dict[int, int] = field(default_factory=dict)  # origin -> due of a recalled message: Enqueue adds,
    # Recovery recovers and drops (kept a turn past its due), Dequeue reads
    done: set[int] = field(default_factory=set)  # timer offsets delivered already (Recovery's scan of TIMER_UNIT)
    rolled: set[int] = field(default_factory=set)  # re-appended already (TIMER_ROLLED_FROM): never again (Recovery's)
    done_until_ms: int = 0  # the scan's set is needed for slots before this (Recovery's)
    caught_up_at: int | None = None  # the read slot when the enqueue first caught up with the topic: Enqueue's


def topic_bounds(store) -> tuple[int, int]:
    """The timer topic's queue 0: its (min offset, max offset), (0, 0) while it has none."""
    cq = store.queues.get(tm.TIMER_TOPIC, 0)
    return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)


class TimerPart:
    """What every part of the Timer (Enqueue, Dequeue, Recovery) is built with: the store, the settings, the timer's
    files, the shared positions and the counters; each part adds what it takes of the others and what it owns."""

    def __init__(self, store, config, files, state: TimerState, stats: TimerStats):
        self.store = store
        self.config = config
        self.precision = config.timer_precision_ms
        self.files = files
        self.state = state
        self.stats = stats
