"""Retention of the commit log and of topics, and the followers' holds on it: the part of the store that
removes what is old. The store holds one :class:`Retention` (``store.retention``); its maintenance duty
runs :meth:`Retention.delete_expired_segments` and :meth:`Retention.apply_topic_retention`.

- Whole segments past ``retention_ms`` go, never past what is flushed and dispatched, nor below the
  lowest live retention hold (mqstore.retention_holds: a follower's Tail names one); the compactor's hold
  protects compaction data only: nothing below the COMPACTION topics' starts. Consume queue minimums
  follow (:meth:`Retention.before_segment_delete`).
- Consumer offsets (mqstore.consumer_offsets) are never lost to retention: before the expired segments go,
  the leader re-appends the live offsets they hold (``offsets.rewrite_below``), and the lowest record still
  holding a live offset is a floor on every node (``offsets.floor``), whatever the rewrite managed.
- A topic with its own ``retention_ms`` has its consume queues' minimums raised past what is older.
- Floors added by the store's users (:meth:`Retention.add_floor`): the timer's (mqstore.timer.leadership: the
  oldest timer record not delivered or rolled yet) and, with the object storage tier on, the uploader's
  (mqstore.tier.uploader: no segment whose upload has not FINISHED goes, on every node) keep every segment
  from there; a floor of None keeps none.

Thread-safety: every method may be called from any thread. Consume queue minimums change under the
dispatcher's lock; segments are deleted by SegmentQueue.delete_expired (the maintenance duty's thread);
the holds are RetentionHolds' (thread-safe).
"""

from __future__ import annotations

from typing import Callable

import structlog

from mqstore import retention_holds
from mqstore.clock import Clock
from mqstore.config import StoreConfig
from mqstore.consumer_offsets import ConsumerOffsets
from mqstore.errors import MqStoreError
from mqstore.format import offset_commit, tier_upload
from mqstore.log.commitlog import CommitLog
from mqstore.log.segment import SegmentQueue
from mqstore.queue.dispatch import Dispatcher, QueueTable
from mqstore.retention_holds import HoldInfo, RetentionHolds
from mqstore.store_topics import TopicRegistry

log = structlog.get_logger()

# The system topics whose records are read only from the local log (local retention keeps what they need:
# mqstore.tier.local_retention): the consumer offsets and the tier's own uploads ledger.
LOCAL_ONLY_TOPICS = frozenset({offset_commit.TOPIC, tier_upload.TOPIC})


class Retention:
    def __init__(self, config: StoreConfig, clock: Clock, *, segments: SegmentQueue, queues: QueueTable,
                 commitlog: CommitLog, dispatcher: Dispatcher, topics: TopicRegistry,
                 flushed_offset: Callable[[], int], offsets: ConsumerOffsets, writable: Callable[[], bool]):
        """``flushed_offset()``: the log's fsynced end (the flusher's; segments above it are kept);
        ``offsets``: the consumer offsets, kept; ``writable()``: whether this node appends (the leader)."""
        self._config = config
        self._clock = clock
        self._segments = segments
        self._queues = queues
        self._commitlog = commitlog
        self._dispatcher = dispatcher
        self._topics = topics
        self._flushed_offset = flushed_offset
        self._offsets = offsets
        self._writable = writable
        self.holds = RetentionHolds(config.retention_hold_max_ms, config.retention_hold_grace_ms)
        self._floors: dict[str, Callable[[], int | None]] = {}

    def add_floor(self, name: str, floor: Callable[[], int | None]) -> None:
        """``floor()``: a log offset below which retention deletes nothing (None: it keeps nothing), asked at
        each pass from the maintenance duty's thread (the timer's: TimerDuty.retention_floor)."""
        self._floors[name] = floor

    def delete_expired_segments(self) -> int:
        """Whole segments past ``retention_ms``, never past what is flushed and dispatched; consume
        queue minimums follow (SegmentQueue.delete_expired). Returns how many segments went."""
        now_ms = self._clock.now_ms()
        expired_end = self._expired_end(now_ms)
        if expired_end is not None and self._writable():
            try:
                self._offsets.rewrite_below(expired_end)
            except (MqStoreError, OSError) as exc:  # a full disk, a lost leadership: retention goes on below
                log.warning("offsets.rewrite_failed", below=expired_end, error=type(exc).__name__, message=str(exc),
                            why="the segments holding live offsets are kept (the floor) until a rewrite succeeds")
        return self._segments.delete_expired(self.limit(), now_ms, self._config.retention_ms,
                                             self.before_segment_delete)

    def limit(self, holds: bool = True) -> int:
        """The log offset retention deletes nothing at or above (local retention's too: mqstore.tier.local_retention):
        what is flushed and dispatched, the consumer offsets' floor, the floors added and, with ``holds``, the live
        holds (local retention leaves them out: it deletes only segments whose upload FINISHED, which a follower's
        Tail then reads from the tier; the total retention keeps them)."""
        limit = min(self._flushed_offset(), self._dispatcher.dispatched_offset)
        offsets_floor = self._offsets.floor()
        if offsets_floor is not None:
            limit = min(limit, offsets_floor)
        for floor in list(self._floors.values()):
            if (at := floor()) is not None:
                limit = min(limit, at)
        if not holds:
            return limit
        # Followers' positions (retention_holds.py); the compactor's protects compaction data only: nothing
        # below the COMPACTION topics' starts.
        floor = self._topics.compaction_floor()  # one per compactor (several with --etcd-endpoints)
        floors = {name: floor for name in self.holds.names() if retention_holds.is_compactor(name)}
        held = self.holds.low(self._clock.now_ms(), floors)
        return limit if held is None else min(limit, held)

    def _expired_end(self, now_ms: int) -> int | None:
        """The end of the oldest segments past ``retention_ms`` (as SegmentQueue.delete_expired judges them,
        the active one never), None when none is."""
        end = None
        for seg in self._segments.segments[:-1]:
            if int(seg.path.stat().st_mtime * 1000) + self._config.retention_ms > now_ms:
                break
            end = seg.end
        return end

    def before_segment_delete(self, new_min_offset: int) -> None:
        """Every consume queue's minimum at or above the log's new minimum (its entries below are gone)."""
        with self._dispatcher.lock:
            for cq in list(self._queues.queues.values()):
                cq.correct_min_offset(new_min_offset)

    def correct_local_only(self, local_min_offset: int) -> None:
        """The consume queues of the topics read only from the local log (LOCAL_ONLY_TOPICS: the store reads them
        as it starts, before any tier reader) start at or above the local log's minimum: with the object storage
        tier's local retention, what they held below was re-appended above first (mqstore.tier.local_retention)."""
        with self._dispatcher.lock:
            for (topic, _), cq in list(self._queues.queues.items()):
                if topic in LOCAL_ONLY_TOPICS:
                    cq.correct_min_offset(local_min_offset)

    def apply_topic_retention(self) -> None:
        """Each topic with its own retention_ms: its consume queues' minimums past what is older."""
        now = self._clock.now_ms()
        for topic in self._topics.sorted_topics(include_system=True):
            if topic.retention_ms <= 0:
                continue
            for queue_id in range(topic.queue_count):
                cq = self._queues.get(topic.name, queue_id)
                if cq is None or cq.max_offset == cq.min_offset:
                    continue
                cutoff = cq.offset_by_time(now - topic.retention_ms, False, self._commitlog.store_timestamp_at)
                with self._dispatcher.lock:
                    cq.raise_min_offset(min(cutoff, cq.max_offset))

    def list_holds(self) -> list[HoldInfo]:
        """The live retention holds by name (mqstore.retention_holds), lapsed ones dropped first."""
        return self.holds.listing(self._clock.now_ms())
