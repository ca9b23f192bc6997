"""The appends of one AppendStream call (no grpc here): at most the store's ``max_stream_messages``
messages in all (StoreConfig). An item that would pass the limit is refused (InvalidArgument) before any of
its messages is read; the items before it stay stored, and the message says so.

Not thread-safe: one call's handler owns it.
"""

from __future__ import annotations

from mqstore.errors import InvalidArgument
from mqstore.store import MessageStore


class StreamAppends:
    """Counts one stream's messages against the limit and appends each item to ``store``."""

    def __init__(self, store: MessageStore, append=None):
        """``append(topic, messages, replication)``: how an item is appended (default: ``store.append``; the
        CommitLog's is the timer's Scheduler.append, which routes delayed batches)."""
        self._store = store
        self._append = append or (lambda topic, messages, replication: store.append(topic, messages,
                                                                                     replication=replication))
        self._limit = store.config.max_stream_messages
        self.stored = 0
        self.batches: list = []   # each item's AppendResults, in order

    def admit(self, count: int) -> None:
        """Whether an item of ``count`` messages may follow: InvalidArgument when it would pass the limit."""
        if self.stored + count > self._limit:
            raise InvalidArgument(
                f"AppendStream carries at most {self._limit} messages (server setting max_stream_messages); this "
                f"item would make it {self.stored + count}. The {self.stored} messages of "
                f"the earlier items are stored; start a new stream for the rest")

    def append(self, topic: str, messages, *, replication: str | None = None) -> None:
        """Append an admitted item (what MessageStore.append takes)."""
        self.batches.append(self._append(topic, messages, replication))
        self.stored += len(self.batches[-1])
