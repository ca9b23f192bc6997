"""Topic registry and consumer offsets of the MessageStore: the rules (names, system topics, queue
counts that only grow) on top of mqstore.meta, with an in-memory copy of the registry so that the
append path never queries SQL. The store holds one :class:`TopicRegistry` and gives it the few things
it needs of the rest of the store as callables.

Thread-safety: lookups read the in-memory dict without a lock (one dict read is atomic); changes
serialise on ``_lock``, which is held while the metadata database is written.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import structlog

from mqstore import topics as topic_rules
from mqstore.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, OutOfRange, invariant
from mqstore.meta import MetadataStore
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, KIND_SYSTEM, QueueInfo, TopicRecord

log = structlog.get_logger()


class TopicRegistry:
    def __init__(self, default_queue_count: int, *, queue_info: Callable[[str, int], QueueInfo],
                 drop_queues: Callable[[str], None], refuse_write: Callable[[], None]):
        """``queue_info(topic, queue id)`` checks that the queue exists and gives its range;
        ``drop_queues(topic)`` removes a deleted topic's consume queues; ``refuse_write()`` raises
        while metadata must not be written (a full disk)."""
        self.default_queue_count = default_queue_count
        self._queue_info = queue_info
        self._drop_queues = drop_queues
        self._refuse_write = refuse_write
        self.meta: MetadataStore | None = None
        self._topics: dict[str, TopicRecord] = {}
        self._lock = threading.Lock()

    def open(self, meta: MetadataStore) -> None:
        """Load the registry from ``meta`` (which the registry then owns) and create the system topics."""
        self.meta = meta
        self._topics = {t.name: t for t in meta.list_topics()}
        for name in sorted(topic_rules.SYSTEM_TOPICS):
            if name not in self._topics:
                self._topics[name] = meta.create_topic(name, 1, KIND_SYSTEM, 0)

    def close(self) -> None:
        if self.meta is not None:
            self.meta.close()

    def names(self) -> set[str]:
        return set(self._topics)

    def consumer_lag(self) -> dict[tuple[str, str, int], int]:
        """(group, topic, queue id) -> messages from the group's committed offset to the queue's end, for
        every committed offset of a topic that still exists (one metadata query: for the metrics)."""
        lag = {}
        for group, topic, queue_id, offset in self.meta.list_offsets() if self.meta is not None else ():
            record = self._topics.get(topic)
            if record is None or queue_id >= record.queue_count:
                continue
            lag[(group, topic, queue_id)] = max(0, self._queue_info(topic, queue_id).max_offset - offset)
        return lag

    def get(self, name: str) -> TopicRecord:
        found = self._topics.get(name)
        if found is None:
            # A name that could never exist is a malformed request, not a missing topic. Checked only
            # on a miss, so the append path pays nothing for it.
            topic_rules.validate_topic_name(name)
            raise NotFound(f"topic {name!r} does not exist; create it first (CreateTopic / `mqstore topic create`)")
        return found

    def check_system_writer(self, topic: TopicRecord, system_writer: str | None) -> None:
        """System topics are written only by the service that owns them (``system_writer`` names it;
        the gRPC Append never sets it), and so are pop consumption's retry and dead-letter topics.
        Other topics take appends from anybody."""
        if topic.kind != KIND_SYSTEM:
            if topic_rules.is_pop_owned_topic(topic.name) and system_writer != topic_rules.OWNER_POP:
                raise FailedPrecondition(f"topic {topic.name!r} is a retry or dead-letter topic: only "
                                         f"{topic_rules.OWNER_DESCRIPTIONS[topic_rules.OWNER_POP]} writes it; "
                                         f"append to a topic of your own")
            return
        owner = topic_rules.system_topic_owner(topic.name)
        if not owner or system_writer != owner:
            who = topic_rules.OWNER_DESCRIPTIONS.get(owner, "the store itself")
            raise FailedPrecondition(f"topic {topic.name!r} is a system topic: only {who} writes it; "
                                     f"append to a topic of your own")

    def create(self, name: str, queue_count: int = 0, kind: str = KIND_NORMAL, retention_ms: int = 0) -> TopicRecord:
        topic_rules.validate_topic_name(name)
        if topic_rules.is_system_topic(name) or kind == KIND_SYSTEM:
            raise FailedPrecondition(f"topic {name!r}: system topics are created by the store itself")
        if topic_rules.is_pop_owned_topic(name):
            raise FailedPrecondition(f"topic {name!r}: retry (%RETRY%) and dead-letter (%DLQ%) topics are created "
                                     f"by pop consumption when it first needs them")
        return self._create(name, queue_count, kind, retention_ms)

    def ensure_pop_topic(self, name: str) -> TopicRecord:
        """The retry or dead-letter topic ``name`` (one queue, NORMAL), created if missing: pop consumption's
        own way past :meth:`create`'s refusal of those names."""
        invariant(topic_rules.is_pop_owned_topic(name), f"{name!r} is a retry or dead-letter topic name")
        found = self._topics.get(name)
        if found is not None:
            return found
        try:
            return self._create(name, 1, KIND_NORMAL, 0)
        except AlreadyExists:  # created by a concurrent caller since the lookup
            return self.get(name)

    def _create(self, name: str, queue_count: int, kind: str, retention_ms: int) -> TopicRecord:
        queue_count = queue_count or self.default_queue_count
        topic_rules.validate_queue_count(queue_count)
        if retention_ms < 0:
            raise InvalidArgument(f"retention_ms must not be negative, got {retention_ms}")
        _refuse_compaction_retention(name, kind, retention_ms)
        self._refuse_write()
        with self._lock:
            created = self.meta.create_topic(name, queue_count, kind, retention_ms)
            self._topics[name] = created
        log.info("topic.created", topic=name, queue_count=queue_count, kind=kind)
        return created

    def update(self, name: str, queue_count: int = 0, retention_ms: int | None = None) -> TopicRecord:
        current = self.get(name)
        if current.kind == KIND_SYSTEM:
            raise FailedPrecondition(f"topic {name!r} is a system topic and cannot be changed")
        if queue_count:
            topic_rules.validate_queue_count(queue_count)
            if queue_count < current.queue_count:
                raise FailedPrecondition(
                    f"topic {name!r} has {current.queue_count} queues; the queue count may only grow "
                    f"(shrinking would strand messages), asked for {queue_count}")
            if current.kind == KIND_COMPACTION and queue_count != current.queue_count:
                raise FailedPrecondition(
                    f"topic {name!r} is a COMPACTION topic: its keys are routed by hash modulo its "
                    f"{current.queue_count} queues, so a new queue count would move keys to other queues (and "
                    f"resurrect old values)")
        if retention_ms is not None and retention_ms < 0:
            raise InvalidArgument(f"retention_ms must not be negative, got {retention_ms}")
        _refuse_compaction_retention(name, current.kind, retention_ms or 0)
        self._refuse_write()
        with self._lock:
            updated = self.meta.update_topic(name, queue_count or None, retention_ms)
            self._topics[name] = updated
        return updated

    def delete(self, name: str) -> None:
        current = self.get(name)
        if current.kind == KIND_SYSTEM:
            raise FailedPrecondition(f"topic {name!r} is a system topic and cannot be deleted")
        with self._lock:
            self.meta.delete_topic(name)
            self._topics.pop(name, None)
            self._drop_queues(name)
        log.info("topic.deleted", topic=name)

    def sorted_topics(self, include_system: bool = False) -> list[TopicRecord]:
        return sorted((t for t in self._topics.values() if include_system or t.kind != KIND_SYSTEM),
                      key=lambda t: t.name)

    def describe(self, name: str) -> tuple[TopicRecord, list[QueueInfo]]:
        topic = self.get(name)
        return topic, [self._queue_info(name, q) for q in range(topic.queue_count)]

    # ---- consumer offsets
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.commit_offsets([(group, topic, queue_id, offset)])

    def commit_offsets(self, rows: Sequence[tuple[str, str, int, int]]) -> None:
        """Several (group, topic, queue id, offset) at once, in one transaction; each checked as by
        :meth:`commit_offset`."""
        for group, topic, queue_id, offset in rows:
            topic_rules.validate_group_name(group)
            info = self._queue_info(topic, queue_id)
            if offset < 0 or offset > info.max_offset:
                raise OutOfRange(f"offset {offset} for {topic}/{queue_id} is outside [0, {info.max_offset}]",
                                 min_value=0, max_value=info.max_offset)
        self._refuse_write()
        self.meta.commit_offsets(rows)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        topic_rules.validate_group_name(group)
        self._queue_info(topic, queue_id)
        return self.meta.query_offset(group, topic, queue_id)


def _refuse_compaction_retention(name: str, kind: str, retention_ms: int) -> None:
    """A COMPACTION topic keeps the latest value of every key for ever (the Compactor's log is its long-lived
    copy; the commit log's segments expire by the store-wide retention, held back by the compactor's
    watermark): a per-topic retention would contradict that, so it is refused."""
    if kind == KIND_COMPACTION and retention_ms > 0:
        raise InvalidArgument(f"topic {name!r}: retention_ms {retention_ms} on a COMPACTION topic is refused; a "
                              f"compaction topic keeps the latest value per key (delete a key with a tombstone)")
