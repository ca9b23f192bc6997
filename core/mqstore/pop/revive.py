"""The revive duty of pop consumption (RocketMQ's PopReviveService): delivers expired messages again and
stores pop offsets and the revive checkpoint.

  revive  claim expired entries (oldest first) -> read each message's record -> per destination (the
          group's retry topic with RECONSUMETIMES + 1, or its DLQ once the max_attempts-th delivery
          expired) one append of the copies -> [pop.revive.after_copy] -> one ACK record for them ->
          entries gone. A crash between the copy and the ACK copies those messages once more after the
          restart (a duplicate, never a loss). A record that is gone (retention) or damaged cannot be
          copied: logged as pop.lost and ended with reason LOST; so is a copy the store refuses
          (pop.copy_refused), rather than holding up every other expiry.
          An ordered group's expired entry with attempts left, or held one, is passed over: a receive
          delivers it again in place (mqstore.pop.ordered); at max_attempts it goes to the DLQ as any.
  flush   every pop_flush_interval_ms: the dirty pop offsets whose CKs are flushed, and the revive
          checkpoint (mqstore.pop.inflight.InFlightTable.low_water, held below any CK whose offset is
          not yet written), in one record of the offsets topic (mqstore.consumer_offsets).

Runs on its own thread (mqstore.background.Duty): a failed append or SQL write is retried with backoff
(the claims are given back, so the entries stay in flight); a bug ends the thread and turns the
commit log's health NOT_SERVING. Tests call :meth:`Reviver.revive_due` and :meth:`Reviver.flush` directly
with an injected clock.
"""

from __future__ import annotations

import collections

import structlog

from mqstore import failpoints
from mqstore import topics as topic_rules
from mqstore.background import Duty
from mqstore.errors import DataLoss, InvalidArgument, NotFound, OutOfRange
from mqstore.model import MessageIn
from mqstore.pop import copies, records, storage
from mqstore.pop.inflight import Entry

log = structlog.get_logger("mqstore.pop.revive")

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"  # the revive checkpoint is this group's offset of the revive topic
_REVIVE_STEPS_BEFORE_FLUSH = 16


def destination_of(entry: Entry) -> tuple[str, int]:
    """Where an expired entry goes: (its group's DLQ, REASON_DEAD) once its max_attempts-th delivery has
    expired, else (the retry topic, REASON_REVIVED)."""
    group, topic = entry.key[0], entry.key[1]
    if entry.attempt >= entry.max_attempts:
        return topic_rules.dlq_topic(group), records.REASON_DEAD
    return topic_rules.retry_topic(group, topic), records.REASON_REVIVED


class Reviver(Duty):
    def __init__(self, pop):
        """``pop``: the PopService whose in-flight set, offsets and appends this duty uses."""
        super().__init__("pop-revive", interval_s=0.0, backoff_initial_s=0.05, backoff_max_s=2.0)
        self.pop = pop
        self.revive_offset = 0  # the checkpoint last stored
        self._owed: list[tuple[list[Entry], int]] = []  # copied (or lost) entries whose ACK is not written yet
        self._last_flush_s = pop.clock.monotonic_s()

    # ---- the duty -------------------------------------------------------------------------------------
    def step(self) -> None:
        for _ in range(_REVIVE_STEPS_BEFORE_FLUSH):  # a long backlog of expiries does not hold up the flush
            if not self.revive_due() or self.stopping:
                break
        if self.pop.clock.monotonic_s() - self._last_flush_s >= self.pop.config.pop_flush_interval_ms / 1000:
            self.flush()

    def pause(self) -> None:
        clock = self.pop.clock
        wait_s = self.pop.config.pop_flush_interval_ms / 1000 - (clock.monotonic_s() - self._last_flush_s)
        expiry_ms = self.pop.inflight.next_expiry_ms()
        if expiry_ms is not None:
            wait_s = min(wait_s, (expiry_ms - clock.now_ms()) / 1000)
        self._wake.wait(min(max(wait_s, 0.001), 1.0))
        self._wake.clear()

    # ---- revive ---------------------------------------------------------------------------------------
    def revive_due(self) -> int:
        """Deliver again (or dead-letter) up to pop_revive_batch expired messages; returns how many were
        ended. Raises when an append fails: entries not copied yet stay in flight (released); entries
        copied whose ACK record failed stay claimed, and the next step writes their ACK first (so a
        failed ACK append never copies a message twice)."""
        self._write_owed_acks()
        pop = self.pop
        claimed = pop.inflight.claim_expired(pop.clock.now_ms(), pop.config.pop_revive_batch)
        if not claimed:
            return 0
        pending = {id(e): e for e in claimed}
        try:
            by_destination, lost = self._copies(claimed)
            self._owe(lost, records.REASON_LOST, pending)
            for (destination, reason), items in by_destination.items():
                name = storage.ensure_topic(pop.store, destination).name
                for chunk in pop.chunks(items, lambda item: len(item[1].body)):
                    copied, refused = self._append(name, chunk)
                    self._owe(refused, records.REASON_LOST, pending)
                    self._owe(copied, reason, pending)
                    failpoints.hit("pop.revive.after_copy")
                    self._write_owed_acks()
        except BaseException:
            pop.inflight.release(list(pending.values()))
            raise
        return len(claimed)

    def _owe(self, entries: list[Entry], reason: int, pending: dict[int, Entry]) -> None:
        """``entries`` are copied (or cannot be): their ACK record is owed; they are no longer pending."""
        if entries:
            self._owed.append((entries, reason))
            for entry in entries:
                del pending[id(entry)]

    def _write_owed_acks(self) -> None:
        while self._owed:
            entries, reason = self._owed[0]
            self._finish(entries, reason)
            self._owed.pop(0)

    def _copies(self, claimed: list[Entry]):
        """({(destination topic, reason): [(entry, copy)]}, [entries whose record cannot be read])."""
        by_destination: dict[tuple[str, int], list[tuple[Entry, MessageIn]]] = collections.defaultdict(list)
        lost: list[Entry] = []
        for entry in claimed:
            group, topic = entry.key[0], entry.key[1]
            try:
                message = self.pop.store.get_message(entry.physical_offset)
            except (NotFound, OutOfRange, DataLoss) as exc:
                log.error("pop.lost", group=group, topic=topic, source=entry.key[2], queue_id=entry.key[3],
                          queue_offset=entry.key[4], physical_offset=entry.physical_offset, error=str(exc))
                lost.append(entry)
                continue
            destination, reason = destination_of(entry)
            if reason == records.REASON_DEAD:
                copy = copies.dead_letter_copy(message, topic)
            else:
                copy = copies.retry_copy(message, topic, delivered=entry.attempt > 0)
            by_destination[(destination, reason)].append(
                (entry, copies.with_marker(copy, entry.ck_id, entry.key[4])))
        return by_destination, lost

    def _append(self, topic: str, items: list[tuple[Entry, MessageIn]]) -> tuple[list[Entry], list[Entry]]:
        """Append the copies: (entries copied, entries whose copy the store refuses). A refused copy (a
        record that grew past a limit with the retry properties, a body over a lowered max_body_bytes)
        would otherwise fail every step again and hold up every other expiry: it is logged as
        pop.copy_refused and ended LOST, and the others are appended one by one."""
        try:
            self.pop.store.append(topic, [copy for _, copy in items], system_writer=topic_rules.OWNER_POP,
                                  replication=self.pop.replication)
            return [entry for entry, _ in items], []
        except InvalidArgument:
            pass  # which copy? one at a time below
        copied, refused = [], []
        for entry, copy in items:
            try:
                self.pop.store.append(topic, [copy], system_writer=topic_rules.OWNER_POP,
                                      replication=self.pop.replication)
            except InvalidArgument as exc:
                log.error("pop.copy_refused", topic=topic, group=entry.key[0], source_topic=entry.key[1],
                          queue_id=entry.key[3], queue_offset=entry.key[4], error=str(exc))
                refused.append(entry)
                continue
            copied.append(entry)
        return copied, refused

    def _finish(self, entries: list[Entry], reason: int) -> None:
        if not entries:
            return
        for start in range(0, len(entries), records.MAX_ACK_ENTRIES):
            self.pop.end_entries(entries[start:start + records.MAX_ACK_ENTRIES], reason, release_on_failure=False)
        counts = {records.REASON_REVIVED: "revived", records.REASON_DEAD: "dead_lettered", records.REASON_LOST: "lost"}
        self.pop.counters.add(**{counts[reason]: len(entries)})

    # ---- offsets and the checkpoint ---------------------------------------------------------------------
    def flush(self) -> None:
        """Store the pop offsets whose CKs are flushed and the revive checkpoint (last), in one record of the
        offsets topic: both or neither."""
        pop = self.pop
        self._last_flush_s = pop.clock.monotonic_s()
        end = pop.revive_end()
        rows, held = pop.offsets.dirty_rows(pop.store.flushed_offset())
        low = pop.inflight.low_water(end)
        if held is not None:
            low = min(low, held)
        rows = self._storable(rows)
        writes = list(rows)
        if low > self.revive_offset:
            writes.append((REVIVE_GROUP, topic_rules.REVIVE_TOPIC, 0, low))
        if not writes:
            return
        storage.commit_offsets(pop.store, writes, pop.replication)
        pop.offsets.written(rows)
        self.revive_offset = max(self.revive_offset, low)

    def _storable(self, rows):
        """The rows whose queue still exists and holds the offset (a topic deleted or re-created since
        the receive would fail the whole transaction); the others are dropped and logged."""
        keep = []
        maxima = storage.max_offsets(self.pop.store, [(topic, queue_id) for _, topic, queue_id, _ in rows])
        for row, max_offset in zip(rows, maxima, strict=True):
            group, topic, queue_id, offset = row
            try:
                self.pop.store.topic_admin.get(topic)
            except NotFound:
                log.warning("pop.offset_dropped", group=group, topic=topic, queue_id=queue_id, offset=offset,
                            reason="topic deleted")
                self.pop.offsets.written([row])
                continue
            if offset > max_offset:
                log.warning("pop.offset_dropped", group=group, topic=topic, queue_id=queue_id, offset=offset,
                            max_offset=max_offset, reason="past the queue's end (topic re-created?)")
                self.pop.offsets.written([row])
                continue
            keep.append(row)
        return keep
