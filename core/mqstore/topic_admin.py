"""Topic administration of a MessageStore: CreateTopic, UpdateTopic, DeleteTopic, ListTopics, DescribeTopic
and the lookup of one topic, beside the store's write and read paths rather than on its face. Every caller
reaches it as ``store.topic_admin``: mqstore.store_parts composes one onto the store, and the store's start
resumes through it the deletes a crash cut short (``store.on_start``).

The rules of topics (names, kinds, queue counts that only grow, incarnations) are the registry's
(mqstore.store_topics: ``store.topics``); this module adds what needs the rest of the store: the gate of
writes (a replica refuses, naming its leader), the full disk, and DeleteTopic's steps, each safe to crash
after (the table in mqstore.store_topics; failpoints ``topic.delete.marked``, ``.announced``,
``.queues_dropped``): 1. the row marked and the topic hidden, 2. a DELETED event appended and flushed,
3. the consume queues and next queue offsets dropped, 4. the consumer offsets' tombstones, then the row.

The store is the duck-typed MessageStore (not imported: mqstore.store_parts composes this module onto it).

Thread-safety: as the store's: topic changes serialise on the registry's lock; dropping queues takes the
append lock, then the dispatcher's.
"""

from __future__ import annotations

import structlog

from mqstore import failpoints
from mqstore.errors import MqStoreError
from mqstore.format import topic_event
from mqstore.model import KIND_NORMAL, MessageIn, QueueInfo, TopicRecord

log = structlog.get_logger()


class TopicAdmin:
    def __init__(self, store):
        self._store = store

    def get(self, name: str) -> TopicRecord:
        """The topic ``name`` (NotFound when there is none; a replica first looks in the shared database)."""
        return self._store.topics.get(name)

    def create(self, name: str, queue_count: int = 0, kind: str = KIND_NORMAL, retention_ms: int = 0) -> TopicRecord:
        self._store.gate.check_writable()
        return self._store.topics.create(name, queue_count, kind, retention_ms)

    def update(self, name: str, queue_count: int = 0, retention_ms: int | None = None) -> TopicRecord:
        self._store.gate.check_writable()
        return self._store.topics.update(name, queue_count, retention_ms)

    def list(self, include_system: bool = False) -> list[TopicRecord]:
        """Every topic as the catalog has it now (a replica's registry first catches up: TopicRegistry.freshen)."""
        self._store.topics.freshen()
        return self._store.topics.sorted_topics(include_system)

    def describe(self, name: str) -> tuple[TopicRecord, list[QueueInfo]]:
        return self._store.topics.describe(name)

    def delete(self, name: str) -> None:
        """DeleteTopic in the steps of mqstore.store_topics, each safe to crash after (a delete cut short
        is resumed at start, or by deleting the name again)."""
        store = self._store
        store.check_running()
        store.gate.check_writable()  # before step 1: a replica must not mark its leader's row (the shared database)
        rec = store.topics.begin_delete(name)                                  # 1. marked, hidden
        failpoints.hit("topic.delete.marked")
        self._finish_delete(rec)

    def resume_deletes(self) -> None:
        """Finish the deletes a crash cut short (rows still marked): from step 2, which may repeat. The
        store calls it at the end of its start."""
        for rec in self._store.topics.deleting():
            try:
                self._finish_delete(rec)
            except (MqStoreError, OSError) as exc:  # a full disk, a slow fsync...: the store starts all the same
                log.error("topic.delete_not_resumed", topic=rec.name, error=type(exc).__name__, message=str(exc),
                          why="the topic stays hidden and its name taken; DeleteTopic of it finishes the delete")

    def _finish_delete(self, rec: TopicRecord) -> None:
        store = self._store
        store.gate.check_writable()  # a replica appends nothing of its own (NotLeader names the leader)
        store.disk.refuse_if_read_only()
        self._announce_deleted(rec)                                            # 2. in the log, flushed
        failpoints.hit("topic.delete.announced")
        self._drop_queues(rec.name)                                            # 3. consume queues gone
        failpoints.hit("topic.delete.queues_dropped")
        store.offsets.delete_topic(rec.name)                                   # 4. offsets: tombstones,
        store.topics.end_delete(rec.name)                                      # 4. the row: the name is free
        log.info("topic.deleted", topic=rec.name, start_physical_offset=rec.start_physical_offset)

    def _announce_deleted(self, rec: TopicRecord) -> None:
        """The DELETED event of ``rec`` in RMQ_SYS_TOPIC_EVENTS, flushed before the delete goes on: a
        follower that meets it removes what it derived from the topic (in log order, also after being
        away), and it must not be lost to a power cut once the registry has forgotten the topic."""
        store = self._store
        event = topic_event.TopicEvent(topic_event.DELETED, rec.name, rec.start_physical_offset)
        written = store.append_own(topic_event.TOPIC, [MessageIn(body=topic_event.encode(event), keys=(rec.name,))])
        end = written.entries[-1][0] + written.entries[-1][1]
        if store.flusher.flushed_offset < end:
            store.flusher.flush_now()

    def _drop_queues(self, topic: str) -> None:
        """A deleted topic's consume queues (durably) and next queue offsets: a new topic of the name starts at 0."""
        commitlog, dispatcher = self._store.commitlog, self._store.dispatcher
        with commitlog.lock, dispatcher.lock:
            self._store.queues.drop_topic(topic)
            for key in [k for k in commitlog.next_queue_offsets if k[0] == topic]:
                del commitlog.next_queue_offsets[key]
