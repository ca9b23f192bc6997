"""Check-back: the service asks a producer group about transactions left OPEN too long.

A producer group keeps a CheckBack stream open (a :class:`CheckSession` per stream, registered in the
:class:`CheckHub`). The :class:`Checker` duty looks, every ``check_scan_interval_ms``, at every OPEN
transaction, oldest first:

  condition (ages by the store's timestamps and this service's clock, never the producer's)  action
  ----------------------------------------------------------------------------------------  -------------
  age < transaction_timeout_ms, or the last check < check_interval_ms ago                     skip
  checks_sent >= check_max                                                                    park it
  no open stream of its group                                                                 skip, not counted
  the group's rate limit (check_rate_per_s, a token bucket) is spent                          skip this round
  otherwise: send a CheckRequest on one of the group's streams (round robin)                  checks_sent + 1

Parking copies the halves to TRANS_CHECK_MAX_TIME_TOPIC (with TRANSACTION_CHECK_TIMES) and marks the
transaction PARKED (reported in Stats, ListOpen and the log event ``txn.parked``). A failure for one
transaction (the log unreachable while parking, say) is counted and logged, and the scan goes on with
the next one: progress never stops at one message (RocketMQ #9500).

An answer COMMIT or ROLLBACK resolves the transaction through the coordinator (by "check-back"); UNKNOWN
is recorded as the last answer. The answers of a stream are handled on that stream's reader thread.

Thread-safe: the hub's lock guards the sessions; a session's own lock its pending checks; the
checker's counters its lock. Time comes from the injected clock.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import transactions as tx
from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore.model import MessageIn, StoredMessage

from .config import TxnConfig
from .table import OPEN, PARKED, Txn, TxnTable

log = structlog.get_logger("mqstore.txn.checkback")
COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"
OUTBOX_LIMIT = 10_000  # checks queued on one stream; beyond it the stream is too slow: not sent, not counted


@dataclass(frozen=True, slots=True)
class Check:
    check_id: int
    txn_id: str
    topic: str
    check_times: int
    age_ms: int
    halves: list[StoredMessage]


class CheckSession:
    """One open CheckBack stream of a producer group."""

    def __init__(self, group: str):
        self.group = group
        self._outbox: queue.Queue[Check | None] = queue.Queue(OUTBOX_LIMIT)
        self._pending: dict[int, str] = {}
        self._counts_lock = threading.Lock()
        self.closed = False

    def offer(self, check: Check) -> bool:
        with self._counts_lock:
            if self.closed:
                return False
            try:
                self._outbox.put_nowait(check)
            except queue.Full:
                return False
            self._pending[check.check_id] = check.txn_id
            return True

    def next_check(self, timeout_s: float) -> Check | None:
        """The next check to send, None when closed (or nothing within ``timeout_s``: call again)."""
        try:
            return self._outbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def answered(self, check_id: int) -> str:
        """The transaction a check named; InvalidArgument for a check never sent on this stream."""
        with self._counts_lock:
            txn_id = self._pending.pop(check_id, None)
        if txn_id is None:
            raise InvalidArgument(f"check_id {check_id} was not sent on this stream (or was answered already); "
                                  f"answer each CheckRequest once, with its check_id")
        return txn_id

    def close(self) -> None:
        with self._counts_lock:
            self.closed = True
        try:
            self._outbox.put_nowait(None)
        except queue.Full:
            pass  # the reader of the outbox is gone or will see `closed`


class CheckHub:
    def __init__(self):
        self._counts_lock = threading.Lock()
        self._sessions: dict[str, list[CheckSession]] = {}
        self._turn = itertools.count()

    def open(self, group: str) -> CheckSession:
        session = CheckSession(group)
        with self._counts_lock:
            self._sessions.setdefault(group, []).append(session)
        log.info("checkback.stream_opened", group=group)
        return session

    def close(self, session: CheckSession) -> None:
        session.close()
        with self._counts_lock:
            sessions = self._sessions.get(session.group, [])
            if session in sessions:
                sessions.remove(session)
        log.info("checkback.stream_closed", group=session.group)

    def session_for(self, group: str) -> CheckSession | None:
        with self._counts_lock:
            sessions = self._sessions.get(group)
            return sessions[next(self._turn) % len(sessions)] if sessions else None

    def open_streams(self) -> int:
        with self._counts_lock:
            return sum(len(s) for s in self._sessions.values())

    def close_all(self) -> None:
        with self._counts_lock:
            sessions = [s for group in self._sessions.values() for s in group]
        for session in sessions:
            self.close(session)


class RateLimiter:
    """A token bucket per group: ``rate_per_s`` checks a second, bursts of ``rate_per_s``."""

    def __init__(self, rate_per_s: int, clock: Clock):
        self.rate, self.clock = rate_per_s, clock
        self._buckets: dict[str, tuple[float, int]] = {}

    def allow(self, group: str) -> bool:
        now = self.clock.now_ms()
        tokens, at = self._buckets.get(group, (float(self.rate), now))
        tokens = min(float(self.rate), tokens + (now - at) * self.rate / 1000)
        if tokens < 1:
            self._buckets[group] = (tokens, now)
            return False
        self._buckets[group] = (tokens - 1, now)
        return True


class Checker(Duty):
    def __init__(self, config: TxnConfig, table: TxnTable, hub: CheckHub, clock: Clock,
                 read_halves: Callable[[list[int]], list[StoredMessage]],
                 park: Callable[[str, list[MessageIn]], None]):
        super().__init__("txn-checker", interval_s=config.check_scan_interval_ms / 1000)
        self.config, self.table, self.hub, self.clock = config, table, hub, clock
        self._read_halves, self._park = read_halves, park
        self.limiter = RateLimiter(config.check_rate_per_s, clock)
        self._ids = itertools.count(1)
        self._counts_lock = threading.Lock()
        self.checks_sent = self.check_answers = self.check_failures = self.parked = 0

    def step(self) -> None:
        self.scan()

    def scan(self) -> int:
        """One pass over the OPEN transactions; the checks sent."""
        if not self.table.ready:
            return 0
        with self.table.lock:
            candidates = sorted((t for t in self.table.by_id.values() if t.state == OPEN),
                                key=lambda t: t.first_store_ms)
        sent = 0
        for txn in candidates:
            try:
                sent += self._visit(txn)
            except MqStoreError as exc:  # one transaction failing must not stop the scan
                with self._counts_lock:
                    self.check_failures += 1
                log.warning("checkback.failed", transaction_id=txn.txn_id, error=f"{type(exc).__name__}: {exc}")
        return sent

    def _visit(self, txn: Txn) -> int:
        now = self.clock.now_ms()
        cfg = self.config
        if now - txn.first_store_ms < cfg.transaction_timeout_ms:
            return 0
        if txn.last_check_ms and now - txn.last_check_ms < cfg.check_interval_ms:
            return 0
        if txn.checks_sent >= cfg.check_max:
            self._park_txn(txn)
            return 0
        session = self.hub.session_for(txn.group)
        if session is None or not self.limiter.allow(txn.group):
            return 0
        halves = self._read_halves([h.physical_offset for h in txn.halves])
        with self.table.lock:
            if txn.state != OPEN:
                return 0
            check = Check(next(self._ids), txn.txn_id, txn.topic, txn.checks_sent + 1, now - txn.first_store_ms,
                          halves)
            if not session.offer(check):
                return 0  # the stream closed or is too slow: not counted as checked
            txn.checks_sent += 1
            txn.last_check_ms = now
        with self._counts_lock:
            self.checks_sent += 1
        return 1

    def _park_txn(self, txn: Txn) -> None:
        with txn.guard:
            if txn.state != OPEN:
                return
            halves = self._read_halves([h.physical_offset for h in txn.halves])
            copies = []
            for half in halves:
                props = dict(half.record.properties)
                props[tx.PROPERTY_CHECK_TIMES] = str(txn.checks_sent)
                copies.append(MessageIn(half.record.body, properties=props, flag=half.record.flag,
                                        born_timestamp_ms=half.record.born_timestamp_ms, queue_id=0))
            self._park(tx.CHECK_MAX_TOPIC, copies)
            self.table.resolve(txn, PARKED, "check-back: no decision after check_max checks")
        with self._counts_lock:
            self.parked += 1
        log.warning("txn.parked", transaction_id=txn.txn_id, group=txn.group, checks_sent=txn.checks_sent,
                    last_answer=txn.last_answer, topic=tx.CHECK_MAX_TOPIC)

    def record_answer(self, txn_id: str, decision: str) -> None:
        txn = self.table.get(txn_id)
        with self._counts_lock:
            self.check_answers += 1
        if txn is not None:
            with self.table.lock:
                txn.last_answer = decision

    def note_failure(self, txn_id: str, exc: Exception) -> None:
        with self._counts_lock:
            self.check_failures += 1
        log.warning("checkback.answer_refused", transaction_id=txn_id, error=f"{type(exc).__name__}: {exc}")
