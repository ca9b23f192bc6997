"""Receives and acks of RocketMQ 5 clients as mqstore's pop consumption (consumer.proto, mqstore.pop).

  v2 call                              pop call, and what the gateway decides
  ------------------------------------ -------------------------------------------------------------------
  ReceiveMessage                       Receive of the whole topic: ``message_queue.id`` is only a hint (the
                                       Node client always names queue 0), as the proxy pops its "broker
                                       acting queue"; batch at most receive_batch_max (32); invisible time
                                       the request's (auto_renew: auto_renew_invisible_ms, renewed in the
                                       background until acked: mqstore.gateway.renewal); long poll the
                                       request's clamped to [long_poll_min_ms, long_poll_max_ms] and to the
                                       client's deadline minus a reserve; max_attempts the gateway's
                                       max_delivery_attempts; a new group starts at the earliest message
  AckMessage                           Ack of the entries' handles: a handle that does not work any more
                                       (expired, acked, replaced, not this group's) is refused
  ChangeInvisibleDuration              ChangeInvisibleDuration: a new handle
  ForwardMessageToDeadLetterQueue      ForwardToDeadLetter

An ordered consumer group (mqstore.pop.ordered) needs nothing of the gateway but its settings reply:
``subscription.fifo`` is the group's ordered setting (:meth:`Consuming.ordered`); the commit log keeps the
order on every receive.

Receipt handles are the pop service's, passed through unchanged; the gateway checks that one parses and
belongs to the group and topic (mqstore.pop.handle) before it asks, so a garbage handle is refused as
INVALID_RECEIPT_HANDLE without a call. Filters: TAG expressions and SQL92 selectors (FilterType.SQL,
mqstore.filters.sql92, evaluated by pop on each record's properties); a malformed SQL92 expression is
ILLEGAL_FILTER_EXPRESSION naming its column.

Thread-safe: holds no state.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import structlog

from mqstore import filters, topics as topic_rules
from mqstore.errors import (FailedPrecondition, IllegalFilterExpression, IllegalInvisibleTime, InvalidArgument,
                            InvalidReceiptHandle, MqStoreError)
from mqstore.pop import handle as handles
from mqstore.pop.receive import MAX_INVISIBLE_MS, MIN_INVISIBLE_MS, START_EARLIEST, ReceiveResult
from mqstore.pop.service import AckOutcome, ChangeResult
from mqstore.pop.settings import GroupSettings

from .config import GatewayConfig
from .publishing import TopicCache
from .renewal import Renewals

log = structlog.get_logger("mqstore.gateway.consuming")

TAG, SQL = "TAG", "SQL"


class PopPort(Protocol):
    """The Consumer service as the gateway calls it (an adapter implements it over gRPC)."""

    def receive(self, group: str, topic: str, *, invisible_duration_ms: int, filter_expression: str, batch_size: int,
                long_poll_ms: int, max_attempts: int, start: str, filter_type: str = filters.TAG) -> ReceiveResult: ...

    def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[AckOutcome]: ...

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str,
                                  invisible_duration_ms: int) -> ChangeResult: ...

    def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> str: ...

    def group_settings(self, group: str) -> GroupSettings: ...


class Consuming:
    def __init__(self, config: GatewayConfig, topics: TopicCache, pop: PopPort, renewals: Renewals | None = None):
        """``renewals``: where receives with auto_renew are kept invisible (mqstore.gateway.renewal); None
        gives them auto_renew_invisible_ms and nothing more."""
        self.config, self.topics, self.pop, self.renewals = config, topics, pop, renewals

    def receive(self, group: str, topic: str, *, filter_type: str, expression: str, batch_size: int,
                invisible_ms: int | None, auto_renew: bool, long_poll_ms: int | None,
                time_left_ms: int | None, client_id: str = "") -> tuple[ReceiveResult, int]:
        """(what was received, the invisible time given). With ``auto_renew`` the deliveries are renewed
        for ``client_id`` until it acks them (or goes away)."""
        self._names(group, topic)
        pop_filter = self._filter(filter_type, expression)
        if batch_size < 0:
            raise InvalidArgument(f"batch_size is {batch_size}; it must be positive")
        if auto_renew:
            invisible_ms = self.config.auto_renew_invisible_ms
        elif invisible_ms is None:
            raise IllegalInvisibleTime("invisible_duration is required (a simple consumer's receive sets it)")
        invisible_ms = self._invisible(invisible_ms)
        result = self.pop.receive(group, topic, invisible_duration_ms=invisible_ms, filter_expression=expression,
                                  filter_type=pop_filter,
                                  batch_size=min(batch_size or self.config.receive_batch_max,
                                                 self.config.receive_batch_max),
                                  long_poll_ms=self.long_poll(long_poll_ms, time_left_ms),
                                  max_attempts=self.config.max_delivery_attempts, start=START_EARLIEST)
        if auto_renew and self.renewals is not None and result.deliveries:
            self.renewals.add(client_id, group, topic, result.deliveries)
        return result, invisible_ms

    @staticmethod
    def _filter(filter_type: str, expression: str) -> str:
        """The pop filter type of a v2 FilterType; an SQL92 expression is compiled here (cached), so a
        malformed one is ILLEGAL_FILTER_EXPRESSION with its column, as the proxy answers, before any call."""
        if filter_type in ("", TAG):
            return filters.TAG
        if filter_type != SQL:
            raise IllegalFilterExpression(f"filter type {filter_type} is not supported: TAG (\"*\", \"a || b\") "
                                          f"or SQL (SQL92 over the message's properties)")
        try:
            filters.compile_filter(expression)
        except InvalidArgument as exc:
            raise IllegalFilterExpression(str(exc)) from None
        return filters.SQL92

    def long_poll(self, asked_ms: int | None, time_left_ms: int | None) -> int:
        """The request's long poll clamped as the Java proxy clamps it, and ended before the client's deadline."""
        cfg = self.config
        poll_ms = min(max(asked_ms if asked_ms is not None else cfg.long_poll_max_ms, cfg.long_poll_min_ms),
                      cfg.long_poll_max_ms)
        if time_left_ms is not None:
            poll_ms = max(0, min(poll_ms, time_left_ms - 2 * cfg.long_poll_reserve_ms))
        return poll_ms

    def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[AckOutcome]:
        """One outcome per handle, in order; a handle that does not parse is refused without a call."""
        self._names(group, topic)
        outcomes: list[AckOutcome | None] = [None] * len(receipt_handles)
        sendable = []
        for index, text in enumerate(receipt_handles):
            try:
                handles.decode(group, topic, text)
                sendable.append(index)
            except InvalidArgument as exc:
                outcomes[index] = AckOutcome(text, "invalid", str(exc))
        if sendable:
            current = [self._current(group, receipt_handles[i]) for i in sendable]
            for index, outcome in zip(sendable, self.pop.ack(group, topic, current), strict=True):
                outcomes[index] = outcome
        return [o for o in outcomes if o is not None]

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> ChangeResult:
        self._names(group, topic)
        self._handle(group, topic, receipt_handle)
        invisible_ms = self._invisible(invisible_ms)
        try:
            return self.pop.change_invisible_duration(group, topic, self._current(group, receipt_handle),
                                                      invisible_ms)
        except FailedPrecondition as exc:
            raise InvalidReceiptHandle(f"the receipt handle no longer works: {exc}") from None

    def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> str:
        self._names(group, topic)
        self._handle(group, topic, receipt_handle)
        try:
            return self.pop.forward_to_dead_letter(group, topic, self._current(group, receipt_handle))
        except FailedPrecondition as exc:
            raise InvalidReceiptHandle(f"the receipt handle no longer works: {exc}") from None

    def ordered(self, group: str) -> bool:
        """Whether ``group`` is an ordered group (mqstore.pop.ordered), shown to its clients as
        subscription.fifo; False, logged, when the commit log cannot say now (the receives stay ordered
        all the same: the commit log decides them)."""
        try:
            return self.pop.group_settings(group).ordered
        except MqStoreError as exc:
            log.warning("gateway.group_settings_unknown", group=group, error=f"{type(exc).__name__}: {exc}")
            return False

    def _current(self, group: str, receipt_handle: str) -> str:
        """The handle that works now for the one the client holds (renewed ones were replaced); its
        renewal ends here."""
        return self.renewals.take(group, receipt_handle) if self.renewals is not None else receipt_handle

    def _names(self, group: str, topic: str) -> None:
        topic_rules.validate_group_name(group)
        self.topics.get(topic)

    @staticmethod
    def _handle(group: str, topic: str, text: str) -> None:
        try:
            handles.decode(group, topic, text)
        except InvalidArgument as exc:
            raise InvalidReceiptHandle(str(exc)) from None

    @staticmethod
    def _invisible(invisible_ms: int) -> int:
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise IllegalInvisibleTime(f"invisible_duration is {invisible_ms} ms; it must be between "
                                       f"{MIN_INVISIBLE_MS} ms and {MAX_INVISIBLE_MS} ms (12 h)")
        return invisible_ms
