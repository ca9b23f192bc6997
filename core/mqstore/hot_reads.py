"""Which reads of a store an event loop may run (the CommitLog's gRPC port: mqstore_rpc.aio.at_once_when):
the rule over a :class:`~mqstore.store.MessageStore`, not a part of it (issue 33: the store's face keeps the
write and read paths; this reads its topic registry, its queue files and its log's hot boundary).

A read may run on the loop when it cannot block its thread or work long: no long poll that must wait, no tag or
SQL92 filter, a bounded walk, and only the hot local files (the last written: ConsumeQueue.is_hot,
CommitLog.is_hot), so that no file is read cold and no read goes to the object storage tier. A read refused
before any read (no such topic or queue, an offset outside the queue) answers at once too. Anything else runs in
the port's handler pool.

Thread-safe: it holds no state; the store's parts it looks at are thread-safe. A look that races a change
(retention deleting the files looked at) says "not at once", and the read itself decides, on a thread.
"""

from __future__ import annotations

from typing import Sequence

from mqstore.errors import MqStoreError
from mqstore.store import MessageStore

AT_ONCE_PULL_MESSAGES = 256  # the most messages of a Pull that an event loop may answer (pull_at_once)


def pull_at_once(store: MessageStore, topic: str, queue_id: int, offset: int, max_messages: int = 32,
                 filtered: bool = False, long_poll_ms: int = 0) -> bool:
    """Whether ``store.pull_raw`` (or ``store.pull``) of these answers without blocking its thread or working
    long: no long poll that must wait (a record at ``offset`` already, or no long poll asked), no tag or SQL92
    filter (``filtered``: a filter may walk the queue far past ``offset``), at most :data:`AT_ONCE_PULL_MESSAGES`
    messages, and the queue's entries and the records from ``offset`` in the hot local files. A pull refused
    before any read (no such topic or queue, an offset outside the queue) answers at once too."""
    if filtered or not 0 <= max_messages <= AT_ONCE_PULL_MESSAGES or long_poll_ms < 0:
        return False
    if queue_id < 0:
        return True  # refused before any read (InvalidArgument)
    try:
        rec = store.topics.get(topic)
    except MqStoreError:
        return True  # refused before any read (NotFound, InvalidArgument)
    if queue_id >= rec.queue_count:
        return True  # NotFound
    cq = store.queues.get(topic, queue_id)
    lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
    if offset < lo or offset > hi:
        return True  # OutOfRange
    if offset == hi:
        return long_poll_ms == 0  # nothing to read: answered at once, unless it waits for the next record
    try:
        return cq.is_hot(offset) and store.commitlog.is_hot(cq.entry(offset)[0])
    except MqStoreError:  # the queue changed under the look (retention): the read decides, on a thread
        return False


def records_at_once(store: MessageStore, physical_offsets: Sequence[int]) -> bool:
    """Whether ``store.get_message_raw`` (or ``get_message``, ``get_messages``) of each of ``physical_offsets``
    reads only the hot local log (CommitLog.is_hot: no cold file, no tier), so that an event loop may run it."""
    is_hot = store.commitlog.is_hot
    return all(is_hot(offset) for offset in physical_offsets)
