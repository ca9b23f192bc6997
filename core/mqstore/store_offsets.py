"""CommitOffset and QueryOffset of a :class:`~mqstore.store.MessageStore`, and the import of an earlier
version's SQL consumer offsets: the rules around the offsets map (mqstore.consumer_offsets), through the
store's public parts (its gate, topic registry, offsets map and long-poll wait), so that the store's face
carries none of them. The CommitLog service, pop consumption (mqstore.pop.storage), tests and the bench
call these.

* A commit is refused by a replica (or a deposed leader), naming its leader; each row is checked as
  CommitOffset checks it (store_topics.check_offsets); the rows go in one record (ConsumerOffsets.commit).
* A new leader answers offsets once it shows every record it copied as a replica (:func:`_visible`): the
  last offsets its old leader acknowledged lie there.
* The SQL table of earlier versions is imported once, into an empty offsets topic (:func:`import_sql_offsets`):
  at start by a single node; by the first leader of a replication group that answers an offsets call.

Thread-safety: as the parts they call (each is thread-safe); the deferred import runs once
(ConsumerOffsets.run_deferred).
"""

from __future__ import annotations

from typing import Sequence

import structlog

from mqstore.errors import Unavailable
from mqstore.replication.node import takes_writes
from mqstore.store import MessageStore

log = structlog.get_logger()

OFFSETS_VISIBLE_WAIT_MS = 5_000  # a new leader's QueryOffset waits so long for its copied records' visibility


def commit_offset(store: MessageStore, group: str, topic: str, queue_id: int, offset: int) -> None:
    commit_offsets(store, [(group, topic, queue_id, offset)])


def commit_offsets(store: MessageStore, rows: Sequence[tuple[str, str, int, int]],
                   replication: str | None = None) -> None:
    """Several (group, topic, queue id, offset) at once, all stored or none (one record of the offsets
    topic: mqstore.consumer_offsets); each checked as CommitOffset checks it. ``replication`` as an
    append's: None the node's default (pop consumption's are SYNC, as its other records)."""
    store.check_running()
    store.gate.check_writable()  # a replica (or a deposed leader) refuses, naming its leader
    store.topics.check_offsets(rows)
    _visible(store)
    store.offsets.commit(rows, replication)


def query_offset(store: MessageStore, group: str, topic: str, queue_id: int) -> int:
    _visible(store)
    return store.topics.query_offset(group, topic, queue_id)


def query_key(store: MessageStore, group: str, key: str, queue_id: int) -> int | None:
    """The value of a row of the offsets map that names no queue (``key`` is a reserved name no topic can
    take, RMQ_SYS_*: pop's group settings, mqstore.pop.settings); None when never stored."""
    _visible(store)
    return store.offsets.get(group, key, queue_id)


def commit_keys(store: MessageStore, rows: Sequence[tuple[str, str, int, int]], replication: str | None) -> None:
    """Rows that name no queue (see :func:`query_key`), in one record; a replica refuses, naming its leader."""
    store.check_running()
    store.gate.check_writable()
    _visible(store)
    store.offsets.commit(rows, replication)


def import_sql_offsets(store: MessageStore, now: bool = True) -> None:
    """After ``store.start()``: import an earlier version's SQL consumer offsets into an empty offsets topic
    now (``now``: a single node); else on the first CommitOffset or QueryOffset this node answers as the
    leader (a node of a replication group appends nothing at start, when it is no leader yet)."""
    if now:
        _import(store)
    else:
        store.offsets.defer(lambda: _import_if_leading(store))


def _visible(store: MessageStore) -> None:
    """A new leader answers offsets once it shows everything it copied as a replica: the last offsets its
    old leader acknowledged lie there (waits up to OFFSETS_VISIBLE_WAIT_MS, then Unavailable). Then the
    earlier version's SQL offsets, if still to import (:func:`import_sql_offsets`)."""
    if not store.replica_view.promoted_visible() and not store.wait_for_messages(store.replica_view.promoted_visible,
                                                                      OFFSETS_VISIBLE_WAIT_MS):
        raise Unavailable("this node leads since a moment and does not show every record it copied as a "
                          "replica yet (its in-sync replicas have not acknowledged them): consumer offsets "
                          "would be older than acknowledged; retry in a moment")
    store.offsets.run_deferred()


def _import_if_leading(store: MessageStore) -> bool:
    """The deferred import, by a node that takes writes (returns whether it ran: a replica leaves it)."""
    if not takes_writes(store.gate):
        return False
    _import(store)
    return True


def _import(store: MessageStore) -> None:
    """Once: the consumer offsets of the SQL table of earlier versions, into an empty offsets topic (on a
    node that takes writes; the rows of topics gone since are left out; an offsets topic that holds a
    record already, this node's or copied from an earlier leader, is not imported into)."""
    if not takes_writes(store.gate) or store.offsets.holds_records():
        return
    rows = [row for row in store.topics.meta.list_offsets() if row[1] in store.topics.names()]
    if rows and store.offsets.import_rows(rows):
        log.info("offsets.migrated", rows=len(rows), source="sql consumer_offsets table",
                 why="consumer offsets live in the offsets topic now; the table is no longer written")
