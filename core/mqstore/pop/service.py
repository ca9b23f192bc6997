"""PopService: receive, ack, change of invisible time and forward to the DLQ (consumer.proto's contract),
on a running MessageStore in the same process.

  receive   mqstore.pop.receive.Receiver: CK records appended, then the messages are in flight
  ack       check each handle, claim its entry -> one ACK record -> [pop.ack.after_record] -> entries gone
  change    claim -> a new CK for the message -> the entry is the new CK's (the old handle stops working)
  forward   claim -> the DLQ copy -> ACK record -> entry gone

The revive duty (mqstore.pop.revive) redelivers expired entries and stores offsets and the checkpoint.

Thread-safe: the in-flight set, the pop offsets and the counters are thread-safe; every durable step is a
MessageStore.append (thread-safe); the Receiver serialises the receives of one group and topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import structlog

from mqstore import failpoints, limits, store_offsets
from mqstore import topics as topic_rules
from mqstore.clock import Clock
from mqstore.errors import FailedPrecondition, InvalidArgument, MqStoreError, NotFound, Unavailable
from mqstore.model import AppendResult, MessageIn
from mqstore.pop import copies, handle as handles, records, storage
from mqstore.pop.config import PopConfig
from mqstore.pop.counters import PopCounters
from mqstore.pop.inflight import EXPIRED, OK, Entry, InFlightTable, MsgKey
from mqstore.pop.offsets import PopOffsets
from mqstore.pop.receive import MAX_BATCH, MAX_INVISIBLE_MS, MIN_INVISIBLE_MS, ReceiveResult, Receiver
from mqstore.pop.replay import reconcile, replay
from mqstore.pop.revive import REVIVE_GROUP, Reviver
from mqstore.pop.settings import GroupSettings, GroupSettingsTable
from mqstore.replication.config import SYNC

log = structlog.get_logger("mqstore.pop")

MAX_ACK_HANDLES = 1000
# Every pop record (CK, ACK, retry and dead-letter copies) waits for the in-sync replicas of a replication
# group, whatever its default: an acknowledged ack must not come back after a failover, nor a received
# message be forgotten (mqstore.pop.leadership). Kafka commits consumer offsets with acks=all likewise.
# One node without replication ignores it.
POP_REPLICATION = SYNC


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


class PopService:
    def __init__(self, store, config: PopConfig, clock: Clock | None = None):
        """``store``: a started mqstore.store.MessageStore (append with ``system_writer``, pull, get_message,
        queue facts, offsets)."""
        self.store = store
        self.config = config
        self.clock = clock or store.clock
        self.inflight = InFlightTable(config.pop_max_in_flight, config.pop_max_in_flight_total)
        self.offsets = PopOffsets(self._stored_offset, store.topics.start_of)
        self.counters = PopCounters()
        self.reviver = Reviver(self)
        self.receiver = Receiver(self)
        self.replication = POP_REPLICATION  # of every pop record (see POP_REPLICATION)
        self.settings = GroupSettingsTable(store, POP_REPLICATION)
        self.started = False

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self, *, run_duty: bool = True) -> None:
        """Rebuild the in-flight set and pop offsets from the revive log, then serve (and, with ``run_duty``,
        start the revive duty; tests of a fake clock drive :attr:`reviver` themselves)."""
        self.reviver.revive_offset = replay(self, REVIVE_GROUP)
        reconcile(self, self.config.pop_revive_batch + MAX_BATCH)
        for group in self.inflight.ordered_groups():  # ordered no more since those CKs: retried as any group's
            if not self.settings.get(group).ordered:
                self.inflight.unorder(group)
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

    # ---- receive ---------------------------------------------------------------------------------------
    def receive(self, group: str, topic: str, **options) -> ReceiveResult:
        """Receive (mqstore.pop.receive.Receiver.receive has the options)."""
        self._check_started()
        return self.receiver.receive(group, topic, **options)

    # ---- group settings --------------------------------------------------------------------------------
    def group_settings(self, group: str) -> GroupSettings:
        self._check_started()
        return self.settings.get(group)

    def set_group_settings(self, group: str, *, ordered: bool) -> GroupSettings:
        """Stores the group's settings (mqstore.pop.settings). A group made unordered has its held and waiting
        messages retried as any group's (copied to its retry topic by the revive duty)."""
        self._check_started()
        settings = self.settings.set(group, ordered=ordered)
        if not ordered and self.inflight.unorder(group):
            self.reviver.wake()
        log.info("pop.group_settings", group=group, ordered=ordered)
        return settings

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
        invisible_ms = limits.within("invisible_duration_ms", invisible_duration_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        h = handles.decode(group, topic, receipt_handle)
        entry = self._claim_or_raise(group, topic, h)
        now = self.clock.now_ms()
        ck = records.Checkpoint(group, topic, h.source, h.queue_id, entry.max_attempts, now, now + invisible_ms,
                                records.NO_OFFSET_CHANGE,
                                (records.CkEntry(h.queue_offset, entry.physical_offset, entry.attempt),),
                                ordered=entry.ordered)
        try:
            with self.inflight.appending(self.revive_end()):
                result = self.append_records([(records.TAG_CK, records.encode_ck(ck))])[0]
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
            dlq = storage.ensure_topic(self.store, topic_rules.dlq_topic(group)).name
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

    def end_entries(self, entries: list[Entry], reason: int, failpoint: str = "", *,
                    release_on_failure: bool = True) -> AppendResult:
        """One ACK record for claimed ``entries``, then they leave the in-flight set; a failed append raises
        and gives the claims back (the entries stay in flight), unless ``release_on_failure`` is false
        (the revive duty keeps them to write their ACK again)."""
        body = records.encode_ack([records.AckEntry(e.ck_id, e.key[4], reason) for e in entries])
        try:
            result = self.append_records([(records.TAG_ACK, body)])[0]
        except BaseException:
            if release_on_failure:
                self.inflight.release(entries)
            raise
        try:
            if failpoint:
                failpoints.hit(failpoint)
        finally:  # the ACK record is appended: the entries end, whatever a test's failpoint does
            self.inflight.remove(entries)
        return result

    # ---- appends ---------------------------------------------------------------------------------------
    def append_records(self, bodies: list[tuple[str, bytes]]) -> list[AppendResult]:
        """Records of the revive topic (tag, body), in one append."""
        messages = [MessageIn(body=body, tags=tag) for tag, body in bodies]
        return list(self.store.append(topic_rules.REVIVE_TOPIC, messages, system_writer=topic_rules.OWNER_POP,
                                      replication=self.replication))

    def append_copies(self, topic: str, messages: list[MessageIn]) -> list[AppendResult]:
        """``messages`` in appends that each fit the store's batch limits (count and body bytes)."""
        out: list[AppendResult] = []
        for chunk in self.chunks(messages, lambda m: len(m.body)):
            out += self.store.append(topic, chunk, system_writer=topic_rules.OWNER_POP, replication=self.replication)
        return out

    def chunks(self, items: list, body_bytes: Callable[[object], int]) -> Iterator[list]:
        """``items`` in runs that fit one append (the store's max_batch_messages and max_batch_body_bytes)."""
        limit_count = self.store.config.max_batch_messages
        limit_bytes = self.store.config.max_batch_body_bytes
        chunk: list = []
        chunk_bytes = 0
        for item in items:
            size = body_bytes(item)
            if chunk and (len(chunk) >= limit_count or chunk_bytes + size > limit_bytes):
                yield chunk
                chunk, chunk_bytes = [], 0
            chunk.append(item)
            chunk_bytes += size
        if chunk:
            yield chunk

    # ---- facts -----------------------------------------------------------------------------------------
    def revive_end(self) -> int:
        return self.store.queue_info(topic_rules.REVIVE_TOPIC, 0).max_offset

    def source_name(self, group: str, topic: str, source: int) -> str:
        """The topic a CK's ``source`` (mqstore.pop.records) of ``group`` and ``topic`` names."""
        if source == records.SOURCE_TOPIC:
            return topic
        if source == records.SOURCE_RETRY_LEGACY:
            return topic_rules.legacy_retry_topic(group, topic)
        return topic_rules.retry_topic(group, topic)

    def _stored_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        try:
            return store_offsets.query_offset(self.store, group, topic, queue_id)
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


