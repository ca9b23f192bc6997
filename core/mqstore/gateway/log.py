"""The commit log as the gateway sees it: one small interface, :class:`LogPort`, with two implementations.

  Cluster mode   the gateway is its own process (gateway_service): gateway_service.remote_log.RemoteLog
                 calls the CommitLog service over gRPC (DescribeTopic, CommitLogInternal.Append as writer
                 "gateway", the Consumer service)
  Local mode     the gateway runs inside the commit log process (mqstore-commitlog --gateway-port, as
                 RocketMQ 5's proxy runs inside its broker): :class:`LocalLog` calls the store and pop
                 consumption directly, with no gRPC hop

Everything else (validation, message ids, the topic cache, the client registry, check-back through the
Transaction service) is the same code in both modes: gateway_service.composition builds it on a
LogPort.

What LocalLog does is what the CommitLog service's servicers do with the same calls, minus the
conversions: ``topic`` is DescribeTopic's topic (NotFound for an unknown one); ``append`` is
CommitLogInternal.Append as writer "gateway" (mqstore.relayed: the producer's born host is stored), so a
replica refuses it with NotLeader as it refuses every write; ``pop`` is the Consumer service's PopService
(``current()`` raises NotLeader on a replica and Unavailable while a new leader rebuilds its in-flight
set).

Thread-safe: the store and pop consumption are; LocalLog holds nothing else.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from mqstore.errors import Unsupported
from mqstore.filters import TAG
from mqstore.model import AppendResult, MessageIn, TopicRecord
from mqstore.pop.receive import ReceiveResult
from mqstore.pop.service import AckOutcome, ChangeResult, PopService
from mqstore.pop.settings import GroupSettings
from mqstore.relayed import WRITER_GATEWAY

from .consuming import PopPort


class LogPort(Protocol):
    """What the gateway asks of the commit log."""

    pop: PopPort

    def topic(self, name: str) -> TopicRecord:
        """The topic (NotFound when there is none)."""
        ...

    def append(self, topic: str, messages: list[MessageIn]) -> Sequence[AppendResult]:
        """One batch, stored whole or not at all; one result per message, in order."""
        ...

    def recall(self, topic: str, msg_id: str) -> int:
        """CommitLog.RecallTimer: cancel the delayed message whose timer record ``msg_id`` names (the msg_id of its
        append); its due time. NotFound / FailedPrecondition as RecallTimer."""
        ...

    def appends_at_once(self) -> bool:
        """Whether ``append`` of a message that is neither delayed nor a transaction's returns without waiting
        (no other process, no fsync, no replicas to wait for), so that an event loop may call it."""
        ...


class LocalPop:
    """PopPort on the PopService of this process (``current()`` as the Consumer servicer uses it)."""

    def __init__(self, current: Callable[[], PopService]):
        self._current = current

    def receive(self, group: str, topic: str, *, invisible_duration_ms: int, filter_expression: str, batch_size: int,
                long_poll_ms: int, max_attempts: int, start: str, filter_type: str = TAG) -> ReceiveResult:
        return self._current().receive(group, topic, invisible_duration_ms=invisible_duration_ms, queue_id=None,
                                       filter_expression=filter_expression, filter_type=filter_type,
                                       batch_size=batch_size,
                                       long_poll_ms=long_poll_ms, max_attempts=max_attempts, start=start)

    def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[AckOutcome]:
        return list(self._current().ack(group, topic, list(receipt_handles)).outcomes)

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str,
                                  invisible_duration_ms: int) -> ChangeResult:
        return self._current().change_invisible_duration(group, topic, receipt_handle, invisible_duration_ms)

    def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> str:
        dead_letter_topic, _ = self._current().forward_to_dead_letter(group, topic, receipt_handle)
        return dead_letter_topic

    def group_settings(self, group: str) -> GroupSettings:
        return self._current().group_settings(group)


class StoreLike(Protocol):
    def describe_topic(self, name: str) -> tuple[TopicRecord, list]: ...

    def append(self, topic: str, messages: Sequence[MessageIn], *, system_writer: str | None = None,
               replication: str | None = None) -> Sequence[AppendResult]: ...

    def append_waits(self) -> bool: ...


class LocalLog:
    """LogPort in the commit log's own process (Local mode)."""

    def __init__(self, store: StoreLike, pop_current: Callable[[], PopService],
                 append: Callable[..., Sequence[AppendResult]] | None = None,
                 recall: Callable[[str, str], int] | None = None):
        """``append(topic, messages, writer=...)``: the commit log's way in that routes DELAY sends to its timer
        (mqstore.timer.scheduling.Scheduler.append); default: the store's append. ``recall``: its
        Scheduler.recall (None: no timer, a recall is Unsupported)."""
        self._store = store
        self._append = append
        self._recall = recall
        self.pop = LocalPop(pop_current)

    def topic(self, name: str) -> TopicRecord:
        return self._store.topic_admin.describe(name)[0]

    def append(self, topic: str, messages: list[MessageIn]) -> Sequence[AppendResult]:
        if self._append is not None:
            return self._append(topic, messages, writer=WRITER_GATEWAY)
        return self._store.append(topic, messages, system_writer=WRITER_GATEWAY)

    def appends_at_once(self) -> bool:
        return not self._store.append_waits()

    def recall(self, topic: str, msg_id: str) -> int:
        if self._recall is None:
            raise Unsupported("recall is not available here: this commit log runs no timer")
        return self._recall(topic, msg_id)
