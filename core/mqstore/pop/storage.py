"""What pop consumption asks of the store beyond appends and reads: its retry and dead-letter topics,
its offsets in batches (records of the offsets topic), and the ends of queues for its long poll. Functions
of the store's parts
(MessageStore.gate, topics, queues), so that the store's face carries none of them.

Thread-safety: as the parts they call (each is thread-safe).
"""

from __future__ import annotations

from typing import Sequence

from mqstore import store_offsets
from mqstore.model import TopicRecord
from mqstore.store import MessageStore


def ensure_topic(store: MessageStore, name: str) -> TopicRecord:
    """A retry or dead-letter topic of pop consumption, created (one queue) when missing; a replica refuses
    (NotLeader names the leader)."""
    store.gate.check_writable()
    return store.topics.ensure_pop_topic(name)


def commit_offsets(store: MessageStore, rows: Sequence[tuple[str, str, int, int]], replication: str) -> None:
    """Several (group, topic, queue id, offset), all stored or none (pop consumption's batches: its offsets
    with its revive checkpoint, last; one record of the offsets topic, mqstore.consumer_offsets). A replica, or
    a deposed leader, refuses: its pop offsets must not overwrite the new leader's. ``replication``: pop's
    (mqstore.pop.service.POP_REPLICATION: SYNC, as every pop record, so a new leader holds them)."""
    store_offsets.commit_offsets(store, rows, replication)


def max_offsets(store: MessageStore, queues: Sequence[tuple[str, int]]) -> list[int]:
    """The max offset of each (topic, queue id), 0 for a queue (or topic) that holds nothing yet: no
    checks, no lock (pop consumption's long poll asks it on every dispatch)."""
    get = store.queues.queues.get
    return [cq.max_offset if (cq := get(key)) is not None else 0 for key in queues]
