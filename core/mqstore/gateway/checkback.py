"""Check-back across two streams: the Transaction service's CheckBack stream of a producer group, and the
Telemetry stream of a RocketMQ 5 producer.

RocketMQ 5 has no producer group on the wire; like the Java proxy, the gateway uses the topic as the
producer group (transactional sends are prepared with ``producer_group = topic``). For every topic that a
reachable producer publishes (one with an open Telemetry stream), one :class:`TopicChecks` duty keeps a
CheckBack stream open with ``hello(producer_group = topic)``; a topic nobody reachable publishes has no
stream, so the Transaction service does not count its checks (txn.proto: "a check counts only when it
was sent on an open stream") and asks again once a producer is back. That is what lets a Python
producer, which re-opens its Telemetry stream only when its next settings write fails (up to 300 s after
a gateway restart), still be asked: until then nothing is sent and nothing is counted.

  on a CheckRequest of topic T                          action
  ----------------------------------------------------- ----------------------------------------------
  a reachable producer of T (round robin)               RecoverTransaction onto its Telemetry outbox;
                                                        the check is pending under its transaction id
  none (it went away since), or its outbox is full      left unanswered, logged gateway.check_unrouted:
                                                        the Transaction service asks again later

  on EndTransaction(topic, transaction id, decision, from a check?)            action
  ---------------------------------------------------------------------------- ---------------------------
  from a check, the check pending, of that topic, and its stream open           CheckAnswer on that stream
  COMMIT / ROLLBACK otherwise (the client's own, or the stream has gone)        Commit / Rollback directly,
                                                                                naming the topic
  UNKNOWN otherwise                                                             nothing (asked again later)

Authorization follows the transaction, never the name a client gives: the gateway checked the client's PUB
on the topic its EndTransaction names (mqstore_rpc.permissions), so that topic must be the transaction's
own. A pending check answers only an EndTransaction naming the check's topic; a direct Commit or Rollback
names the topic (and the producer group, the topic: see above) and the Transaction service refuses a
transaction prepared otherwise as an unknown id (txn.proto, EndRequest). A check goes only to a producer
whose session publishes its topic (ClientRegistry.producer_for): its settings declared it, checked PUB on
it for the session's user, and the session is bound to that user (mqstore.gateway.clients).

Thread-safe: ``_lock`` guards the duties map, the pending checks and the counters. The duties run on
their own threads; ``resolve`` runs on the caller's.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import structlog

from mqstore.background import Duty
from mqstore.model import StoredMessage

from .clients import ClientRegistry

log = structlog.get_logger("mqstore.gateway.checkback")
COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"
REOPEN_PAUSE_S = 0.5    # after a CheckBack stream ended cleanly (the Transaction service stopping), before re-opening
STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Check:
    check_id: int
    transaction_id: str
    topic: str
    halves: list[StoredMessage]


@dataclass(frozen=True, slots=True)
class RecoverTransaction:
    """The command for a producer's Telemetry stream: decide about this transaction."""
    transaction_id: str
    message: StoredMessage   # its (first) half message
    topic: str


class CheckStream(Protocol):
    """One CheckBack stream of the Transaction service (an adapter implements it)."""

    def checks(self) -> Iterator[Check]:
        """The checks as they come; ends when the stream ends, raises MqStoreError when it fails."""

    def answer(self, check_id: int, decision: str) -> bool:
        """Queue a CheckAnswer; False when the stream is closed already."""

    def cancel(self) -> None: ...


class Resolver(Protocol):
    """Ends a transaction prepared on ``topic`` (refused as an unknown id if it was not)."""

    def commit(self, transaction_id: str, topic: str) -> None: ...

    def rollback(self, transaction_id: str, topic: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Pending:
    check_id: int
    stream: CheckStream
    topic: str


class TopicChecks(Duty):
    """Keeps one CheckBack stream of one topic open and hands its checks to the relay; re-opens it with
    backoff when it fails (the Transaction service restarting or unreachable)."""

    def __init__(self, topic: str, open_stream: Callable[[str], CheckStream], relay: "CheckRelay", retry_max_s: float):
        super().__init__(f"gateway-checkback-{topic}"[:64], interval_s=REOPEN_PAUSE_S, backoff_max_s=retry_max_s)
        self.topic, self._open, self._relay = topic, open_stream, relay
        self._stream: CheckStream | None = None
        self._stream_lock = threading.Lock()

    def step(self) -> None:
        stream = self._open(self.topic)
        with self._stream_lock:
            if self.stopping:
                stream.cancel()
                return
            self._stream = stream
        log.info("gateway.checkback_opened", topic=self.topic)
        try:
            for check in stream.checks():
                self._relay.deliver(stream, check)
        finally:
            stream.cancel()
            with self._stream_lock:
                self._stream = None

    def on_stop(self) -> None:
        with self._stream_lock:
            if self._stream is not None:
                self._stream.cancel()


class CheckRelay:
    def __init__(self, registry: ClientRegistry, open_stream: Callable[[str], CheckStream], resolver: Resolver, *,
                 max_topics: int, pending_max: int, retry_max_ms: int):
        self.registry, self._open, self.resolver = registry, open_stream, resolver
        self.max_topics, self.pending_max, self.retry_max_s = max_topics, pending_max, retry_max_ms / 1000
        self._lock = threading.Lock()
        self._duties: dict[str, TopicChecks] = {}
        self._pending: collections.OrderedDict[str, _Pending] = collections.OrderedDict()
        self._closed = False
        self.relayed = self.unrouted = self.answered_on_stream = self.resolved_directly = 0

    # ---- which topics have a stream ------------------------------------------------------------------
    def sync(self) -> None:
        """One CheckBack stream per topic a reachable producer publishes, and none for the others."""
        wanted = sorted(self.registry.published_topics())
        if len(wanted) > self.max_topics:
            log.warning("gateway.checkback_topics_capped", topics=len(wanted), limit=self.max_topics)
            wanted = wanted[:self.max_topics]
        started, stopped = [], []
        with self._lock:
            if self._closed:
                return
            for topic in wanted:
                if topic not in self._duties:
                    self._duties[topic] = duty = TopicChecks(topic, self._open, self, self.retry_max_s)
                    started.append(duty)
            for topic in set(self._duties) - set(wanted):
                stopped.append(self._duties.pop(topic))
        for duty in started:
            duty.start()
        for duty in stopped:
            duty.stop(STOP_TIMEOUT_S)
            log.info("gateway.checkback_closed", topic=duty.topic, why="no reachable producer publishes it")

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._duties)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            duties, self._duties = list(self._duties.values()), {}
        for duty in duties:
            duty.stop(STOP_TIMEOUT_S)

    def problem(self) -> str:
        with self._lock:
            duties = list(self._duties.values())
        return next((p for d in duties if (p := d.problem())), "")

    # ---- a check arrives -----------------------------------------------------------------------------
    def deliver(self, stream: CheckStream, check: Check) -> None:
        target = self.registry.producer_for(check.topic)
        if target is not None and check.halves:
            client_id, outbox = target
            with self._lock:
                self._pending[check.transaction_id] = _Pending(check.check_id, stream, check.topic)
                self._pending.move_to_end(check.transaction_id)
                while len(self._pending) > self.pending_max:
                    self._pending.popitem(last=False)
            if outbox.put(RecoverTransaction(check.transaction_id, check.halves[0], check.topic)):
                with self._lock:
                    self.relayed += 1
                log.info("gateway.check_relayed", transaction_id=check.transaction_id, topic=check.topic,
                         client_id=client_id)
                return
            with self._lock:
                self._pending.pop(check.transaction_id, None)
        with self._lock:
            self.unrouted += 1
        # Not answered: the Transaction service asks again after its check interval.
        log.warning("gateway.check_unrouted", transaction_id=check.transaction_id, topic=check.topic,
                    why="no reachable producer of the topic" if target is None else
                    "the producer's Telemetry stream is not read" if check.halves else "the check names no half")

    # ---- an answer arrives ---------------------------------------------------------------------------
    def resolve(self, transaction_id: str, decision: str, from_check: bool, topic: str) -> None:
        """The producer's decision (EndTransaction naming ``topic``); errors of a direct Commit/Rollback are
        raised. A pending check of another topic is not this answer's (it stays pending)."""
        with self._lock:
            pending = self._pending.get(transaction_id)
            if pending is not None and pending.topic == topic:
                del self._pending[transaction_id]
            else:
                pending = None
        if from_check and pending is not None and pending.stream.answer(pending.check_id, decision):
            with self._lock:
                self.answered_on_stream += 1
            log.info("gateway.check_answered", transaction_id=transaction_id, decision=decision)
            return
        if decision == COMMIT:
            self.resolver.commit(transaction_id, topic)
        elif decision == ROLLBACK:
            self.resolver.rollback(transaction_id, topic)
        else:
            log.info("gateway.check_unknown", transaction_id=transaction_id,
                     why="the producer does not know yet; the Transaction service asks again later")
            return
        with self._lock:
            self.resolved_directly += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"relayed": self.relayed, "unrouted": self.unrouted, "answered_on_stream": self.answered_on_stream,
                    "resolved_directly": self.resolved_directly, "pending": len(self._pending),
                    "streams": len(self._duties)}
