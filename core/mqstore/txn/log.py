"""The commit log as the Transaction service sees it: one small interface, :class:`TxnLog`, with two
implementations (as the gateway's mqstore.gateway.log.LogPort).

  Cluster mode   the Transaction service is its own process (txn_service): txn_service.remote_log
                 .RemoteTxnLog calls the CommitLog service over gRPC (CommitLogInternal.Append as writer
                 "txn", DescribeTopic, GetMessages, GetStoreInfo, Tail)
  Local mode     the Transaction service runs inside the commit log process (mqstore-commitlog --txn-port,
                 as RocketMQ's TransactionalMessageService runs inside its broker): :class:`LocalTxnLog`
                 calls the store directly, with no gRPC hop and no second process

Everything else (coordinator, follower, checker, in-doubt resolver, OP batching, checkpoints) is the same
code in both modes: txn_service.composition builds it on a TxnLog.

What LocalTxnLog does is what the CommitLog service's servicers do with the same calls, minus the
conversions: ``append`` is CommitLogInternal.Append as writer "txn" (the store's rules say what "txn" may
write); ``topic`` is DescribeTopic's topic (NotFound for an unknown one); ``get_messages_batch`` is
GetMessages (in chunks of the store's limit); ``max_physical_offset`` is GetStoreInfo's; ``tail`` is the
Tail servicer's call of ``mqstore.tailing.tail`` with the Transaction service's filter (:data:`FOLLOWED_TOPICS`,
COMMIT records) and its retention hold (:data:`HOLD_NAME`). A local Tail stream ends when cancelled, at the
latest one heartbeat later (the store's tail looks at ``is_active`` between frames, as for a gRPC stream).
``check_writable`` is the store's gate: NotLeader on a replica, as its store answers every write. The
coordinator asks it before Prepare, Commit and Rollback, so the service of a replica decides nothing (its
table follows the leader's records through the replicated log; a Rollback, which writes only an OP record
later, would otherwise be decided there and never reach the log).

Thread-safe: the store is; LocalTxnLog holds nothing else, and each LocalTail is one follower's.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, Sequence

from mqstore import tailing
from mqstore.errors import DataLoss, Unavailable
from mqstore.follow import TailStream
from mqstore.format.record import SYSFLAG_TX_COMMIT
from mqstore.model import (TAIL_AT_OFFSET, TAIL_EARLIEST, AppendResult, MessageIn, MessageLookup, StoreInfo,
                           StoredMessage, TailFrame, TopicRecord)
from mqstore.limits import MAX_GET_MESSAGES
from mqstore.topics import OWNER_TRANSACTION

from . import records as tx

FOLLOWED_TOPICS = (tx.HALF_TOPIC, tx.OP_TOPIC, tx.CHECK_MAX_TOPIC)
FOLLOWED_TX_TYPES = (SYSFLAG_TX_COMMIT,)
HOLD_NAME = "txn"  # the commit log holds retention below the follower's position under this name


def instance_hold(instance_id: str) -> str:
    """The hold of one Transaction service of an active/standby group: ``txn-<id>``, so that the two do not
    share one hold (the lower one's position would be lost each time the other's stream refreshed it)."""
    return f"{HOLD_NAME}-{instance_id}"


class TxnLog(Protocol):
    """What the Transaction service asks of the commit log. Errors are mqstore errors (Unavailable,
    NotLeader, NotFound, OutOfRange, ...)."""

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        """One batch as writer "txn", stored whole or not at all; one result per message, in order."""
        ...

    def topic(self, name: str) -> TopicRecord:
        """The topic (NotFound when there is none)."""
        ...

    def get_messages_batch(self, physical_offsets: Sequence[int]) -> list[MessageLookup]:
        """Each offset's message or why there is none, in order."""
        ...

    def max_physical_offset(self) -> int:
        """The end of the log (GetStoreInfo.max_physical_offset)."""
        ...

    def check_writable(self) -> None:
        """Raises (NotLeader, Unavailable) when the log takes no writes from this service now."""
        ...

    def append_waits(self) -> bool:
        """Whether an append now waits for anything but this process's own work (a round trip, a flush, a
        replica): Local mode's Transact answers frames on the event loop only while it does not."""
        ...

    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int) -> TailStream:
        """The follower's stream (mqstore.follow.TailSource): records of FOLLOWED_TOPICS and every COMMIT
        record, retention held below its start as HOLD_NAME, linger as configured."""
        ...


def read_halves(txn_log: TxnLog, offsets: list[int]) -> list[StoredMessage]:
    """The half messages at ``offsets`` (the checker's); one that cannot be read is DataLoss, or Unavailable when
    it lies past the end the node asked serves (not yet visible there: MessageLookup.beyond_end)."""
    out = []
    for offset, lookup in zip(offsets, txn_log.get_messages_batch(offsets), strict=True):
        if lookup.message is None and lookup.beyond_end:
            raise Unavailable(f"half message at physical offset {offset} is not readable yet on the commit log node "
                              f"asked ({lookup.missing}); retry shortly")
        if lookup.message is None:
            raise DataLoss(f"half message at physical offset {offset} cannot be read: {lookup.missing}")
        out.append(lookup.message)
    return out


class WriteGate(Protocol):
    def check_writable(self) -> None: ...


class StoreLike(Protocol):
    gate: WriteGate

    def append(self, topic: str, messages: Sequence[MessageIn], *, system_writer: str | None = None,
               replication: str | None = None) -> Sequence[AppendResult]: ...

    def describe_topic(self, name: str) -> tuple[TopicRecord, list]: ...

    def get_messages(self, physical_offsets: Sequence[int], raw: bool = False) -> list[MessageLookup]: ...

    def store_info(self) -> StoreInfo: ...

    def tail(self, start: str, from_physical_offset: int, topics: Sequence[str], max_frame_bytes: int,
             heartbeat_ms: int, is_active: Callable[[], bool], tx_types: Sequence[int] = (),
             hold_retention_as: str = "", linger_ms: int = 0) -> Iterator[TailFrame]: ...


class LocalTail:
    """One Tail on the store in this process: iterate once; ``cancel()`` from any thread ends it (the
    store's tail sees it before its next frame or heartbeat)."""

    def __init__(self, open_frames: Callable[[Callable[[], bool]], Iterator[TailFrame]]):
        self._active = True
        self._frames = open_frames(self._is_active)

    def _is_active(self) -> bool:
        return self._active

    def __iter__(self) -> Iterator[TailFrame]:
        try:
            yield from self._frames
        finally:
            self._frames.close()  # type: ignore[attr-defined]  # a generator: ends the store's loop now

    def cancel(self) -> None:
        self._active = False


class LocalTxnLog:
    """TxnLog in the commit log's own process (Local mode)."""

    def __init__(self, store: StoreLike, linger_ms: int):
        self._store = store
        self._linger_ms = linger_ms

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        # a list, as the client's: the appender slices the results of a merged batch between its callers
        return list(self._store.append(topic, messages, system_writer=OWNER_TRANSACTION))

    def topic(self, name: str) -> TopicRecord:
        return self._store.topic_admin.describe(name)[0]

    def get_messages_batch(self, physical_offsets: Sequence[int]) -> list[MessageLookup]:
        out: list[MessageLookup] = []
        for first in range(0, len(physical_offsets), MAX_GET_MESSAGES):
            out.extend(self._store.get_messages(physical_offsets[first:first + MAX_GET_MESSAGES]))
        return out

    def max_physical_offset(self) -> int:
        return self._store.store_info().max_physical_offset

    def check_writable(self) -> None:
        self._store.gate.check_writable()  # a replica: NotLeader, as its store answers every write

    def append_waits(self) -> bool:
        """Whether an append waits now for a flush or replicas (the store's SYNC modes)."""
        return self._store.append_waits()

    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int) -> LocalTail:
        start = TAIL_EARLIEST if from_physical_offset is None else TAIL_AT_OFFSET
        return LocalTail(lambda is_active: tailing.tail(
            self._store, start, from_physical_offset or 0, list(FOLLOWED_TOPICS), max_frame_bytes, heartbeat_ms,
            is_active=is_active, tx_types=FOLLOWED_TX_TYPES, hold_retention_as=HOLD_NAME, linger_ms=self._linger_ms,
            hold_durable=True))  # in the commit log's own process: the internal identity (retention_holds)
