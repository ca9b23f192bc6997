"""Replication's operations on a store's log beside appends, so that the store's face carries none of
them: the leader's read of whole records for a replica (:func:`chunk`), the replica's write of its
leader's bytes (:func:`apply`), the cut of a diverged tail (:func:`truncate`) and a new, empty log at a
leader's first segment (:func:`restart_at`). The file work is mqstore.replication.log_ops'; these add
the store's parts (its flusher, dispatcher, queues, checkpoint). What the store keeps of replication is
the visibility of copied records (mqstore.store_replica: ``store.replica_view``): it is the
dispatch of the write path.

The store is the duck-typed MessageStore (not imported: the store imports replication's gate).

Thread-safety: ``chunk`` runs on a leader's stream threads (it reads below the written offset, as every
reader); ``apply``, ``truncate`` and ``restart_at`` on a replica's follower thread, the only writer of a
replica's log (log_ops takes the commit log's and the dispatcher's locks).
"""

from __future__ import annotations

from mqstore.replication import log_ops


def chunk(store, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """The leader's side: whole records from ``offset`` (a record start), for a replica."""
    store.check_running()
    return log_ops.chunk(store.commitlog, offset, max_bytes)


def apply(store, offset: int, data: bytes, next_offset: int) -> None:
    """The replica's side: the leader's bytes at the same physical offsets (under SYNC flush, covered by an
    fsync before this returns). Visible only up to the leader's committed offset
    (ReplicaView.visible_to)."""
    store.check_running()
    store.commitlog.append_replicated(offset, data, next_offset)
    if store.flusher.sync:
        store.flusher.wait_flushed(next_offset)


def truncate(store, offset: int) -> list[str]:
    """Cut the log to ``offset`` (a replica whose tail diverged from its leader's), keeping .broken copies
    of the cut segments; consume queues follow. Returns the copies."""
    store.check_running()
    copies = log_ops.truncate(store.commitlog, offset, store.dispatcher, store.queues)
    store.flusher.flushed_offset = min(store.flusher.flushed_offset, offset)
    store.write_checkpoint()
    return copies


def restart_at(store, offset: int, keep_from: int = 0) -> list[str]:
    """Start a new, empty log at ``offset`` (a segment start): an empty replica copying a leader whose log
    starts there. What the log held is kept as .broken copies, from ``keep_from`` (below: the prefix it shares
    with the leader's log)."""
    store.check_running()
    copies = log_ops.restart_at(store.commitlog, offset, store.dispatcher, store.queues, keep_from)
    store.flusher.flushed_offset = offset
    store.write_checkpoint()
    return copies
