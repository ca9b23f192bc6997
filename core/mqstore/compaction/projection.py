"""The compactor's side of the Tail follower (mqstore.follow): Tail frames -> compaction logs.

Gap policy STOP: a compaction log is durable data (once the commit log has expired a segment it is the
only copy of those keys), so when retention deleted records before they were applied the follower stays
there, health turns NOT_SERVING and Stats says why; it never skips a record it may need. The commit log
is asked to hold retention below the stream's start (TailRequest.hold_retention_as as HOLD_NAME: the
service's Tail source, compactor_service.tail.HoldingSource), so a gap needs the compactor to be away
longer than the log's retention_hold_max_ms, with one exception: the hold protects compaction data only,
not below the COMPACTION topics' starts (none while there is none), so a compactor away while topics were
deleted may meet a gap with nothing of its own in it. :meth:`CompactionProjection.gap_skippable` tells:
when every COMPACTION topic now starts at or above the gap's end, the gap held no record of any of them,
and every log the compactor holds is of a topic deleted since (its records lie below the gap, so below
any start): those logs are dropped and the gap is skipped.

The resume offset is the *durable* checkpoint: every ``checkpoint_interval_ms`` the logs are fsynced and
then the checkpoint (mqstore.format.follower_checkpoint, magic "MQCM") is replaced. A stream re-opens
there, so the hold never sits above data that is not durable yet; re-fed records are dropped by queue
offset (QueueLog.append is idempotent). A record that fails its checks raises DataLoss (unhealthy,
retried): skipping it could lose a key's latest value.

Which topics are compaction topics: the commit log's topic list (ListTopics: each topic's kind and
start_physical_offset), fetched again when a record names a topic not seen before (topics are created
before they are written, and kinds never change while a topic lives). A record is applied only if its
topic is a COMPACTION topic now and the record lies at or above the topic's start_physical_offset:
records of a deleted topic, or of an earlier topic of the same name, are not the topic's.

A deleted topic: its DELETED event (a record of RMQ_SYS_TOPIC_EVENTS, mqstore.format.topic_event) comes in
log order, after the topic's last record and before any record of a topic created again with the name;
applying it drops the topic's compaction logs (CompactionStore.drop_topic: crash-safe, idempotent) and
forgets what was known of the name, so that its next record asks ListTopics again. At its first frame
since start the projection also compares the logs it holds with the registry and drops those of topics
deleted meanwhile at once (so a compactor back from being away serves nothing of them while it catches
up). A compactor that was away meets the event when it comes back (the log holds it while a
COMPACTION topic lies above the checkpoint: the hold; else retention may have removed it, and the gap
is skippable, see above), and one that crashed after the drop and before its checkpoint meets it
again, harmlessly.
"""

from __future__ import annotations

import pathlib
import struct
import threading
from typing import Sequence

import structlog

from mqstore import retention_holds
from mqstore.clock import Clock
from mqstore.compaction.store import CompactionStore
from mqstore.errors import DataLoss
from mqstore.follow import FollowConfig, Follower, Gap, GapPolicy, TailSource
from mqstore.format import follower_checkpoint as fcp, topic_event
from mqstore.format.record import PROPERTY_TAGS
from mqstore.format.record_reader import RecordError, records
from mqstore.model import KIND_COMPACTION, TailFrame, TopicRecord

log = structlog.get_logger("mqstore.compaction.projection")
THREAD_NAME = "compactor-follower"
HOLD_NAME = retention_holds.COMPACTOR  # its floor: the COMPACTION topics' lowest start (retention_holds)
CHECKPOINT = fcp.CheckpointFormat("compactor checkpoint", 0x4D51434D, 1, struct.Struct(">q"))  # records applied


class CompactionProjection:
    """Called from the follower's thread; ``stats()`` from any (``_lock``)."""

    def __init__(self, store: CompactionStore, user_topics, checkpoint_path: pathlib.Path, clock: Clock,
                 checkpoint_interval_ms: int):
        """``user_topics()``: name -> TopicRecord of every user topic (CommitLogClient.user_topics)."""
        self.store, self.user_topics, self.path, self.clock = store, user_topics, checkpoint_path, clock
        self.interval_ms = checkpoint_interval_ms
        self._lock = threading.Lock()
        saved = CHECKPOINT.load(checkpoint_path)
        self._durable = saved.next_physical_offset if saved else None
        self._applied_records = saved.payload[0] if saved else 0
        self._applied_to = self._durable
        self._saved_ms = clock.now_ms()
        self._skipped_gap = False
        self._reconciled = False  # the logs held were checked against the registry (first frame since start)
        self._topics: dict[str, TopicRecord | None] = {}  # None: not a user topic (now)

    def resume_offset(self) -> int | None:
        with self._lock:
            return self._durable

    def apply(self, frame: TailFrame) -> Sequence:
        if not self._reconciled:
            self._reconcile()
        if frame.records:
            try:
                for view in records(frame.records):
                    self._apply_record(view)
            except RecordError as exc:
                raise DataLoss(f"a Tail frame holds a record that fails its checks ({exc}) at byte "
                               f"{exc.position} of the frame; the compactor does not skip records") from None
        with self._lock:
            self._applied_to = frame.next_physical_offset
        if self._skipped_gap or self.clock.now_ms() - self._saved_ms >= self.interval_ms:
            self._skipped_gap = False  # a skipped gap is made durable at once: the stream re-opens past it
            self.checkpoint()
        return ()

    def _apply_record(self, view) -> None:
        topic = view.topic
        if topic == topic_event.TOPIC:
            self._apply_event(view)
            return
        if topic in self._topics:
            found = self._topics[topic]
        else:
            self._topics = dict(self.user_topics())
            found = self._topics.setdefault(topic, None)  # None: not a user topic (a system one, or deleted)
        if found is None or found.kind != KIND_COMPACTION or view.physical_offset < found.start_physical_offset:
            return
        raw = bytes(view.buf[view.position:view.position + view.size])
        if self.store.append(topic, view.queue_id, raw, view.queue_offset, view.property(PROPERTY_TAGS),
                             view.store_timestamp_ms, found.start_physical_offset):
            with self._lock:
                self._applied_records += 1

    def _reconcile(self) -> None:
        """At the first frame since start (the commit log answers): drop at once the logs of every topic the
        registry no longer has as it was (deleted, or deleted and created again), rather than serve them
        until the follower meets their DELETED events again (it was away, or crashed in a drop)."""
        topics = self.user_topics()
        for held in self.store.topics():
            now = topics.get(held)
            if now is None or now.kind != KIND_COMPACTION or now.start_physical_offset != self.store.incarnation(held):
                log.warning("compactor.deleted_topic_dropped", topic=held, held_start=self.store.incarnation(held),
                            why="the commit log no longer has this topic (deleted while the compactor was away)")
                self.store.drop_topic(held)
        self._topics = dict(topics)
        self._reconciled = True

    def _apply_event(self, view) -> None:
        try:
            event = topic_event.decode(view.body)
        except ValueError as exc:
            raise DataLoss(f"the topic event at physical offset {view.physical_offset} does not decode ({exc}); "
                           f"the compactor cannot tell which topic is gone") from None
        if event.event == topic_event.DELETED:
            self._topics.pop(event.topic, None)  # its next record (a topic created again) asks ListTopics
            self.store.drop_topic(event.topic)

    def gap_skippable(self, gap: Gap) -> bool:
        """Whether the deleted log range ``gap`` can have held no record of a COMPACTION topic as it is now
        (the module docstring); if so, drop the logs of the topics deleted since (all those held)."""
        topics = self.user_topics()
        if any(t.kind == KIND_COMPACTION and t.start_physical_offset < gap.end_physical_offset
               for t in topics.values()):
            return False
        held = self.store.topics()
        for topic in held:
            self.store.drop_topic(topic)
        self._topics = dict(topics)
        self._skipped_gap = True
        log.warning("compactor.gap_skipped", from_physical_offset=gap.start_physical_offset,
                    to_physical_offset=gap.end_physical_offset, dropped_topics=held,
                    why="no COMPACTION topic has records there: every topic it held was deleted since")
        return True

    def checkpoint(self) -> None:
        """fsync the logs, then record how far they hold the log (the follower's thread, and close)."""
        with self._lock:
            applied_to, count = self._applied_to, self._applied_records
        if applied_to is None:
            return
        self.store.sync()
        CHECKPOINT.save(self.path, fcp.FollowerCheckpoint(applied_to, self.clock.now_ms(), (count,)))
        with self._lock:
            self._durable, self._saved_ms = applied_to, self.clock.now_ms()

    def stats(self) -> tuple[int | None, int]:
        with self._lock:
            return self._durable, self._applied_records


def compactor_follower(projection: CompactionProjection, source: TailSource, config: FollowConfig) -> Follower:
    """The projection's follower: GapPolicy.STOP, a gap skipped only when :meth:`CompactionProjection.
    gap_skippable` says so (the module docstring)."""
    return Follower(THREAD_NAME, source, projection, config, gap_policy=GapPolicy.STOP,
                    gap_skippable=projection.gap_skippable)
