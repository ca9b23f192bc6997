"""PopService: receive, ack, change of invisible time and forward to the DLQ (consumer.proto's contract),
on a running MessageStore in the same process.

  receive   (one group+topic at a time: its lock) reserve room in the in-flight set -> read each queue
            from its pop offset (tag filter: the consume queue's tag codes, then the real TAGS) -> retry
            copies past max_attempts to the DLQ (append) -> one append of a CK record per queue read ->
            [pop.receive.after_ck] -> entries in flight, pop offsets advanced -> answer
  ack       check each handle, claim its entry -> one ACK record -> [pop.ack.after_record] -> entries gone
  change    claim -> a new CK for the message -> the entry is the new CK's (the old handle stops working)
  forward   claim -> the DLQ copy -> ACK record -> entry gone

The revive duty (mqstore.pop.revive) redelivers expired entries and stores offsets and the checkpoint.

Thread-safe: receives of one group and topic serialise on its lock (striped); the in-flight set and the
pop offsets are thread-safe; every durable step is a MessageStore.append (thread-safe).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import structlog

from mqstore import failpoints
from mqstore import topics as topic_rules
from mqstore.clock import Clock
from mqstore.errors import (DataLoss, FailedPrecondition, InvalidArgument, MqStoreError, NotFound, OutOfRange,
                            ResourceExhausted, Unavailable)
from mqstore.model import KIND_COMPACTION, KIND_SYSTEM, AppendResult, MessageIn, StoredMessage, TopicRecord
from mqstore.pop import copies, handle as handles, records, tag_filter
from mqstore.pop.config import PopConfig
from mqstore.pop.counters import PopCounters
from mqstore.pop.inflight import EXPIRED, OK, Entry, InFlightTable, MsgKey, Reservation
from mqstore.pop.offsets import PopOffsets
from mqstore.pop.replay import replay
from mqstore.pop.revive import REVIVE_GROUP, Reviver

log = structlog.get_logger("mqstore.pop")

DEFAULT_BATCH, MAX_BATCH = 32, 1000
MIN_INVISIBLE_MS, MAX_INVISIBLE_MS = 100, 12 * 3600 * 1000
DEFAULT_MAX_ATTEMPTS, MAX_MAX_ATTEMPTS = 17, 1000
DEFAULT_MAX_BYTES, MAX_BYTES = 4 << 20, 8 << 20
MAX_LONG_POLL_MS = 30_000
LONG_POLL_RESERVE_MS = 100  # a long poll ends this long before the caller's deadline, to answer in time
MAX_ACK_HANDLES = 1000
START_EARLIEST, START_LATEST = "earliest", "latest"
_LOCK_STRIPES = 64
_MAX_SKIPS_PER_READ = 16  # damaged records (or a retention jump) passed over in one queue by one receive


@dataclass(frozen=True, slots=True)
class Source:
    kind: int        # records.SOURCE_TOPIC or SOURCE_RETRY
    name: str        # the topic or the retry topic
    queue_id: int


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
class AckOutcome:
    receipt_handle: str
    status: str              # "ok", "expired", "not_in_flight", "invalid"
    message: str = ""


@dataclass(frozen=True, slots=True)
class AckResult:
    outcomes: list[AckOutcome]
    durability: str          # of the ACK record; "" when no handle was acked


@dataclass(frozen=True, slots=True)
class ChangeResult:
    receipt_handle: str
    visible_at_ms: int
    attempt: int


@dataclass(frozen=True, slots=True)
class _Read:
    source: Source
    offset: int
    next_offset: int
    deliver: list[StoredMessage]


class PopService:
    def __init__(self, store, config: PopConfig, clock: Clock | None = None):
        """``store``: a started mqstore.store.MessageStore (append with ``system_writer``, pull, get_message,
        queue facts, offsets)."""
        self.store = store
        self.config = config
        self.clock = clock or store.clock
        self.inflight = InFlightTable(config.pop_max_in_flight, config.pop_max_in_flight_total)
        self.offsets = PopOffsets(self._stored_offset)
        self.counters = PopCounters()
        self._locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._rotation = itertools.count()
        self.reviver = Reviver(self)
        self.started = False

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self, *, run_duty: bool = True) -> None:
        """Rebuild the in-flight set and pop offsets from the revive log, then serve (and, with ``run_duty``,
        start the revive duty; tests of a fake clock drive :attr:`reviver` themselves)."""
        self.reviver.revive_offset = replay(self, REVIVE_GROUP)
        self.started = True
        if run_duty:
            self.reviver.start()
        log.info("pop.started", in_flight=len(self.inflight), revive_offset=self.reviver.revive_offset)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and the duty, then store the offsets and the checkpoint (a failure is logged: the
        revive log still holds everything, and the next start replays more of it)."""
        if not self.started:
            return
        self.started = False
        self.reviver.stop(timeout_s)
        try:
            self.reviver.flush()
        except (MqStoreError, OSError) as exc:
            log.warning("pop.final_flush_failed", error=f"{type(exc).__name__}: {exc}",
                        consequence="the next start replays the revive log from the older checkpoint")

    def halt(self) -> None:
        """Stop like a crash (tests): no final flush."""
        self.started = False
        self.reviver.stop(5.0)

    def health_problem(self) -> str | None:
        return self.reviver.problem() or None

    # ---- receive ---------------------------------------------------------------------------------------
    def receive(self, group: str, topic: str, *, invisible_duration_ms: int, queue_id: int | None = None,
                filter_expression: str = "", batch_size: int = 0, long_poll_ms: int = 0, max_attempts: int = 0,
                start: str = START_EARLIEST, max_bytes: int = 0, time_left_ms: int | None = None) -> ReceiveResult:
        """Up to ``batch_size`` messages of ``topic`` (and the group's retry topic) for ``group``, waiting up
        to ``long_poll_ms`` (and ``time_left_ms`` - 100 ms, the caller's deadline) when none is ready."""
        self._check_started()
        topic_rules.validate_group_name(group)
        sources = self.sources(group, self._consumable(topic), queue_id)
        tags = tag_filter.parse(filter_expression)
        batch = _in_range("batch_size", batch_size or DEFAULT_BATCH, 1, MAX_BATCH)
        invisible_ms = _in_range("invisible_duration_ms", invisible_duration_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        attempts = _in_range("max_attempts", max_attempts or DEFAULT_MAX_ATTEMPTS, 1, MAX_MAX_ATTEMPTS)
        if start not in (START_EARLIEST, START_LATEST):
            raise InvalidArgument(f"start must be {START_EARLIEST!r} or {START_LATEST!r}, not {start!r}")
        byte_budget = min(max_bytes if max_bytes > 0 else DEFAULT_MAX_BYTES, MAX_BYTES)
        wait_ms = min(max(long_poll_ms, 0), MAX_LONG_POLL_MS)
        if time_left_ms is not None:
            wait_ms = max(0, min(wait_ms, time_left_ms - LONG_POLL_RESERVE_MS))
        give_up_s = self.clock.monotonic_s() + wait_ms / 1000
        names = [(s.name, s.queue_id) for s in sources]
        while True:
            seen = self.store.max_offsets(names)
            deliveries = self._pop_once(group, topic, sources, tags, batch, invisible_ms, attempts, start,
                                        byte_budget)
            left_ms = int((give_up_s - self.clock.monotonic_s()) * 1000)
            if deliveries or left_ms <= 0:
                pop_time_ms = deliveries[0].visible_at_ms - invisible_ms if deliveries else self.clock.now_ms()
                return ReceiveResult(deliveries, pop_time_ms)
            arrived = self.store.wait_for_messages(self._grown(names, seen), left_ms)
            if not arrived:  # the time is up, the waiting slots are taken, or the store is stopping
                return ReceiveResult([], self.clock.now_ms())

    def _grown(self, names: list[tuple[str, int]], seen: list[int]) -> Callable[[], bool]:
        """Whether any of the queues ``names`` holds more than ``seen`` (the long poll's condition)."""
        max_offsets = self.store.max_offsets
        return lambda: any(now > before for now, before in zip(max_offsets(names), seen, strict=True))

    def _consumable(self, topic: str) -> TopicRecord:
        rec = self.store.topic(topic)
        if rec.kind == KIND_SYSTEM or topic_rules.is_pop_owned_topic(topic):
            raise InvalidArgument(f"topic {topic!r} is a system, retry or dead-letter topic: receive from the topic "
                                  f"itself (its retry topic is read with it); read dead letters with Pull")
        if rec.kind == KIND_COMPACTION:
            raise InvalidArgument(f"topic {topic!r} is a COMPACTION topic: pop consumption is for NORMAL topics; "
                                  f"read it with Pull or the Compactor")
        return rec

    def sources(self, group: str, rec: TopicRecord, queue_id: int | None) -> list[Source]:
        retry = topic_rules.retry_topic(group, rec.name)
        if queue_id is None:
            queue_ids = range(rec.queue_count)
        elif 0 <= queue_id < rec.queue_count:
            queue_ids = (queue_id,)
        else:
            raise NotFound(f"topic {rec.name!r} has queues 0..{rec.queue_count - 1}; there is no queue {queue_id}")
        return [Source(records.SOURCE_TOPIC, rec.name, q) for q in queue_ids] + [Source(records.SOURCE_RETRY, retry, 0)]

    def _pop_once(self, group: str, topic: str, sources: list[Source], tags: tuple[str, ...], batch: int,
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
            try:
                shift = next(self._rotation) % len(sources)
                reads, dead = [], []
                for source in sources[shift:] + sources[:shift]:
                    if taken >= room or byte_budget <= 0:
                        break
                    read, late = self._read(group, source, tags, room - taken, byte_budget, max_attempts, start)
                    if read is not None:
                        reads.append(read)
                        dead += [(m, source) for m in late]
                        taken += len(read.deliver)
                        byte_budget -= sum(m.record.size for m in read.deliver)
                if dead:
                    self._dead_letter_late(group, topic, dead)
                return self._put_in_flight(group, topic, reads, invisible_ms, max_attempts, reservation)
            finally:
                self.inflight.unreserve(reservation)

    def _read(self, group: str, source: Source, tags: tuple[str, ...], room: int, byte_budget: int,
              max_attempts: int, start: str) -> tuple[_Read | None, list[StoredMessage]]:
        """One queue from the group's pop offset: (what to deliver, retry copies past max_attempts)."""
        key = (group, source.name, source.queue_id)
        try:
            offset = self.offsets.get(key, lambda: self._initial_offset(source, start))
        except NotFound:
            return None, []  # the retry topic does not exist yet
        for _ in range(_MAX_SKIPS_PER_READ):
            try:
                result = self.store.pull(source.name, source.queue_id, offset, room, byte_budget, tags)
                break
            except OutOfRange as exc:
                if exc.min_value is None or offset >= exc.min_value:
                    raise
                log.warning("pop.offset_behind_retention", group=group, topic=source.name,
                            queue_id=source.queue_id, offset=offset, min_offset=exc.min_value)
                offset = exc.min_value
            except DataLoss as exc:
                bad = exc.queue_offset if exc.queue_offset is not None else offset
                log.error("pop.damaged_skipped", group=group, topic=source.name, queue_id=source.queue_id,
                          queue_offset=bad, physical_offset=exc.physical_offset, error=str(exc))
                self.counters.add(damaged_skipped=1)
                offset = bad + 1
            self.offsets.advance(key, offset)  # past what cannot be delivered, before the next try
        else:
            return None, []  # damage after damage: the next receive goes on from here
        deliver, late = [], []
        for m in result.messages:
            (late if m.record.reconsume_times + 1 > max_attempts else deliver).append(m)
        self.counters.add(filtered=result.next_offset - offset - len(result.messages))
        if result.next_offset == offset:
            return None, []
        return _Read(source, offset, result.next_offset, deliver), late

    def _initial_offset(self, source: Source, start: str) -> int:
        info = self.store.queue_info(source.name, source.queue_id)
        if source.kind == records.SOURCE_TOPIC and start == START_LATEST:
            return info.max_offset
        return info.min_offset

    def _dead_letter_late(self, group: str, topic: str, dead: list[tuple[StoredMessage, Source]]) -> None:
        """Retry copies whose attempts ran out under this receive's max_attempts go to the DLQ unseen."""
        dlq = self.store.ensure_pop_topic(topic_rules.dlq_topic(group)).name
        self.append_copies(dlq, [copies.dead_letter_copy(m, topic) for m, _ in dead])
        self.counters.add(dead_lettered=len(dead))

    def _put_in_flight(self, group: str, topic: str, reads: list[_Read], invisible_ms: int, max_attempts: int,
                       reservation: Reservation) -> list[Delivery]:
        now = self.clock.now_ms()
        visible_at = now + invisible_ms
        cks = [records.Checkpoint(group, topic, r.source.kind, r.source.queue_id, max_attempts, now, visible_at,
                                  r.next_offset,
                                  tuple(records.CkEntry(m.record.queue_offset, m.record.physical_offset,
                                                        m.record.reconsume_times + 1) for m in r.deliver))
               for r in reads if r.deliver]
        deliveries: list[Delivery] = []
        with self.inflight.appending(self.revive_end()):
            results = self._append_records([(records.TAG_CK, records.encode_ck(ck)) for ck in cks]) if cks else []
            failpoints.hit("pop.receive.after_ck")
            by_source = dict(zip([r.source for r in reads if r.deliver], zip(cks, results, strict=True), strict=True))
            for read in reads:
                key = (group, read.source.name, read.source.queue_id)
                if not read.deliver:
                    self.offsets.advance(key, read.next_offset)
                    continue
                ck, result = by_source[read.source]
                self.inflight.add(ck, result.physical_offset, result.queue_offset, reservation=reservation)
                self.offsets.advance(key, read.next_offset, result.physical_offset + result.size_bytes,
                                     result.queue_offset)
                for m, entry in zip(read.deliver, ck.entries, strict=True):
                    h = handles.ReceiptHandle(read.source.kind, read.source.queue_id, entry.queue_offset,
                                              result.physical_offset, visible_at, entry.attempt)
                    deliveries.append(Delivery(m, topic, handles.encode(group, topic, h), entry.attempt, visible_at))
        self.counters.add(received=len(deliveries))
        return deliveries

    # ---- ack, change, forward --------------------------------------------------------------------------
    def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> AckResult:
        self._check_started()
        self._check_names(group, topic)
        if not 1 <= len(receipt_handles) <= MAX_ACK_HANDLES:
            raise InvalidArgument(f"receipt_handles: give 1 to {MAX_ACK_HANDLES} handles, not {len(receipt_handles)}")
        now = self.clock.now_ms()
        outcomes: list[AckOutcome | None] = []
        claimed: list[tuple[int, Entry]] = []
        for text in receipt_handles:
            try:
                h = handles.decode(group, topic, text)
            except InvalidArgument as exc:
                outcomes.append(AckOutcome(text, "invalid", str(exc)))
                continue
            status, entry = self.inflight.claim(_key(group, topic, h), h.ck_id, now)
            if status == OK:
                claimed.append((len(outcomes), entry))
                outcomes.append(None)
            else:
                outcomes.append(AckOutcome(text, status, _why_not(status, h)))
        durability = ""
        if claimed:
            entries = [entry for _, entry in claimed]
            durability = self.end_entries(entries, records.REASON_ACKED, "pop.ack.after_record").durability
            for index, _ in claimed:
                outcomes[index] = AckOutcome(receipt_handles[index], "ok")
        failed = sum(1 for o in outcomes if o.status != "ok")
        self.counters.add(acked=len(claimed), ack_failures=failed)
        return AckResult(outcomes, durability)

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str,
                                  invisible_duration_ms: int) -> ChangeResult:
        self._check_started()
        self._check_names(group, topic)
        invisible_ms = _in_range("invisible_duration_ms", invisible_duration_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        h = handles.decode(group, topic, receipt_handle)
        entry = self._claim_or_raise(group, topic, h)
        now = self.clock.now_ms()
        ck = records.Checkpoint(group, topic, h.source, h.queue_id, entry.max_attempts, now, now + invisible_ms,
                                records.NO_OFFSET_CHANGE,
                                (records.CkEntry(h.queue_offset, entry.physical_offset, entry.attempt),))
        try:
            with self.inflight.appending(self.revive_end()):
                result = self._append_records([(records.TAG_CK, records.encode_ck(ck))])[0]
                failpoints.hit("pop.change.after_ck")
                self.inflight.add(ck, result.physical_offset, result.queue_offset)  # replaces the claimed entry
        except BaseException:
            self.inflight.release([entry])
            raise
        self.counters.add(changed_invisible=1)
        new = handles.ReceiptHandle(h.source, h.queue_id, h.queue_offset, result.physical_offset, ck.visible_at_ms,
                                    entry.attempt)
        return ChangeResult(handles.encode(group, topic, new), ck.visible_at_ms, entry.attempt)

    def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> tuple[str, AppendResult]:
        """Copies the message to %DLQ%{group} and ends its entry: (the DLQ topic, where the copy is)."""
        self._check_started()
        self._check_names(group, topic)
        h = handles.decode(group, topic, receipt_handle)
        entry = self._claim_or_raise(group, topic, h)
        try:
            message = self.store.get_message(entry.physical_offset)
            dlq = self.store.ensure_pop_topic(topic_rules.dlq_topic(group)).name
            result = self.append_copies(dlq, [copies.dead_letter_copy(message, topic)])[0]
        except BaseException:
            self.inflight.release([entry])
            raise
        self.end_entries([entry], records.REASON_DEAD, "pop.forward.after_copy")
        self.counters.add(dead_lettered=1)
        return dlq, result

    def _claim_or_raise(self, group: str, topic: str, h: handles.ReceiptHandle) -> Entry:
        status, entry = self.inflight.claim(_key(group, topic, h), h.ck_id, self.clock.now_ms())
        if status != OK:
            raise FailedPrecondition(_why_not(status, h))
        return entry

    def end_entries(self, entries: list[Entry], reason: int, failpoint: str = "") -> AppendResult:
        """One ACK record for claimed ``entries``, then they leave the in-flight set; a failed append gives
        the claims back (the entries stay in flight) and raises."""
        body = records.encode_ack([records.AckEntry(e.ck_id, e.key[4], reason) for e in entries])
        try:
            result = self._append_records([(records.TAG_ACK, body)])[0]
        except BaseException:
            self.inflight.release(entries)
            raise
        try:
            if failpoint:
                failpoints.hit(failpoint)
        finally:  # the ACK record is appended: the entries end, whatever a test's failpoint does
            self.inflight.remove(entries)
        return result

    # ---- appends ---------------------------------------------------------------------------------------
    def _append_records(self, bodies: list[tuple[str, bytes]]) -> list[AppendResult]:
        """Records of the revive topic (tag, body), in one append."""
        messages = [MessageIn(body=body, tags=tag) for tag, body in bodies]
        return list(self.store.append(topic_rules.REVIVE_TOPIC, messages, system_writer=topic_rules.OWNER_POP))

    def append_copies(self, topic: str, messages: list[MessageIn]) -> list[AppendResult]:
        """``messages`` in appends that each fit the store's batch limits (count and body bytes)."""
        limit_count = self.store.config.max_batch_messages
        limit_bytes = self.store.config.max_batch_body_bytes
        out: list[AppendResult] = []
        chunk: list[MessageIn] = []
        chunk_bytes = 0
        for m in messages:
            if chunk and (len(chunk) >= limit_count or chunk_bytes + len(m.body) > limit_bytes):
                out += self.store.append(topic, chunk, system_writer=topic_rules.OWNER_POP)
                chunk, chunk_bytes = [], 0
            chunk.append(m)
            chunk_bytes += len(m.body)
        if chunk:
            out += self.store.append(topic, chunk, system_writer=topic_rules.OWNER_POP)
        return out

    # ---- facts -----------------------------------------------------------------------------------------
    def revive_end(self) -> int:
        return self.store.queue_info(topic_rules.REVIVE_TOPIC, 0).max_offset

    def source_name(self, group: str, topic: str, source: int) -> str:
        return topic if source == records.SOURCE_TOPIC else topic_rules.retry_topic(group, topic)

    def _stored_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        try:
            return self.store.query_offset(group, topic, queue_id)
        except NotFound:
            self.store.queue_info(topic, queue_id)  # raises NotFound when the topic itself is missing
            return None

    def _check_names(self, group: str, topic: str) -> None:
        topic_rules.validate_group_name(group)
        topic_rules.validate_topic_name(topic)

    def _check_started(self) -> None:
        if not self.started:
            raise Unavailable("pop consumption is starting or stopping (rebuilding its in-flight set); retry shortly")


def _key(group: str, topic: str, h: handles.ReceiptHandle) -> MsgKey:
    return (group, topic, h.source, h.queue_id, h.queue_offset)


def _why_not(status: str, h: handles.ReceiptHandle) -> str:
    if status == EXPIRED:
        return (f"the receipt handle of {h.describe()} has expired: its invisible time passed, so the message "
                f"will be (or was) delivered again with a new handle; receive it again")
    return (f"no message is in flight under the receipt handle of {h.describe()}: it was acked, given a new handle "
            f"by ChangeInvisibleDuration, moved to the dead-letter topic, or delivered again after it expired")


def _in_range(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(f"{name} is {value}; it must be between {low} and {high}")
    return value
