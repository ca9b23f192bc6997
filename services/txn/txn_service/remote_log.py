"""The Transaction service's TxnLog (mqstore.txn.log) over gRPC, for Cluster mode: CommitLogInternal.Append
as writer "txn" (with the commit log's internal token), DescribeTopic, GetMessages, GetStoreInfo and Tail of
the CommitLog service, through one CommitLogClient (which follows a replication group's leader).

``gate()`` runs before every append and in ``check_writable``: with ``--etcd-endpoints`` it is
TxnElection.check_active (a standby or a fenced old active writes nothing); by default it lets all through.

Thread-safe (the CommitLogClient is); the owner closes the client.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mqstore.model import AppendResult, MessageIn, MessageLookup, TopicRecord
from mqstore.topics import OWNER_TRANSACTION
from mqstore.txn.log import FOLLOWED_TOPICS, FOLLOWED_TX_TYPES, HOLD_NAME

from mqstore_rpc.commitlog_client import CommitLogClient, TailCall


class RemoteTxnLog:
    def __init__(self, client: CommitLogClient, internal_token: str, linger_ms: int,
                 gate: Callable[[], None] = lambda: None, hold_name: str = HOLD_NAME):
        """``hold_name``: the retention hold its Tail names (one of an active/standby group: its own,
        mqstore.txn.log.instance_hold)."""
        self._client, self._token, self._linger_ms, self.gate = client, internal_token, linger_ms, gate
        self.hold_name = hold_name

    def append(self, topic: str, messages: Sequence[MessageIn]) -> Sequence[AppendResult]:
        self.gate()
        return self._client.internal_append(topic, messages, writer=OWNER_TRANSACTION, token=self._token)

    async def append_many_async(self, batches):
        """Several topics' batches in one call, each with its own results or error (LoopAppendBatcher's
        ``append_many``: CommitLogClient.internal_append_batches_async)."""
        self.gate()
        return await self._client.internal_append_batches_async(batches, writer=OWNER_TRANSACTION, token=self._token)

    def topic(self, name: str) -> TopicRecord:
        return self._client.topic(name)

    def get_messages_batch(self, physical_offsets: Sequence[int]) -> list[MessageLookup]:
        return self._client.get_messages_batch(physical_offsets)

    def max_physical_offset(self) -> int:
        return self._client.store_info().max_physical_offset

    def check_writable(self) -> None:
        self.gate()  # the client sends writes to the group's leader; the commit log answers for itself

    def append_waits(self) -> bool:
        return True  # a round trip to the commit log

    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int) -> TailCall:
        # linger: once caught up, one frame per linger_ms instead of one per append (fewer wake-ups on
        # both sides; the coordinator changes states itself and waits for the follower only at start)
        return self._client.tail(from_physical_offset, max_frame_bytes=max_frame_bytes, heartbeat_ms=heartbeat_ms,
                                 topics=FOLLOWED_TOPICS, tx_types=FOLLOWED_TX_TYPES, linger_ms=self._linger_ms,
                                 hold_retention_as=self.hold_name)
