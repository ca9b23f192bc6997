"""The check loop: the :class:`Checker` duty looks, every ``check_scan_interval_ms``, at every OPEN
transaction, oldest first:

  condition (ages by the store's timestamps and this service's clock, never the producer's)  action
  ----------------------------------------------------------------------------------------  -------------
  an append's outcome unknown, or an answer COMMIT/ROLLBACK being applied (Txn.deciding)      skip
  age < the first-check delay: the largest CHECK_IMMUNITY_TIME_IN_SECONDS of its messages     skip
  (RocketMQ's per-message property), else transaction_timeout_ms
  the last check < check_interval_ms ago                                                      skip
  checks_sent >= check_max                                                                    park it
  no open stream of its group whose user may PUB its topic                                    skip, not counted
  the group's rate limit (check_rate_per_s, a token bucket) is spent                          skip this round
  otherwise: offer a CheckRequest to one of the group's streams (round robin)                 sent: + 1

A check counts (checks_sent + 1) when its stream's handler sends it (checkback.CheckSession.checks),
so a check dropped because an answer came first, or never sent because the stream closed, does not.

Parking copies the primary halves to TRANS_CHECK_MAX_TIME_TOPIC (with TRANSACTION_CHECK_TIMES) and marks
the transaction PARKED (reported in Stats, ListOpen and the log event ``txn.parked``); a copy whose
append's outcome is unknown makes it OUTCOME_UNKNOWN until the resolver has read past it (never two
copies). A failure for one transaction (the log unreachable while parking, say) is counted and logged,
and the scan goes on with the next one: progress never stops at one message (RocketMQ #9500).

Thread-safe: the table's lock guards the transactions; ``_counts_lock`` the counters.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import MqStoreError, OutcomeUnknown
from mqstore.model import MessageIn, StoredMessage

from . import records as tx
from .checkback import COMMIT, ROLLBACK, Check, CheckHub
from .config import TxnConfig
from .table import OPEN, PARK, PARKED, Txn, TxnTable

log = structlog.get_logger("mqstore.txn.checker")


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
                 park: Callable[[str, list[MessageIn]], None],
                 in_doubt_add: Callable[[str, Callable[[], None]], None] = lambda what, settle: None):
        super().__init__("txn-checker", interval_s=config.check_scan_interval_ms / 1000)
        self.config, self.table, self.hub, self.clock = config, table, hub, clock
        self._read_halves, self._park, self._in_doubt_add = read_halves, park, in_doubt_add
        self.limiter = RateLimiter(config.check_rate_per_s, clock)
        self._ids = itertools.count(1)
        self._counts_lock = threading.Lock()
        self.checks_sent = self.check_answers = self.check_failures = self.parked = 0

    def step(self) -> None:
        self.scan()

    def scan(self) -> int:
        """One pass over the OPEN transactions; the checks offered."""
        if not self.table.ready:
            return 0
        candidates = sorted((t for t in self.table.live() if t.state == OPEN), key=lambda t: t.first_store_ms)
        offered = 0
        for txn in candidates:
            try:
                offered += self._visit(txn)
            except MqStoreError as exc:  # one transaction failing must not stop the scan
                with self._counts_lock:
                    self.check_failures += 1
                log.warning("checkback.failed", transaction_id=txn.txn_id, error=f"{type(exc).__name__}: {exc}")
        return offered

    def _candidate(self, txn: Txn) -> bool:
        """Under the table's lock."""
        return txn.state == OPEN and not txn.unknown and not txn.deciding

    def _visit(self, txn: Txn) -> int:
        now = self.clock.now_ms()
        cfg = self.config
        with self.table.lock:
            if not self._candidate(txn) or not txn.halves:
                return 0
            first, after = txn.first_store_ms, txn.first_check_after_ms(cfg.transaction_timeout_ms)
            checks, last = txn.checks_sent, txn.last_check_ms
            offsets = [h.physical_offset for h in txn.primary()]
        if now - first < after or (last and now - last < cfg.check_interval_ms):
            return 0
        if checks >= cfg.check_max:
            self._park_txn(txn)
            return 0
        session = self.hub.session_for(txn.group, txn.topic)
        if session is None or not self.limiter.allow(txn.group):
            return 0
        halves = self._read_halves(offsets)
        with self.table.lock:
            if not self._candidate(txn):
                return 0
            if not session.offer(Check(next(self._ids), txn.txn_id, txn.topic, txn.checks_sent + 1, now - first,
                                       halves)):
                return 0  # the stream closed or is too slow: not counted as checked
            txn.last_check_ms = now  # not offered again before check_interval_ms, sent or not
        return 1

    def on_send(self, check: Check) -> bool:
        """A stream's handler is about to send ``check``: counted, unless the transaction is no longer a
        check candidate (an answer or a decision came first): then dropped."""
        txn = self.table.get(check.txn_id)
        if txn is None or not self.table.note_check(txn, self.clock.now_ms()):
            return False
        with self._counts_lock:
            self.checks_sent += 1
        return True

    def _park_txn(self, txn: Txn) -> None:
        with txn.guard:
            with self.table.lock:
                if not self._candidate(txn):
                    return
                checks, primary = txn.checks_sent, [h.physical_offset for h in txn.primary()]
            copies = []
            for half in self._read_halves(primary):
                props = dict(half.record.properties)
                props[tx.PROPERTY_CHECK_TIMES] = str(checks)
                copies.append(MessageIn(half.record.body, properties=props, flag=half.record.flag,
                                        born_timestamp_ms=half.record.born_timestamp_ms, queue_id=0))
            try:
                self._park(tx.CHECK_MAX_TOPIC, copies)
            except OutcomeUnknown:
                self.table.mark_unknown(txn, PARK)
                self._in_doubt_add(f"park {txn.txn_id}", lambda: self.table.settle_unknown(txn, PARK))
                raise
            self.table.resolve(txn, PARKED, "check-back: no decision after check_max checks")
        with self._counts_lock:
            self.parked += 1
        log.warning("txn.parked", transaction_id=txn.txn_id, group=txn.group, checks_sent=checks,
                    last_answer=txn.last_answer, topic=tx.CHECK_MAX_TOPIC)

    # ---- the answers (checkback.AnswerSink) ---------------------------------------------------------------
    def record_answer(self, txn_id: str, decision: str) -> bool:
        """Recorded; True when the decision is to be applied (COMMIT or ROLLBACK): from now on the
        transaction is neither checked nor parked until :meth:`answer_done`."""
        with self._counts_lock:
            self.check_answers += 1
        txn = self.table.get(txn_id)
        decides = decision in (COMMIT, ROLLBACK)
        if txn is not None:
            self.table.note_answer(txn, decision, deciding=decides)
        return txn is not None and decides

    def answer_done(self, txn_id: str, error: MqStoreError | None) -> None:
        txn = self.table.get(txn_id)
        if txn is not None:
            self.table.done_deciding(txn)
        if error is not None:
            with self._counts_lock:
                self.check_failures += 1
            log.warning("checkback.answer_refused", transaction_id=txn_id, error=f"{type(error).__name__}: {error}")

    def counters(self) -> dict[str, int]:
        with self._counts_lock:
            return {"checks_sent": self.checks_sent, "check_answers": self.check_answers,
                    "check_failures": self.check_failures}
