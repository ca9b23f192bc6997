"""Check-back streams: a producer group keeps a CheckBack stream open, the service sends it checks and
applies its answers. The servicer only converts messages: it hands :meth:`CheckBack.open` the
stream's incoming answers (domain objects) and sends what :meth:`CheckSession.checks` yields.

  who                         what, on which thread
  --------------------------- ------------------------------------------------------------------------------
  the Checker (checker.py)    offers due checks to a session of the group (its outbox, bounded)
  the stream's handler        yields the session's checks; each is counted as sent (checks_sent + 1) as it
                              goes out, and dropped instead if an answer or a decision came first
  a reader (Workers           reads the stream's answers. An answer COMMIT or ROLLBACK stops all further
  ``txn-checkback-reader``)   checks of the transaction at once (Txn.deciding, under the table's lock, before
                              anything else) and is handed to a decider; UNKNOWN is recorded (checks go on)
  a decider (Workers          applies the decision through the coordinator (by "check-back"): a commit's append,
  ``txn-check-answer``)       never on the reader; a rollback does not wait for its OP record (nobody waits for
                              the answer), and the transaction is ROLLED_BACK, no check candidate, meanwhile;
                              a refusal (resolved the other way, the log away) is counted and logged, and checks
                              resume if the transaction is still open

Which stream: a check goes to a session of its transaction's producer group whose ``allows(topic)``
(the stream's user may PUB the transaction's topic, with authentication on; the servicer gives it), round
robin among them; none allows it: not offered (waits, uncounted, as with no stream). A stream's answers
may name only checks sent on it, so a stream never decides a transaction it was not shown.

Answers of one stream are applied concurrently (``check_answer_workers``). A reader waits while every
decider is busy and the queue is full: back-pressure on that stream, never an unbounded backlog. At most
``max_check_streams`` streams are open at once (more: RESOURCE_EXHAUSTED). A first message that is not
a hello, or an answer naming no check sent on the stream, ends it with INVALID_ARGUMENT.

Thread-safe: the hub's lock guards the sessions; a session's own lock its pending checks and failure.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

import structlog

from mqstore import topics as topic_rules
from mqstore import waits
from mqstore.background import Workers
from mqstore.errors import InvalidArgument, MqStoreError, ResourceExhausted
from mqstore.model import StoredMessage

log = structlog.get_logger("mqstore.txn.checkback")
COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"
OUTBOX_LIMIT = 10_000  # checks queued on one stream; beyond it the stream is too slow: not sent, not counted
POLL_S = 0.2           # how often a stream's handler looks whether its stream is still active
SUBMIT_WAIT_S = 3600.0  # a reader waits this long for a free decider (back-pressure), then ends its stream


@dataclass(frozen=True, slots=True)
class Check:
    check_id: int
    txn_id: str
    topic: str
    check_times: int
    age_ms: int
    halves: list[StoredMessage]


@dataclass(frozen=True, slots=True)
class Answer:
    check_id: int
    decision: str  # COMMIT, ROLLBACK or UNKNOWN


def _anything(topic: str) -> bool:
    return True


class CheckSession:
    """One open CheckBack stream of a producer group; ``allows(topic)``: whether its checks may carry a
    transaction of ``topic`` (its user's PUB on it)."""

    def __init__(self, group: str, on_send: Callable[[Check], bool], allows: Callable[[str], bool] = _anything):
        self.group, self.allows = group, allows
        self._on_send = on_send
        self._outbox: queue.Queue[Check | None] = queue.Queue(OUTBOX_LIMIT)
        self._pending: dict[int, str] = {}
        self._lock = threading.Lock()
        self.closed = False
        self.failure: MqStoreError | None = None

    def offer(self, check: Check) -> bool:
        with self._lock:
            if self.closed:
                return False
            try:
                self._outbox.put_nowait(check)
            except queue.Full:
                return False
            self._pending[check.check_id] = check.txn_id
            return True

    def checks(self, is_active: Callable[[], bool]) -> Iterator[Check]:
        """The checks to send, while the stream is active and the session open; then raises the failure
        that ended the session, if any. A check whose transaction got an answer or a decision while it
        was queued is dropped (not sent, not counted)."""
        while is_active() and not self.closed:
            check = self.take(POLL_S)
            if check is not None:
                yield check
        with self._lock:
            failure = self.failure
        if failure is not None:
            raise failure

    def take(self, timeout_s: float) -> Check | None:
        """The next check to send, counted as sent; None when there is none within ``timeout_s`` (or it
        was dropped, or the session closed)."""
        try:
            with waits.waiting():  # a CheckBack stream waits most of its life: its handler thread does not count
                check = self._outbox.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return check if check is not None and self._on_send(check) else None

    def answered(self, check_id: int) -> str:
        """The transaction a check named; InvalidArgument for a check never sent on this stream."""
        with self._lock:
            txn_id = self._pending.pop(check_id, None)
        if txn_id is None:
            raise InvalidArgument(f"check_id {check_id} was not sent on this stream (or was answered already); "
                                  f"answer each CheckRequest once, with its check_id")
        return txn_id

    def fail(self, exc: MqStoreError) -> None:
        with self._lock:
            self.failure = self.failure or exc
        self.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
        try:
            self._outbox.put_nowait(None)
        except queue.Full:
            pass  # the handler reading the outbox sees `closed` within POLL_S


class CheckHub:
    """The open sessions by group; at most ``max_streams`` at once."""

    def __init__(self, max_streams: int = 1 << 30):
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._sessions: dict[str, list[CheckSession]] = {}
        self._turn = itertools.count()

    def open(self, group: str, on_send: Callable[[Check], bool] = lambda check: True,
             allows: Callable[[str], bool] = _anything) -> CheckSession:
        session = CheckSession(group, on_send, allows)
        with self._lock:
            count = sum(len(s) for s in self._sessions.values())
            if count >= self.max_streams:
                raise ResourceExhausted(f"{count} CheckBack streams are open, the limit max_check_streams; close "
                                        f"idle producers' streams (one per producer is enough) or raise the limit")
            self._sessions.setdefault(group, []).append(session)
        log.info("checkback.stream_opened", group=group)
        return session

    def close(self, session: CheckSession) -> None:
        session.close()
        with self._lock:
            sessions = self._sessions.get(session.group, [])
            if session not in sessions:
                return
            sessions.remove(session)
        log.info("checkback.stream_closed", group=session.group)

    def session_for(self, group: str, topic: str) -> CheckSession | None:
        """A session of ``group`` that may carry a check of ``topic`` (round robin), or None."""
        with self._lock:
            sessions = list(self._sessions.get(group, ()))
            turn = next(self._turn)
        allowed = [s for s in sessions if s.allows(topic)]  # outside the lock: may ask the authority
        return allowed[turn % len(allowed)] if allowed else None

    def open_streams(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._sessions.values())

    def close_all(self) -> None:
        with self._lock:
            sessions = [s for group in self._sessions.values() for s in group]
        for session in sessions:
            self.close(session)


class AnswerSink(Protocol):
    """What CheckBack needs of the checker (checker.Checker): counting sends, recording answers."""

    def on_send(self, check: Check) -> bool: ...

    def record_answer(self, txn_id: str, decision: str) -> bool: ...

    def answer_done(self, txn_id: str, error: MqStoreError | None) -> None: ...


class CheckBack:
    """The streams' readers and the answers' deciders (see the module docstring)."""

    def __init__(self, hub: CheckHub, sink: AnswerSink, decide: Callable[[str, str], object], *, max_streams: int,
                 answer_workers: int, max_queued_answers: int, check_ready: Callable[[], None] = lambda: None):
        """``check_ready()`` raises (Unavailable) while the service cannot take a stream yet (recovering:
        Coordinator.check_ready)."""
        self.hub, self.sink, self._decide, self._check_ready = hub, sink, decide, check_ready
        self.readers = Workers("txn-checkback-reader", workers=max_streams, max_queued=max_streams)
        self.deciders = Workers("txn-check-answer", workers=answer_workers, max_queued=max_queued_answers)

    def start(self) -> None:
        self.readers.start()
        self.deciders.start()

    def stop(self, timeout_s: float) -> None:
        """Close every stream, then let the readers end and the deciders finish what they hold."""
        self.hub.close_all()
        self.readers.stop(timeout_s)
        self.deciders.stop(timeout_s)

    def problem(self) -> str:
        return self.readers.problem() or self.deciders.problem()

    def open(self, group: str, incoming: Iterable[Answer], allows: Callable[[str], bool] = _anything) -> CheckSession:
        """A session for a stream of producer group ``group`` (a valid group name; the service ready) whose
        answers are ``incoming`` (read on a reader thread; an iteration that ends means the producer went
        away), carrying checks of the topics ``allows``."""
        topic_rules.validate_group_name(group)
        self._check_ready()
        session = self.hub.open(group, self.sink.on_send, allows)
        try:
            self.readers.submit(lambda: self._read(session, incoming), timeout_s=0)
        except MqStoreError:
            self.hub.close(session)
            raise
        return session

    def close(self, session: CheckSession) -> None:
        """The stream ended (its handler returns): the session is closed and unregistered."""
        self.hub.close(session)

    def _read(self, session: CheckSession, incoming: Iterable[Answer]) -> None:
        try:
            for answer in incoming:
                txn_id = session.answered(answer.check_id)
                if self.sink.record_answer(txn_id, answer.decision):  # checks of it stop here, at once
                    self._hand_over(txn_id, answer.decision)
                if session.closed:
                    return
        except MqStoreError as exc:
            session.fail(exc)
        finally:
            self.hub.close(session)

    def _hand_over(self, txn_id: str, decision: str) -> None:
        try:
            self.deciders.submit(lambda: self._apply(txn_id, decision), SUBMIT_WAIT_S)
        except MqStoreError as exc:  # stopping, or no decider free for an hour: checks of it resume later
            self.sink.answer_done(txn_id, exc)
            raise

    def _apply(self, txn_id: str, decision: str) -> None:
        error = None
        try:
            self._decide(txn_id, decision)
        except MqStoreError as exc:  # already resolved the other way, the log away: counted; checked again later
            error = exc
        finally:  # also after a bug (Workers reports it): the transaction must not stay "deciding"
            self.sink.answer_done(txn_id, error)
