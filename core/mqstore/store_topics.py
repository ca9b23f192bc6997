"""Topic registry and the checks of consumer offsets of the MessageStore: the rules (names, system topics, queue
counts that only grow) on top of mqstore.meta, with an in-memory copy of the registry so that the
append path never queries SQL. The store holds one :class:`TopicRegistry` and gives it the few things
it needs of the rest of the store as callables.

A topic has an incarnation, ``start_physical_offset``: the commit log's end when it was created. The
log keeps the records of a deleted topic until retention removes them, and a topic created again with
the same name must not inherit them, so every reader of the log (the consume queues and their rebuild,
GetMessage, the Compactor, the Index through GetMessage) takes a record of topic T as part of T only if
T exists and the record lies at or above T's start_physical_offset. A commit log replica too: it dispatches
the records it copies with the starts of the database it shares with its leader (CopiedStarts), and drops
a topic's consume queues where it meets the topic's DELETED event (Dispatcher.dispatch_replicated).
Pop consumption's retry copies live in topics of their own (%RETRY%{group}_T): a Receive of T passes over
those stored below T's start_physical_offset (copies for the T deleted before), and an old delivery still
in flight cannot be copied again (its original is no longer T's).

DeleteTopic runs in steps (mqstore.topic_admin: TopicAdmin.delete), each safe to crash after; a delete cut short is
resumed from step 2 when the store starts (rows still marked), and retried by a DeleteTopic of the name:

  step                                                    after a crash here
  ------------------------------------------------------- ----------------------------------------------
  1. the row is marked deleting (SQL) and the topic       hidden: appends and reads say NotFound, a
     hidden from this registry under the append lock       CreateTopic of the name FailedPrecondition
  2. a DELETED event (mqstore.format.topic_event) is      followers have the event, in log order (a
     appended to RMQ_SYS_TOPIC_EVENTS and flushed          second one on resume is harmless)
  3. the consume queues and next queue offsets go         Pull, queue info: nothing (also after a rebuild:
                                                          the topic is not in the registry)
  4. tombstones of its consumer offsets are appended to   the name is free: a new topic starts at queue
     RMQ_SYS_CONSUMER_OFFSETS (mqstore.consumer_offsets),  offset 0, above the event, with no offsets
     then the row is deleted

Thread-safety: lookups read the in-memory dict without a lock (one dict read is atomic); changes
serialise on ``_lock``, which is held while the metadata database is written; hiding a topic also
takes the append lock given at construction, so that no append of it lands after the hiding.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import structlog

from mqstore import limits
from mqstore import topics as topic_rules
from mqstore.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, OutOfRange, invariant
from mqstore.meta.catalog import TopicCatalog
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, KIND_SYSTEM, QueueInfo, TopicRecord

log = structlog.get_logger()


class TopicRegistry:
    def __init__(self, default_queue_count: int, *, queue_info: Callable[[str, int], QueueInfo],
                 refuse_write: Callable[[], None], log_end: Callable[[], int], append_lock: threading.Lock):
        """``queue_info(topic, queue id)`` checks that the queue exists and gives its range;
        ``refuse_write()`` raises while metadata must not be written (a full disk); ``log_end()`` is
        the commit log's written end (a new topic's start_physical_offset); ``append_lock`` is the
        commit log's, taken to hide a topic being deleted (appends check their topic under it)."""
        self.default_queue_count = default_queue_count
        self._queue_info = queue_info
        self._refuse_write = refuse_write
        self._log_end = log_end
        self._append_lock = append_lock
        self.meta: TopicCatalog | None = None
        # Called before a listing answers a caller: brings the registry up to the catalog's latest when other
        # nodes write it (etcd in HA: mqstore_rpc.catalogs.TopicWatch.fresh); nothing to do otherwise.
        self.freshen: Callable[[], None] = lambda: None
        self._topics: dict[str, TopicRecord] = {}
        self._deleting: dict[str, TopicRecord] = {}  # step 1 done, step 4 not yet (the module docstring)
        self._lock = threading.Lock()
        self.offsets = None  # the store's ConsumerOffsets (mqstore.consumer_offsets)
        # A commit log replica: a name missing from the in-memory copy is looked up in the database (its
        # leader may have created it since); set by the replication composition.
        self.reload_on_miss = False

    def open(self, meta: TopicCatalog) -> None:
        """Load the registry from ``meta`` (which the registry then owns) and create the system topics."""
        self.meta = meta
        self._topics = {t.name: t for t in meta.list_topics()}
        self._deleting = {t.name: t for t in meta.deleting_topics()}
        for name in sorted(topic_rules.SYSTEM_TOPICS):
            if name not in self._topics:
                try:
                    self._topics[name] = meta.create_topic(name, 1, KIND_SYSTEM, 0)
                except AlreadyExists:  # another node sharing the database (HA) created it since the list
                    self._topics[name] = meta.get_topic(name)

    def refresh(self) -> None:
        """Reload the registry from the catalog: a commit log replica shares its leader's (etcd in HA mode:
        mqstore_rpc.etcd_meta) and learns of topics created there this way, and of deletes cut short there (a
        new leader finishes them when DeleteTopic names them again)."""
        with self._lock:
            self._topics = {t.name: t for t in self.meta.list_topics()}
            self._deleting = {t.name: t for t in self.meta.deleting_topics()}

    def close(self) -> None:
        if self.meta is not None:
            self.meta.close()

    def names(self) -> set[str]:
        return set(self._topics)

    def starts(self) -> dict[str, int]:
        """Every topic's start_physical_offset: the records the consume queues are rebuilt from."""
        return {name: t.start_physical_offset for name, t in list(self._topics.items())}

    def copied_starts(self) -> CopiedStarts:
        """The topics' starts for one round of a replica's dispatch (:class:`CopiedStarts`)."""
        return CopiedStarts(self)

    def start_of(self, name: str) -> int | None:
        """The topic's start_physical_offset; None when there is no such topic (deleted, or being deleted).
        The append path asks it under the append lock, the dispatcher for every batch: one dict read."""
        found = self._topics.get(name)
        return None if found is None else found.start_physical_offset

    def compaction_floor(self) -> int | None:
        """The lowest start_physical_offset of the COMPACTION topics (None: there is none): no record of a
        compaction topic lies below it, so a retention hold need not keep the log below it."""
        return min((t.start_physical_offset for t in list(self._topics.values()) if t.kind == KIND_COMPACTION),
                   default=None)

    def owns(self, name: str, physical_offset: int) -> bool:
        """Whether the record of topic ``name`` at ``physical_offset`` is part of the topic as it is now.
        A replica looks a name it does not know up in the database first, as :meth:`get` does: it holds
        the records its leader wrote of topics created there, and after a failover it serves readers that
        verify them by GetMessage (the Index)."""
        found = self._find(name)
        return found is not None and physical_offset >= found.start_physical_offset

    def consumer_lag(self) -> dict[tuple[str, str, int], int]:
        """(group, topic, queue id) -> messages from the group's committed offset to the queue's end, for
        every committed offset of a topic that still exists (one metadata query: for the metrics)."""
        lag = {}
        for group, topic, queue_id, offset in self.offsets.rows() if self.offsets is not None else ():
            record = self._topics.get(topic)
            if record is None or queue_id >= record.queue_count:
                continue
            lag[(group, topic, queue_id)] = max(0, self._queue_info(topic, queue_id).max_offset - offset)
        return lag

    def _find(self, name: str) -> TopicRecord | None:
        """The topic ``name``, reloading the registry on a miss when ``reload_on_miss`` (a replica)."""
        found = self._topics.get(name)
        if found is None and self.reload_on_miss and self.meta is not None:
            self.refresh()
            found = self._topics.get(name)
        return found

    def get(self, name: str) -> TopicRecord:
        found = self._find(name)
        if found is None:
            # A name that could never exist is a malformed request, not a missing topic. Checked only
            # on a miss, so the append path pays nothing for it.
            topic_rules.validate_topic_name(name)
            raise NotFound(f"topic {name!r} does not exist; create it first (CreateTopic / `mqstore topic create`)")
        return found

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
            if name in self._deleting:
                raise FailedPrecondition(f"topic {name!r} is being deleted (a delete was cut short); DeleteTopic "
                                         f"it again to finish, then create it")
            # Every record of an earlier topic of this name, and its delete event, lie below the log's
            # end now: the new topic starts above them.
            created = self.meta.create_topic(name, queue_count, kind, retention_ms, self._log_end())
            self._topics[name] = created
        log.info("topic.created", topic=name, queue_count=queue_count, kind=kind,
                 start_physical_offset=created.start_physical_offset)
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

    # ---- deleting (the steps of the module docstring; mqstore.topic_admin runs them)
    def begin_delete(self, name: str) -> TopicRecord:
        """Step 1: mark the row, hide the topic. A topic whose delete was cut short is returned as it
        is (DeleteTopic resumes it)."""
        with self._lock:
            resumed = self._deleting.get(name)
            if resumed is not None:
                return resumed
            current = self.get(name)
            if current.kind == KIND_SYSTEM:
                raise FailedPrecondition(f"topic {name!r} is a system topic and cannot be deleted")
            self._refuse_write()
            self.meta.mark_topic_deleting(name)
            with self._append_lock:
                self._deleting[name] = self._topics.pop(name)
        log.info("topic.deleting", topic=name, start_physical_offset=current.start_physical_offset)
        return current

    def end_delete(self, name: str) -> None:
        """Step 4 (after the offsets' tombstones, MessageStore): the row goes; the name is free."""
        with self._lock:
            self.meta.delete_topic(name)
            self._deleting.pop(name, None)

    def deleting(self) -> list[TopicRecord]:
        """The deletes cut short (by a crash, or a failure in step 2 or 3), to be resumed."""
        with self._lock:
            return sorted(self._deleting.values(), key=lambda t: t.name)

    def sorted_topics(self, include_system: bool = False) -> list[TopicRecord]:
        return sorted((t for t in self._topics.values() if include_system or t.kind != KIND_SYSTEM),
                      key=lambda t: t.name)

    def describe(self, name: str) -> tuple[TopicRecord, list[QueueInfo]]:
        topic = self.get(name)
        return topic, [self._queue_info(name, q) for q in range(topic.queue_count)]

    # ---- consumer offsets (stored in the log: mqstore.consumer_offsets, set as ``offsets`` by the store)
    def check_offsets(self, rows: Sequence[tuple[str, str, int, int]]) -> None:
        """Raise unless every (group, topic, queue id, offset) may be committed: a legal group, an existing
        queue, an offset in [0, the queue's max offset] (OutOfRange)."""
        for group, topic, queue_id, offset in rows:
            topic_rules.validate_group_name(group)
            limits.at_least_zero("offset", offset, "the next queue offset the group will consume")
            info = self._queue_info(topic, queue_id)
            if offset > info.max_offset:
                raise OutOfRange(f"offset {offset} for {topic}/{queue_id} is outside [0, {info.max_offset}]",
                                 min_value=0, max_value=info.max_offset)
        self._refuse_write()

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        topic_rules.validate_group_name(group)
        self._queue_info(topic, queue_id)
        offset = self.offsets.get(group, topic, queue_id)
        if offset is None:
            raise NotFound(f"group {group!r} has committed no offset for topic {topic!r} queue {queue_id}; "
                           "start from the queue's min or max offset as the consumer's policy says")
        return offset


class CopiedStarts:
    """topic -> start_physical_offset for one round of a replica's dispatch (Dispatcher.dispatch_replicated),
    read as a dict is by the replay (``in``, ``[]``, ``get``): this node's in-memory registry, until a name is
    missing from it (a topic its leader created since) or :meth:`reload` is called (the round met a DELETED
    event); from then on, for the rest of the round, the topics as the shared database has them now (read
    once; a name it does not have is no topic, and its records get no entries). The dispatch runs under the
    dispatcher's lock, which DeleteTopic takes (after the append lock) while another DeleteTopic holds the
    registry's lock to take the append lock: so the database is read here without the registry's lock, and
    the caller brings the registry along (:meth:`TopicRegistry.refresh`) after the round when ``reloaded``.
    Used by one thread, the dispatching one."""

    def __init__(self, registry: TopicRegistry):
        self._registry = registry
        self._loaded: dict[str, int] | None = None

    @property
    def reloaded(self) -> bool:
        return self._loaded is not None

    def get(self, name: str, default: int | None = None) -> int | None:
        if self._loaded is None:
            found = self._registry.start_of(name)
            if found is not None:
                return found
            self.reload()
        return self._loaded.get(name, default)

    def reload(self) -> None:
        self._loaded = {t.name: t.start_physical_offset for t in self._registry.meta.list_topics()}

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __getitem__(self, name: str) -> int:
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found


def _refuse_compaction_retention(name: str, kind: str, retention_ms: int) -> None:
    """A COMPACTION topic keeps the latest value of every key for ever (the Compactor's log is its long-lived
    copy; the commit log's segments expire by the store-wide retention, held back by the compactor's
    watermark): a per-topic retention would contradict that, so it is refused."""
    if kind == KIND_COMPACTION and retention_ms > 0:
        raise InvalidArgument(f"topic {name!r}: retention_ms {retention_ms} on a COMPACTION topic is refused; a "
                              f"compaction topic keeps the latest value per key (delete a key with a tombstone)")
