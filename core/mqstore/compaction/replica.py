"""A replica's copy of a primary compactor's compaction logs (``--replica-of``; seed 000's replication of
compaction logs; RocketMQ's slave pulls the master's compacted data the same way, reference §6.8): what is
kept, dropped and appended. The transport (ListQueues and raw Pulls on the primary) is the service's
(compactor_service.replica.ReplicaDuty), which calls :meth:`ReplicaCopy.reconcile` once per pass and
:meth:`ReplicaCopy.copy` per queue.

  rule                                  what
  ------------------------------------- -------------------------------------------------------------------
  a topic the primary no longer lists   deleted there (its DELETED event, mqstore.compaction.projection):
                                        the replica drops its copy
  a topic listed with another start     deleted and created again: the copy of the older topic is dropped
  (topic_start_physical_offset)         and the new one copied from offset 0 (CompactionStore.append of a
                                        record of the newer topic would too)
  a queue                               from the replica's own next offset (0 on a new replica: the
                                        primary's compacted records, holes and all) until the primary has
                                        nothing newer, each record appended as stored (the same bytes; the
                                        replica's append rewrites only PHYSICALOFFSET, to its own position);
                                        a page is fsynced before the next offset is asked for
  a record of another queue             the primary's answer is wrong: Unavailable, nothing of it appended

Thread-safe: ``applied`` under ``_lock``; reconcile and copy from one thread (the replica's duty).
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

import structlog

from mqstore.errors import Unavailable
from mqstore.format.record import PROPERTY_TAGS
from mqstore.format.record_reader import decode

from .store import CompactionStore

log = structlog.get_logger("mqstore.compaction.replica")
MAX_PAGES_PER_STEP = 10_000


class ReplicaCopy:
    def __init__(self, store: CompactionStore, primary: str):
        self.store, self.primary = store, primary
        self._lock = threading.Lock()
        self._applied = 0

    @property
    def applied(self) -> int:
        """Records appended since start."""
        with self._lock:
            return self._applied

    def reconcile(self, listed: Mapping[str, int]) -> None:
        """``listed``: every topic the primary holds -> its topic_start_physical_offset. Drops the copy of
        every topic held that is not listed so."""
        for topic in self.store.topics():
            if listed.get(topic, -1) != self.store.incarnation(topic):
                log.info("compactor.replica_topic_dropped", topic=topic, primary_start=listed.get(topic),
                         held_start=self.store.incarnation(topic), why="deleted on the primary (or created again)")
                self.store.drop_topic(topic)

    def copy(self, topic: str, queue_id: int, incarnation: int, pull: Callable[[int], Sequence[bytes]]) -> None:
        """Copy one queue: ``pull(offset)`` is the primary's raw records from ``offset`` (none: nothing newer)."""
        if not self.store.hold_topic(topic, incarnation):
            return  # (a newer topic of the name is held: the primary's list is older than what was copied)
        slot = self.store.slot(topic, queue_id, create=True)
        for _ in range(MAX_PAGES_PER_STEP):
            raws = pull(slot.qlog.next_offset())
            if not raws:
                return
            for raw in raws:
                r = decode(raw)
                if r.topic != topic or r.queue_id != queue_id:
                    raise Unavailable(f"the primary {self.primary} answered a record of {r.topic}/{r.queue_id} "
                                      f"for {topic}/{queue_id}")
                if self.store.append(topic, queue_id, raw, r.queue_offset, r.properties.get(PROPERTY_TAGS),
                                     r.store_timestamp_ms, incarnation):
                    with self._lock:
                        self._applied += 1
            slot.qlog.sync()  # durable before it is counted as copied
