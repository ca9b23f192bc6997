"""The timer's parts (issue 33): Enqueue, Dequeue and Recovery are objects the Timer builds, not classes it inherits
from; each holds only the state its docstring says it owns, and what it reads of the others comes through its
constructor (the shared positions, the stats, the files, and the parts it calls). The Timer keeps its face (open,
step, note, checkpoint, close, enqueue_offset, retention_floor, stats, files) and delegates."""

from __future__ import annotations

import inspect

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.clock import FakeClock
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer import scheduling
from mqstore.timer.config import TimerConfig
from mqstore.timer.dequeue import Dequeue
from mqstore.timer.enqueue import Enqueue
from mqstore.timer.recovery import Recovery
from mqstore.timer.state import TimerState
from mqstore.timer.timer import Timer

CONFIG = TimerConfig(timer_precision_ms=100, timer_wheel_slots=64)
COMMON = ["store", "config", "files", "state", "stats"]  # what every part is given
OWN = {  # each part's own state (beyond what it is given)
    Enqueue: {"precision", "_notes", "_noted", "_notes_lock"},
    Dequeue: {"precision", "_current", "_slot_done", "_next_jump_check"},
    Recovery: {"precision", "last_checkpoint_ms", "_checkpoint_skipped", "_floor_position", "retention_floor"},
}


def test_each_part_is_given_what_it_reads_in_its_constructor():
    assert Timer.__mro__ == (Timer, object)  # composed: no part's methods reach the Timer's state
    given = {part: list(inspect.signature(part).parameters) for part in OWN}
    assert given[Enqueue] == [*COMMON, "metrics", "dequeue"]
    assert given[Dequeue] == [*COMMON, "metrics", "checkpoint"]
    assert given[Recovery] == [*COMMON, "enqueue", "dequeue"]


def test_the_parts_hold_their_own_state_and_share_the_positions(small_config, tmp_path):
    clock = FakeClock()
    store = build_store(small_config(), clock)
    store.start()
    store.topic_admin.create("t", 1)
    timer = Timer(store, CONFIG, tmp_path / "timer")
    try:
        timer.open()
        scheduler = scheduling.Scheduler(store, CONFIG, noted=timer.note)
        due = clock.now_ms() + 250
        scheduler.append("t", [MessageIn(b"x", properties={tm.DELIVER_MS: str(due + n)}) for n in range(3)])
        timer.step()
        parts = {Enqueue: timer.enqueue, Dequeue: timer.dequeue, Recovery: timer.recovery}
        for kind, part in parts.items():
            given = set(inspect.signature(kind).parameters) - {"checkpoint"}
            held = set(vars(part)) - {"_checkpoint"}
            assert held == given | OWN[kind], kind.__name__
            assert part.state is timer.state and part.stats is timer.stats and part.files is timer.files
        assert timer.enqueue.dequeue is timer.dequeue
        assert (timer.recovery.enqueue, timer.recovery.dequeue) == (timer.enqueue, timer.dequeue)
        assert isinstance(timer.state, TimerState)
        # The face reads the parts' state: the enqueue's position, the recovery's floor
        assert timer.enqueue_offset == timer.state.enqueue_offset == 3 and timer.stats.scheduled == 3
        timer.checkpoint()
        assert timer.retention_floor == timer.recovery.retention_floor is not None
        clock.advance(400)
        timer.step()
        assert store.queue_info("t", 0).max_offset == 3 and timer.stats.delivered == 3
    finally:
        timer.close()
        store.stop()
