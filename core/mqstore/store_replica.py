"""The replica side of a MessageStore: when records become visible (their consume queue entries, and so Pull
and Tail) on a node of a replicated group, and what a replica does when it becomes leader. Every caller
reaches it as ``store.replica_view``; mqstore.store_parts composes one onto the store, whose write path
dispatches through it (:meth:`ReplicaView.dispatch_to`, given to ``store.dispatch_through``), so that an
append's entries never go in before the records copied below them. The operations on the log's bytes (a
leader's chunks, a replica's writes, truncation) are mqstore.replication.store_ops'.

- a replica: its leader's bytes are visible up to the committed offset the leader sends
  (:meth:`ReplicaView.visible_to`: held by every in-sync node, never bytes a failover could cut);
- a leader: what the in-sync set's acknowledgements made committed (:meth:`ReplicaView.advance_visible`);
- a promotion: the append path's queue offsets and store time from the log (:meth:`ReplicaView.promote`),
  and, once shown, :meth:`ReplicaView.promoted_visible` (pop's revive log replays only then).

The store is the duck-typed MessageStore (not imported: mqstore.store_parts composes this module onto it).

Thread-safety: a replica's follower thread calls ``visible_to``; a leader's appending threads and its
acknowledgement thread call ``dispatch_to`` and ``advance_visible`` (the dispatcher's lock orders them);
``promote`` runs on the thread that takes the leadership, before appends are let in.
"""

from __future__ import annotations


class ReplicaView:
    def __init__(self, store):
        self._store = store
        self._copied_end = 0  # the log's end when this node was promoted: below it no append is pending

    def visible_to(self, committed_offset: int) -> None:
        """The replica's side: consume queue entries (and so Pull and Tail) up to what its leader says is
        committed, that is held by every in-sync node: never bytes a failover could cut."""
        store = self._store
        held = store.flusher.flushed_offset if store.flusher.sync else store.commitlog.written_offset
        target = min(held, committed_offset)
        if target > store.dispatcher.dispatched_offset:
            self._dispatch_copied(target)

    def advance_visible(self) -> None:
        """The leader's side: dispatch what became committed (the in-sync set's acknowledgements moved it).
        Bytes copied while this node was a replica have no pending append: they are dispatched from the log."""
        store = self._store
        held = store.flusher.flushed_offset if store.flusher.sync else store.commitlog.written_offset
        self.dispatch_to(min(held, store.gate.committed_offset()))

    def dispatch_to(self, limit: int) -> None:
        """Consume queue entries up to ``limit``: first the bytes this node copied as a replica before it
        led (they have no pending append: from the log), then its own pending appends. Every dispatch goes
        through here, in that order, so an append's entries never go in before the copied records below
        them (the appending thread and the acknowledgement thread of a new leader both dispatch)."""
        dispatcher = self._store.dispatcher
        copied_end = min(self._copied_end, limit)
        if dispatcher.dispatched_offset < copied_end:
            self._dispatch_copied(copied_end)
        dispatcher.run_pending(limit)

    def _dispatch_copied(self, limit: int) -> None:
        """Consume queue entries of the records this node copied from its leader, up to ``limit``, with the
        topics as they are now (a topic deleted or created on the leader since this node last looked:
        store_topics.CopiedStarts); the registry is brought along when the round read the database."""
        store = self._store
        starts = store.topics.copied_starts()
        store.dispatcher.dispatch_replicated(store.dispatcher.dispatched_offset, limit, starts)
        if starts.reloaded:
            store.topics.refresh()

    def promoted_visible(self) -> bool:
        """A new leader shows its readers everything it copied as a replica (pop consumption replays its
        revive log only then: mqstore.pop.leadership)."""
        return self._store.dispatcher.dispatched_offset >= self._copied_end

    def promote(self) -> None:
        """A replica becomes leader: the append path's queue offsets and store time from its log, the records
        it copied but has not made visible yet included. A replica dispatches only up to the committed
        offset its leader last told it, which trails the bytes it holds (the next heartbeat brings it); a
        leader gone in between leaves records here that no consume queue holds yet (:meth:`dispatch_to`
        puts them in once the new in-sync set holds them), and the first append must take the queue
        offsets after theirs, not the same ones again."""
        store = self._store
        commitlog, dispatcher, queues = store.commitlog, store.dispatcher, store.queues
        store.topics.refresh()
        starts = store.topics.starts()
        with dispatcher.lock:
            # Queues of a topic deleted since, or of its earlier incarnation, whose DELETED event is among the
            # records not dispatched yet: gone now, as the old leader dropped them (the event drops them again
            # when it is dispatched), so that a topic of the name appended here starts at queue offset 0.
            queues.drop_unknown(set(starts))
            queues.drop(queues.of_earlier_topics(starts))
            offsets = dispatcher.next_queue_offsets()
            self._copied_end = commitlog.written_offset
            copied, copied_ts = dispatcher.queue_ends(dispatcher.dispatched_offset, self._copied_end, starts)
        offsets.update(copied)
        commitlog.restore(commitlog.written_offset,
                          max(commitlog.last_store_timestamp_ms, dispatcher.logics_msg_timestamp_ms, copied_ts or 0),
                          offsets)
