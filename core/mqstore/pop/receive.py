"""The receive path of pop consumption (consumer.proto's Receive), for PopService.

  (one group+topic at a time: its lock) reserve room in the in-flight set -> read each queue (the topic's,
  then the group's retry topic and, while one exists, its legacy retry topic, whose messages are
  delivered to their owner only: mqstore.pop.legacy; from a rotating start) from the group's pop
  offset (tag filter: the consume queue's tag codes, then the real TAGS; SQL92 filter: each record's
  properties, mqstore.filters; damaged records and offsets outside the queue passed over) ->
  retry copies past max_attempts to the DLQ (append) -> one append of a CK record per queue read ->
  [pop.receive.after_ck] -> entries in flight, pop offsets advanced -> answer. When nothing is ready, wait
  (the store's long-poll slots) until a queue grows, within long_poll_ms and the caller's deadline.

Thread-safe: receives of one group and topic serialise on its lock (striped); the rest is the
PopService's thread-safe parts.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import failpoints, limits
from mqstore import topics as topic_rules
from mqstore.errors import DataLoss, InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from mqstore.model import KIND_COMPACTION, KIND_SYSTEM, StoredMessage, TopicRecord
from mqstore.filters import TAG, Selection, selection
from mqstore.pop import copies, handle as handles, legacy, records, storage
from mqstore.pop.inflight import Entry, Reservation
from mqstore.pop.ordered_read import OrderedReader

log = structlog.get_logger("mqstore.pop")

DEFAULT_BATCH, MAX_BATCH = 32, 1000
MIN_INVISIBLE_MS, MAX_INVISIBLE_MS = 100, 12 * 3600 * 1000
DEFAULT_MAX_ATTEMPTS, MAX_MAX_ATTEMPTS = 17, 1000
DEFAULT_MAX_BYTES, MAX_BYTES = 4 << 20, 8 << 20
MAX_LONG_POLL_MS = 30_000
LONG_POLL_RESERVE_MS = 100  # a long poll ends this long before the caller's deadline, to answer in time
START_EARLIEST, START_LATEST = "earliest", "latest"
_LOCK_STRIPES = 64
_MAX_SKIPS_PER_READ = 16  # damaged records (or a retention jump) passed over in one queue by one receive


@dataclass(frozen=True, slots=True)
class Source:
    kind: int        # records.SOURCE_TOPIC, SOURCE_RETRY or SOURCE_RETRY_LEGACY
    name: str        # the topic or the retry topic
    queue_id: int
    # The retry topic's copies stored below this physical offset (the topic's start_physical_offset) were
    # made for an earlier topic of the name, deleted since: never delivered for this one. 0 for the topic.
    floor: int = 0


@dataclass(slots=True)
class Delivery:
    message: StoredMessage
    topic: str               # the topic received from (also for a retry copy)
    receipt_handle: str
    attempt: int
    visible_at_ms: int


@dataclass(frozen=True, slots=True)
class ReceiveResult:
    deliveries: list[Delivery]
    pop_time_ms: int


@dataclass(frozen=True, slots=True)
class _Read:
    source: Source
    offset: int
    next_offset: int
    deliver: list[StoredMessage]
    # An ordered group's read (mqstore.pop.ordered): the attempt of each message of ``deliver``, the messages
    # held, the entries delivered again in place (claimed), every message's group by queue offset.
    attempts: tuple[int, ...] | None = None
    held: tuple[StoredMessage, ...] = ()
    claimed: tuple[Entry, ...] = ()
    groups: dict[int, str] | None = None

    @property
    def writes_ck(self) -> bool:
        return bool(self.deliver or self.held)


class Receiver:
    def __init__(self, pop):
        """``pop``: the PopService whose store, in-flight set, offsets and counters a receive uses."""
        self.pop = pop
        self.store, self.config, self.clock = pop.store, pop.config, pop.clock
        self.inflight, self.offsets, self.counters = pop.inflight, pop.offsets, pop.counters
        self._locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._rotation = itertools.count()
        self._ordered = OrderedReader(self)

    def receive(self, group: str, topic: str, *, invisible_duration_ms: int, queue_id: int | None = None,
                filter_expression: str = "", filter_type: str = TAG, batch_size: int = 0, long_poll_ms: int = 0,
                max_attempts: int = 0, start: str = START_EARLIEST, max_bytes: int = 0,
                time_left_ms: int | None = None) -> ReceiveResult:
        """Up to ``batch_size`` messages of ``topic`` (and the group's retry topic) for ``group``, waiting up
        to ``long_poll_ms`` (and ``time_left_ms`` - 100 ms, the caller's deadline) when none is ready."""
        topic_rules.validate_group_name(group)
        if queue_id is not None:
            limits.at_least_zero("queue_id", queue_id, "unset = every queue of the topic")
        sources = self.sources(group, self.consumable(topic), queue_id)
        wanted = selection(filter_type, filter_expression)
        batch = limits.within("batch_size", batch_size, 1, MAX_BATCH, default=DEFAULT_BATCH)
        invisible_ms = limits.within("invisible_duration_ms", invisible_duration_ms, MIN_INVISIBLE_MS,
                                     MAX_INVISIBLE_MS)
        attempts = limits.within("max_attempts", max_attempts, 1, MAX_MAX_ATTEMPTS, default=DEFAULT_MAX_ATTEMPTS)
        if start not in (START_EARLIEST, START_LATEST):
            raise InvalidArgument(f"start must be {START_EARLIEST!r} or {START_LATEST!r}, not {start!r}")
        byte_budget = limits.limit("max_bytes", max_bytes, default=DEFAULT_MAX_BYTES, maximum=MAX_BYTES)
        wait_ms = limits.limit("long_poll_ms", long_poll_ms, default=0, maximum=MAX_LONG_POLL_MS)
        if time_left_ms is not None:
            wait_ms = max(0, min(wait_ms, time_left_ms - LONG_POLL_RESERVE_MS))
        give_up_s = self.clock.monotonic_s() + wait_ms / 1000
        names = [(s.name, s.queue_id) for s in sources]
        while True:
            seen = storage.max_offsets(self.store, names)
            deliveries = self._pop_once(group, topic, sources, wanted, batch, invisible_ms, attempts, start,
                                        byte_budget)
            left_ms = int((give_up_s - self.clock.monotonic_s()) * 1000)
            if deliveries or left_ms <= 0:
                pop_time_ms = deliveries[0].visible_at_ms - invisible_ms if deliveries else self.clock.now_ms()
                return ReceiveResult(deliveries, pop_time_ms)
            ready = self._grown(names, seen)
            if self.pop.settings.get(group).ordered:
                ready = self._ordered.freed(group, topic, ready)
            arrived = self.store.wait_for_messages(ready, left_ms)
            if not arrived:  # the time is up, the waiting slots are taken, or the store is stopping
                return ReceiveResult([], self.clock.now_ms())

    def _grown(self, names: list[tuple[str, int]], seen: list[int]) -> Callable[[], bool]:
        """Whether any of the queues ``names`` holds more than ``seen`` (the long poll's condition)."""
        store, max_offsets = self.store, storage.max_offsets
        return lambda: any(now > before for now, before in zip(max_offsets(store, names), seen, strict=True))

    def consumable(self, topic: str) -> TopicRecord:
        rec = self.store.topic_admin.get(topic)
        if rec.kind == KIND_SYSTEM or topic_rules.is_pop_owned_topic(topic):
            raise InvalidArgument(f"topic {topic!r} is a system, retry or dead-letter topic: receive from the topic "
                                  f"itself (its retry topic is read with it); read dead letters with Pull")
        if rec.kind == KIND_COMPACTION:
            raise InvalidArgument(f"topic {topic!r} is a COMPACTION topic: pop consumption is for NORMAL topics; "
                                  f"read it with Pull or the Compactor")
        return rec

    def sources(self, group: str, rec: TopicRecord, queue_id: int | None) -> list[Source]:
        """The queues a receive of ``group`` reads: the topic's, its retry topic, and its legacy retry
        topic while one exists (mqstore.pop.legacy)."""
        retry = topic_rules.retry_topic(group, rec.name)
        if queue_id is None:
            queue_ids = range(rec.queue_count)
        elif 0 <= queue_id < rec.queue_count:
            queue_ids = (queue_id,)
        else:
            raise NotFound(f"topic {rec.name!r} has queues 0..{rec.queue_count - 1}; there is no queue {queue_id}")
        out = [Source(records.SOURCE_TOPIC, rec.name, q) for q in queue_ids] + [
            Source(records.SOURCE_RETRY, retry, 0, rec.start_physical_offset)]
        legacy_name = topic_rules.legacy_retry_topic(group, rec.name)
        if self.store.topics.start_of(legacy_name) is not None:
            out.append(Source(records.SOURCE_RETRY_LEGACY, legacy_name, 0, rec.start_physical_offset))
        return out

    def _pop_once(self, group: str, topic: str, sources: list[Source], wanted: Selection, batch: int,
                  invisible_ms: int, max_attempts: int, start: str, byte_budget: int) -> list[Delivery]:
        with self._locks[hash((group, topic)) % _LOCK_STRIPES]:
            reservation = self.inflight.reserve(group, topic, batch)
            room = reservation.remaining
            if not room:
                raise ResourceExhausted(
                    f"group {group!r} has {self.inflight.count(group, topic)} messages of topic {topic!r} in flight "
                    f"(the limit is {self.config.pop_max_in_flight} a group and topic, "
                    f"{self.config.pop_max_in_flight_total} in all, server settings pop_max_in_flight(_total)); "
                    f"ack them or let their invisible time pass")
            taken = 0
            in_order = self.pop.settings.get(group).ordered
            try:
                shift = next(self._rotation) % len(sources)
                reads, dead = [], []
                for source in sources[shift:] + sources[:shift]:
                    if taken >= room or byte_budget <= 0:
                        break
                    if in_order and source.kind == records.SOURCE_TOPIC:
                        read, late = self._read_in_order(group, topic, source, wanted, room - taken, byte_budget,
                                                         start), []
                    else:
                        read, late = self._read(group, topic, source, wanted, room - taken, byte_budget,
                                                max_attempts, start)
                    if read is not None:
                        reads.append(read)
                        dead += [(m, source) for m in late]
                        taken += len(read.deliver)
                        byte_budget -= sum(m.record.size for m in read.deliver)
                if dead:
                    self._dead_letter_late(group, topic, dead)
                return self._put_in_flight(group, topic, reads, invisible_ms, max_attempts, reservation)
            except BaseException:
                for read in reads:
                    self.inflight.release(list(read.claimed))
                raise
            finally:
                self.inflight.unreserve(reservation)

    def _read(self, group: str, topic: str, source: Source, wanted: Selection, room: int, byte_budget: int,
              max_attempts: int, start: str) -> tuple[_Read | None, list[StoredMessage]]:
        """One queue from the group's pop offset: (what to deliver, retry copies past max_attempts). A
        legacy retry topic's messages of another group or topic are passed over (mqstore.pop.legacy)."""
        key = (group, source.name, source.queue_id)
        pulled = self.pull_queue(group, source, key, wanted, room, byte_budget, start)
        if pulled is None:
            return None, []
        offset, result = pulled
        deliver, late, stale, foreign = [], [], 0, 0
        for m in result.messages:
            if m.record.physical_offset < source.floor:
                stale += 1  # a copy for the topic's earlier incarnation: passed over, as a filtered message is
                continue
            legacy_source = source.kind == records.SOURCE_RETRY_LEGACY
            if legacy_source and legacy.owner(self.store, source.name, m) != (group, topic):
                foreign += 1  # another group's and topic's, under the same legacy name: never this group's
                continue
            (late if m.record.reconsume_times + 1 > max_attempts else deliver).append(m)
        if stale:
            log.info("pop.stale_retry_copies_skipped", group=group, topic=source.name, count=stale,
                     topic_start_physical_offset=source.floor)
        self.counters.add(filtered=result.next_offset - offset - len(result.messages) + stale + foreign)
        if result.next_offset == offset:
            return None, []
        return _Read(source, offset, result.next_offset, deliver), late

    def _read_in_order(self, group: str, topic: str, source: Source, wanted: Selection, room: int,
                       byte_budget: int, start: str) -> _Read | None:
        """One queue of an ordered group (mqstore.pop.ordered_read)."""
        o = self._ordered.read(group, topic, source, wanted, room, byte_budget, start)
        return None if o is None else _Read(source, o.offset, o.next_offset, o.deliver, o.attempts, o.held,
                                            o.claimed, o.groups)

    def pull_queue(self, group: str, source: Source, key, wanted: Selection, count: int, byte_budget: int,
              start: str):
        """(the offset read from, the Pull's result) of one queue from the group's pop offset, past damaged
        records and retention; None when there is nothing to read (no retry topic, damage after damage)."""
        try:
            offset = self.offsets.get(key, lambda: self._initial_offset(source, start))
        except NotFound:
            return None  # the retry topic does not exist yet
        for _ in range(_MAX_SKIPS_PER_READ):
            try:
                result = self.store.pull(source.name, source.queue_id, offset, count, byte_budget, wanted[0],
                                         selector=wanted[1])
                break
            except NotFound:
                return None  # the retry topic was deleted since (it comes back with the next redelivery)
            except OutOfRange as exc:
                if exc.min_value is None or exc.max_value is None:
                    raise
                # Behind the queue's start: retention removed messages never received. Past its end: the
                # topic was deleted and created again. Either way the queue's first message is next.
                log.warning("pop.offset_outside_queue", group=group, topic=source.name, queue_id=source.queue_id,
                            offset=offset, min_offset=exc.min_value, max_offset=exc.max_value)
                offset = exc.min_value
                self.offsets.reset(key, offset)
                continue
            except DataLoss as exc:
                bad = exc.queue_offset if exc.queue_offset is not None else offset
                log.error("pop.damaged_skipped", group=group, topic=source.name, queue_id=source.queue_id,
                          queue_offset=bad, physical_offset=exc.physical_offset, error=str(exc))
                self.counters.add(damaged_skipped=1)
                offset = bad + 1
                self.offsets.advance(key, offset)  # past what cannot be delivered, before the next try
        else:
            return None  # damage after damage: the next receive goes on from here
        return offset, result

    def _initial_offset(self, source: Source, start: str) -> int:
        info = self.store.queue_info(source.name, source.queue_id)
        if source.kind == records.SOURCE_TOPIC and start == START_LATEST:
            return info.max_offset
        return info.min_offset

    def _dead_letter_late(self, group: str, topic: str, dead: list[tuple[StoredMessage, Source]]) -> None:
        """Retry copies whose attempts ran out under this receive's max_attempts go to the DLQ unseen."""
        dlq = storage.ensure_topic(self.store, topic_rules.dlq_topic(group)).name
        self.pop.append_copies(dlq, [copies.dead_letter_copy(m, topic) for m, _ in dead])
        self.counters.add(dead_lettered=len(dead))

    def _put_in_flight(self, group: str, topic: str, reads: list[_Read], invisible_ms: int, max_attempts: int,
                       reservation: Reservation) -> list[Delivery]:
        now = self.clock.now_ms()
        visible_at = now + invisible_ms
        cks = [_checkpoint(group, topic, r, max_attempts, now, visible_at) for r in reads if r.writes_ck]
        deliveries: list[Delivery] = []
        with self.inflight.appending(self.pop.revive_end()):
            results = self.pop.append_records([(records.TAG_CK, records.encode_ck(ck)) for ck in cks]) if cks else []
            failpoints.hit("pop.receive.after_ck")
            by_source = dict(zip([r.source for r in reads if r.writes_ck], zip(cks, results, strict=True),
                                 strict=True))
            for read in reads:
                key = (group, read.source.name, read.source.queue_id)
                if not read.writes_ck:
                    self.offsets.advance(key, read.next_offset)
                    continue
                ck, result = by_source[read.source]
                self.inflight.add(ck, result.physical_offset, result.queue_offset, reservation=reservation,
                                  message_groups=read.groups)
                self.offsets.advance(key, read.next_offset, result.physical_offset + result.size_bytes,
                                     result.queue_offset)
                for m, entry in zip(read.deliver, ck.entries[:len(read.deliver)], strict=True):
                    h = handles.ReceiptHandle(read.source.kind, read.source.queue_id, entry.queue_offset,
                                              result.physical_offset, visible_at, entry.attempt)
                    deliveries.append(Delivery(m, topic, handles.encode(group, topic, h), entry.attempt, visible_at))
        self.counters.add(received=len(deliveries))
        return deliveries


def _checkpoint(group: str, topic: str, read: _Read, max_attempts: int, now: int,
                visible_at: int) -> records.Checkpoint:
    """The CK of one read: its delivered messages (then, for an ordered group, its held ones, attempt 0)."""
    attempts = read.attempts or tuple(m.record.reconsume_times + 1 for m in read.deliver)
    entries = [records.CkEntry(m.record.queue_offset, m.record.physical_offset, attempt)
               for m, attempt in zip(read.deliver, attempts, strict=True)]
    entries += [records.CkEntry(m.record.queue_offset, m.record.physical_offset, 0) for m in read.held]
    return records.Checkpoint(group, topic, read.source.kind, read.source.queue_id, max_attempts, now, visible_at,
                              read.next_offset, tuple(entries), ordered=read.attempts is not None)

