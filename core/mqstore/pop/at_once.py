"""Which pop calls an event loop may answer (the Consumer's Receive and Ack on the commit log's grpc.aio port,
mqstore_rpc.aio.at_once_when), so that they skip the hand-off to the port's handler pool and back.

A call may run on the loop when it cannot wait: its records (CK, ACK) are appended without waiting
(``_records_wait``: ASYNC flush, and no in-sync replicas to wait for, pop's records being SYNC-replicated: one
node), and what it reads is in the hot local files, as a Pull on the loop (mqstore.hot_reads.pull_at_once):

  call     on the loop when
  -------  ------------------------------------------------------------------------------------------------------
  Ack      at most AT_ONCE_ACK_HANDLES handles (one ACK record, no read)
  Receive  no tag or SQL92 filter, a batch of at most hot_reads.AT_ONCE_PULL_MESSAGES, an unordered group whose
           settings and pop offsets (of every queue read: the topic's, its retry topics) are known here, each
           queue's next entries in the hot local files, and, when it asks for a long poll, a message ready in one
           of them. On the loop it never waits: the handler receives with no long poll, and one that found
           nothing after all (filtered out, taken by another consumer meanwhile) runs again in the pool
           (mqstore_rpc.aio.InPool), where the long poll may wait.

A call refused before any work (bad names, pop not started, no such topic) answers at once too. Anything else
runs in the pool. A look that races a change says "not at once" or lets the call decide; the call itself is the
same either way (the receive's lock, the in-flight set and the store are thread-safe). What a call on the loop may
still wait for is a lock another thread holds for a moment: the log's (as the loop's own appends do) and the
receive's lock of its group and topic, which a receive of the same group in the pool holds while it reads.
"""

from __future__ import annotations

from mqstore import hot_reads
from mqstore.errors import MqStoreError
from mqstore.filters import TAG, selection
from mqstore.pop.receive import DEFAULT_BATCH

AT_ONCE_ACK_HANDLES = 256


def ack_at_once(pop, handle_count: int) -> bool:
    """Whether an Ack of ``handle_count`` handles (PopService.ack) may run on an event loop."""
    return not pop.started or (handle_count <= AT_ONCE_ACK_HANDLES and not _records_wait(pop))


def receive_at_once(pop, group: str, topic: str, *, queue_id: int | None = None, filter_type: str = TAG,
                    filter_expression: str = "", batch_size: int = 0, long_poll_ms: int = 0) -> bool:
    """Whether a receive (PopService.receive with these options) may run on an event loop, with no long poll."""
    if not pop.started:
        return True  # refused (Unavailable)
    if _records_wait(pop):
        return False
    if not 0 <= batch_size <= hot_reads.AT_ONCE_PULL_MESSAGES:
        return False
    try:
        tags, sql = selection(filter_type, filter_expression)
        settings = pop.settings.peek(group)
        if settings is None or settings.ordered:
            return False  # an ordered group's read holds and frees message groups: on a thread
        sources = pop.receiver.sources(group, pop.receiver.consumable(topic), queue_id)
    except MqStoreError:
        return True  # refused before any read (InvalidArgument, NotFound)
    if tags or sql is not None:
        return False  # a filter may walk a queue far past its offset
    count = batch_size or DEFAULT_BATCH
    ready = False
    for source in sources:
        offset = pop.offsets.peek((group, source.name, source.queue_id))
        if offset is None:
            if pop.store.topics.start_of(source.name) is None:
                continue  # no such retry topic yet: nothing to read
            return False  # the group's first read of the queue: its offset is read (or stored) on a thread
        cq = pop.store.queues.get(source.name, source.queue_id)
        lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        if not lo <= offset <= hi:
            return False  # retention passed it, or the topic was made again: the receive walks on, on a thread
        if offset < hi:
            if not hot_reads.pull_at_once(pop.store, source.name, source.queue_id, offset, count):
                return False
            ready = True
    return ready or long_poll_ms <= 0


def _records_wait(pop) -> bool:
    """Whether an append of pop's records waits: for a flush or the node's default replication (the store's
    append_waits), or for the in-sync replicas that pop's own replication (SYNC) asks of a replication group."""
    return pop.store.append_waits() or pop.store.gate.sync_wanted(pop.replication)
