"""The timer's dequeue, its delivery (mqstore.timer.timer has the design): the read slot's units taken in order
of their due times, their copies (or roll records) appended batched per topic, and the read slot moved on once it
is empty and past.

Thread-safety: as the Timer's (its duty owns it).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from mqstore import topics as topic_rules
from mqstore.errors import InvalidArgument, TopicNotFound
from mqstore.format import record_reader
from mqstore.format.timer_unit import KIND_DELIVER, KIND_ROLL, Unit
from mqstore.model import KIND_COMPACTION, Copies, Copy
from mqstore.timer import delivery, messages as tm
from mqstore.timer.config import TimerConfig
from mqstore.timer.files import TimerFiles
from mqstore.timer.state import TimerPart, TimerState, TimerStats, topic_bounds

log = structlog.get_logger("mqstore.timer")

DELIVER_BATCH = 1000    # copies appended per step and topic batch (the store's max_batch_messages)
MAX_SLOTS_PER_STEP = 20_000


class Dequeue(TimerPart):
    """The Timer's dequeue (its delivery), a part :class:`mqstore.timer.timer.Timer` builds. It owns the read
    slot's due units (``_current``, a delivery.DueUnits), what the slot delivered (``_slot_done``) and when it next
    checks for a jump over a long downtime (``_next_jump_check``); in the shared ``state`` it moves ``read_ms`` and
    ``read_log_end``, queues their ``advances`` for Recovery's checkpoint and empties ``done`` once its slots are
    passed, and reads ``cancels``, ``rolled``, ``done_until_ms``, ``enqueue_offset`` and ``cp_read``; it calls
    ``checkpoint`` (Recovery's) to keep the checkpoint within half the wheel, and counts ``stats``."""

    def __init__(self, store, config: TimerConfig, files: TimerFiles, state: TimerState, stats: TimerStats,
                 metrics, checkpoint: Callable[[], None]):
        super().__init__(store, config, files, state, stats)
        self.metrics = metrics
        self._checkpoint = checkpoint
        self._current: delivery.DueUnits | None = None  # the read slot's units left, by due time
        self._slot_done: set[int] = set()  # delivered from the read slot (a retried step skips them)
        self._next_jump_check = 0

    def _take(self, units: list[Unit]) -> None:
        """Units of the read slot into the in-memory queue by due time (delivery.DueUnits)."""
        self._current.take(units)

    def _dequeue(self, now: int) -> int:
        """Deliver what is due; ms until something may be due next."""
        for _ in range(MAX_SLOTS_PER_STEP):
            if now < self.state.read_ms:
                return self.state.read_ms - now
            if self._current is None:
                self._current = delivery.DueUnits()
                self._take(self.files.units(self.state.read_ms))
            heap = self._current
            due = heap.pop_due(now, DELIVER_BATCH)
            if due:
                try:
                    self._deliver(due, now)
                except BaseException:  # retried by the duty: the units stay (the delivered ones are skipped)
                    self._take(due)
                    raise
                if heap:
                    return 0
                continue
            if heap:
                return heap.first_due() - now
            if now < self.state.read_ms + self.precision:
                return self.state.read_ms + self.precision - now
            self._next_slot(now)
        return 0

    def _next_slot(self, now: int) -> None:
        self._current = None
        self._slot_done = set()
        self.state.read_ms += self.precision
        # Behind by more than the wheel (a long downtime): once no slot holds a time from here on, the slots
        # left are earlier turns' (empty) and the timer jumps to now; checked once per span read.
        if now - self.state.read_ms > self.config.span_ms and self.state.read_ms >= self._next_jump_check:
            self._next_jump_check = self.state.read_ms + self.config.span_ms
            if (not self.files.pending_from(self.state.read_ms)
                    and self.state.enqueue_offset >= topic_bounds(self.store)[1]):
                log.info("timer.caught_up", skipped_to=self.files.slot_ms(now), from_ms=self.state.read_ms)
                self.state.read_ms = self.files.slot_ms(now)
        # Until the slots the last run may have read are passed, their deliveries may lie below today's log end:
        # a checkpoint then keeps the recovery's start (where its scan began) as the place to read from.
        if self.state.read_ms > self.state.done_until_ms:
            self.state.done = set()
            self.state.read_log_end = self.store.log_end()
        self.state.advances.append((self.state.read_ms, self.state.read_log_end))
        if self.state.read_ms - self.state.cp_read >= self.config.span_ms // 2:
            self._checkpoint()  # keeps the live slots within one turn (see _add)

    def _deliver(self, units: list[Unit], now: int) -> None:
        """Append the copies (or roll records) of ``units``, batched per topic in order. A copy to a topic that is
        not a compaction topic is made from the timer record's bytes, the run's in one pass (delivery.copies: its
        body and CRC as stored, its properties written once); any other, or where that declines, by :meth:`_made`."""
        made = delivery.copies(self.store, units, now)
        batches: list[list] = []  # [topic, copies, units, body bytes]
        copyable: dict[str, bool] = {}
        for unit, got in zip(units, made, strict=True):
            offset = unit.timer_offset
            if offset in self.state.done or offset in self._slot_done or offset in self.state.rolled:
                self.stats.skipped_done += 1
                self.stats.pending -= 1
                continue
            if got is not None:
                topic = got[0]
                if topic not in copyable:
                    copyable[topic] = self._copyable(topic)
                if not copyable[topic]:
                    got = None
            if got is None:
                got = self._made(unit, now, copyable)
                if got is None:
                    continue
            topic, origin, copy = got
            if origin in self.state.cancels:
                log.info("timer.cancelled", timer_offset=offset, origin=origin)
                self.stats.cancelled += 1
                self.stats.pending -= 1
                self._slot_done.add(offset)
                continue
            kind = type(copy)
            last = batches[-1] if batches else None
            if (last is not None and last[0] == topic and type(last[1][0]) is kind
                    and self._fits(len(last[1]), last[3] + len(copy.body))):
                last[1].append(copy)
                last[2].append(unit)
                last[3] += len(copy.body)
            else:
                batches.append([topic, [copy], [unit], len(copy.body)])
        for topic, copies, batch_units, _ in batches:
            self._append(topic, Copies(copies) if type(copies[0]) is Copy else copies, batch_units, now)

    def _made(self, unit: Unit, now: int, copyable: dict[str, bool]) -> tuple | None:
        """(topic, origin, the copy or roll record) of ``unit`` the reference way (the record looked up, a copy
        from its bytes where the topic allows, else decoded: messages.delivered_copy, delivered, rolled); None
        for a record that is gone (counted as dropped)."""
        found, missing = delivery.lookup(self.store, unit.physical_offset)
        if found is None:
            log.error("timer.record_missing", timer_offset=unit.timer_offset, why=missing)
            self.stats.dropped += 1
            self.stats.pending -= 1
            return None
        props = found.properties
        real, origin = props.get(tm.REAL_TOPIC), int(props.get(tm.ORIGIN, unit.timer_offset))
        if origin in self.state.cancels:
            return None, origin, None  # cancelled: the caller counts it
        if unit.kind == KIND_DELIVER and type(found) is record_reader.RecordView:
            if real not in copyable:
                copyable[real] = self._copyable(real)
            made = tm.delivered_copy(found, props, unit.timer_offset, now) if copyable[real] else None
            if made is not None:
                return made[0], origin, made[1]
        record = found.decode() if type(found) is record_reader.RecordView else found
        if unit.kind == KIND_ROLL:
            return tm.TIMER_TOPIC, origin, tm.rolled(record, unit.timer_offset)
        topic, copy = tm.delivered(record, unit.timer_offset, now)
        return topic, origin, copy

    def _copyable(self, topic: str | None) -> bool:
        """Whether copies to ``topic`` may be made from the timer record's bytes (it exists and is not a compaction
        topic, whose queue is its key's: those go as MessageIn, as does any copy whose topic is gone, which the
        append then refuses as before)."""
        try:
            return topic is not None and self.store.topic_admin.get(topic).kind != KIND_COMPACTION
        except TopicNotFound:
            return False

    def _fits(self, count: int, body_bytes: int) -> bool:
        """Whether a batch of ``count`` copies may take one more, ``body_bytes`` with it, within the store's batch
        limits (a batch past them would be refused)."""
        cfg = self.store.config
        return count < cfg.max_batch_messages and body_bytes <= cfg.max_batch_body_bytes

    def _append(self, topic: str, copies: list, units: list[Unit], now: int) -> None:
        try:
            if topic == tm.TIMER_TOPIC:
                self.store.append(topic, copies, system_writer=topic_rules.OWNER_SCHEDULE)
            else:
                self.store.append(topic, copies)
        except (TopicNotFound, InvalidArgument) as exc:  # deleted, or re-created with fewer queues: nowhere to go
            log.warning("timer.undeliverable", topic=topic, dropped=len(copies), error=str(exc))
            self.stats.dropped += len(copies)
            self.stats.pending -= len(copies)
            return
        except Exception:
            if self.metrics:
                self.metrics.failures.inc()
            raise
        for unit in units:
            self._slot_done.add(unit.timer_offset)  # a retry of this step after a later batch failed skips it
            if unit.kind == KIND_ROLL:
                self.stats.rolled += 1
                self.stats.pending -= 1  # it comes back as a new record (scheduled again)
                continue
            self.stats.delivered += 1
            self.stats.pending -= 1
            if self.metrics:
                self.metrics.delivered.inc()
                self.metrics.late.observe(max(0, now - unit.deliver_ms) / 1000)
