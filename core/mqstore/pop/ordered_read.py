"""The reads of an ordered group (mqstore.pop.ordered) for mqstore.pop.receive.Receiver: one queue's
waiting entries and its messages from the pop offset, decided by the rule, the entries to hand out again
claimed; and the wake-ups of an ordered group's long poll.

Thread-safety: as the Receiver's (a receive of one group and topic at a time, under its stripe lock); the
in-flight set and the store are thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore.errors import DataLoss, NotFound, OutOfRange
from mqstore.filters import Selection
from mqstore.model import StoredMessage
from mqstore.pop import ordered, records, storage
from mqstore.pop.inflight import Entry

log = structlog.get_logger("mqstore.pop")

MAX_READ = 1000  # messages one ordered read decodes at most (receive.MAX_BATCH)


@dataclass(frozen=True, slots=True)
class OrderedRead:
    offset: int                          # the pop offset read from
    next_offset: int                     # the pop offset after this receive
    deliver: list[StoredMessage]         # handed out: again in place (first), then new, in queue order
    attempts: tuple[int, ...]            # of each message of ``deliver``
    held: tuple[StoredMessage, ...]      # read past the pop offset and held (attempt 0 in the CK)
    claimed: tuple[Entry, ...]           # the entries handed out again (claimed until the CK is in)
    groups: dict[int, str]               # every message's group by queue offset


class OrderedReader:
    def __init__(self, receiver):
        """``receiver``: the mqstore.pop.receive.Receiver whose store, in-flight set, clock and pop offsets
        (its pull_queue) the reads use."""
        self.receiver, self.pop = receiver, receiver.pop
        self.store, self.inflight = receiver.store, receiver.inflight
        self.clock, self.counters = receiver.clock, receiver.counters

    def read(self, group: str, topic: str, source, wanted: Selection, room: int, byte_budget: int,
             start: str) -> OrderedRead | None:
        """One queue (``source``, a mqstore.pop.receive.Source of the topic) of an ordered group: its waiting
        entries handed out again in place and its messages from the pop offset, by the rule
        (mqstore.pop.ordered); the entries to hand out again are claimed."""
        key = (group, source.name, source.queue_id)
        entries = self.inflight.queue_entries(group, topic, source.kind, source.queue_id)
        now = self.clock.now_ms()
        seen = [ordered.Seen(e.key[4], self._message_group(e), e.attempt, e.visible_at_ms, e.busy, e.max_attempts)
                for e in entries]
        held_room = max(0, ordered.MAX_HELD_PER_QUEUE - sum(1 for e in seen if e.attempt == 0))
        pulled = self.receiver.pull_queue(group, source, key, wanted, room, byte_budget, start)
        if pulled is None:
            return None
        offset, result = pulled
        fresh, end, groups, plan = self._scan(source, result, seen, now, room, held_room, byte_budget, wanted)
        by_offset = {e.key[4]: e for e in entries}
        again = [by_offset[o] for o in plan.again]
        claimed = self.inflight.claim_waiting(again, now)
        if len(claimed) != len(again):  # a writer took one since the rule read them: the next receive decides
            self.inflight.release(claimed)
            return None
        try:
            claimed, deliver = self._records_of(group, topic, claimed)
        except BaseException:
            self.inflight.release(claimed)
            raise
        messages = {m.record.queue_offset: m for m in fresh}
        deliver += [messages[o] for o in plan.new]
        next_offset = end if plan.stop_at is None else plan.stop_at
        self.counters.add(filtered=next_offset - offset - sum(1 for o in groups if o < next_offset))
        groups.update((e.key[4], e.message_group or "") for e in claimed)
        attempts = tuple([e.attempt + 1 for e in claimed] + [1] * len(plan.new))
        held = tuple(messages[o] for o in plan.held)
        if not (deliver or held) and next_offset == offset:
            return None
        return OrderedRead(offset, next_offset, deliver, attempts, held, tuple(claimed), groups)

    def _scan(self, source, result, seen: list[ordered.Seen], now: int, room: int, held_room: int,
              byte_budget: int, wanted: Selection):
        """The rule over the first Pull's messages, and more of the queue only while it leaves room and may
        hold more (a room's worth at a time: reading far ahead for the few a batch hands out decodes records in
        vain, the bench's 1,000 groups): (messages read, the offset after them, their groups, the plan)."""
        fresh, end = list(result.messages), result.next_offset
        while True:
            groups = {m.record.queue_offset: ordered.message_group_of(m.record.properties) for m in fresh}
            plan = ordered.plan(seen, list(groups.items()), now, room, held_room)
            if (plan.stop_at is not None or len(plan.again) + len(plan.new) >= room or len(plan.held) >= held_room
                    or len(fresh) + room > MAX_READ):
                return fresh, end, groups, plan
            more = self._pull_more(source, end, room, byte_budget, wanted)
            if more is None:
                return fresh, end, groups, plan
            fresh += more.messages
            end = more.next_offset

    def _records_of(self, group: str, topic: str, claimed: list[Entry]) -> tuple[list[Entry], list[StoredMessage]]:
        """The records of claimed entries to hand out again; one whose record is gone (retention) or damaged
        is ended LOST (logged as pop.lost, as the revive duty does), so that its group goes on."""
        kept, records_, lost = [], [], []
        for entry in claimed:
            try:
                records_.append(self.store.get_message(entry.physical_offset))
                kept.append(entry)
            except (NotFound, OutOfRange, DataLoss) as exc:
                log.error("pop.lost", group=group, topic=topic, source=entry.key[2], queue_id=entry.key[3],
                          queue_offset=entry.key[4], physical_offset=entry.physical_offset, error=str(exc))
                lost.append(entry)
        if lost:
            self.pop.end_entries(lost, records.REASON_LOST)
            self.counters.add(lost=len(lost))
        return kept, records_

    def _pull_more(self, source, offset: int, count: int, byte_budget: int, wanted: Selection):
        """The next window of an ordered read from ``offset`` (past the first): None at the queue's end or on
        any error (the next receive reads from the pop offset and deals with it)."""
        if offset >= storage.max_offsets(self.store, [(source.name, source.queue_id)])[0]:
            return None
        try:
            result = self.store.pull(source.name, source.queue_id, offset, count, byte_budget, wanted[0],
                                     selector=wanted[1])
        except (NotFound, OutOfRange, DataLoss):
            return None
        return result if result.next_offset > offset else None

    def _message_group(self, entry: Entry) -> str:
        """The entry's message group, read from its record once (after a start the set knows none)."""
        if entry.message_group is None:
            try:
                entry.message_group = ordered.message_group_of(
                    self.store.get_message(entry.physical_offset).record.properties)
            except (NotFound, OutOfRange, DataLoss):
                entry.message_group = ""  # gone: delivered again it ends LOST (the revive duty's pop.lost)
        return entry.message_group

    def freed(self, group: str, topic: str, grown: Callable[[], bool]) -> Callable[[], bool]:
        """An ordered group's long poll ends also when one of its messages leaves the in-flight set (an ack,
        a move to the DLQ: its ACK record wakes the poll) or the first in flight expires (to go again in
        place; the poll re-checks at least every 0.5 s): both may free a held message, and no queue grows."""
        inflight, clock = self.inflight, self.clock
        before = inflight.count(group, topic)
        expiry_ms = inflight.next_visible_ms(group, topic, clock.now_ms())
        return lambda: (grown() or inflight.count(group, topic) < before
                        or (expiry_ms is not None and clock.now_ms() >= expiry_ms))
