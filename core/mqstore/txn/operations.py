"""Operator tools and figures: ListOpen, Show, ForceResolve (audited), ListAudit, Stats.

Stats' counters are totals since the service first ran in its data dir: the checkpoint records them
(snapshot.py) and a restart adds the counts of the new process to what it recorded; what happened after
the last checkpoint of a killed process (at most ``checkpoint_interval_ms``) is not counted. Gauges
(open, cache entries, pending OP entries, ...) describe the process now.

Thread-safe: reads the table under its lock; ForceResolve goes through the coordinator (the
transaction's guard).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from mqstore import limits
from mqstore.clock import Clock
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore.metrics import Registry
from mqstore.meta.txn_audit import AuditEntry, AuditTrail

from .cache import HalfCache
from .checkback import CheckHub
from .checker import Checker
from .config import TxnConfig
from .coordinator import Coordinator, Ended
from .opbatch import OpBatcher
from .table import COMMITTED, OPEN, OUTCOME_UNKNOWN, PARKED, ROLLED_BACK, Txn, TxnTable
from .transact import TransactStreams

MAX_AUDIT_PAGE = 1000
MAX_LIST = 10_000
# Counters kept across restarts (the checkpoint's "counters"): name -> where the live figure comes from.
COUNTERS = ("halves_written", "op_messages_written", "op_entries_written", "op_flush_by_size", "op_flush_by_time",
            "op_flush_other", "op_fill_sum", "op_write_failures", "op_unknown_outcomes", "cache_hits",
            "cache_misses", "cache_evictions", "checks_sent", "check_answers", "check_failures", "parked_by_checks",
            "appends", "appended_messages", "in_doubt_settled", "one_way_ends", "one_way_failures",
            "op_flush_by_waiter")


@dataclass(frozen=True)
class TxnView:
    txn_id: str
    group: str
    topic: str
    state: str
    message_count: int
    store_timestamp_ms: int
    age_ms: int
    checks_sent: int
    last_answer: str
    last_check_ms: int
    resolved_by: str
    half_physical_offsets: tuple[int, ...]


@dataclass(frozen=True)
class AuditPage:
    entries: list[AuditEntry]
    next_page_token: str   # "" when there is no more


class Operations:
    def __init__(self, config: TxnConfig, table: TxnTable, coordinator: Coordinator, checker: Checker,
                 hub: CheckHub, ops: OpBatcher, cache: HalfCache, appender, audit: AuditTrail, clock: Clock,
                 streams: TransactStreams,
                 in_doubt_pending: Callable[[], int] = lambda: 0, in_doubt_settled: Callable[[], int] = lambda: 0,
                 base_counters: dict | None = None):
        self.config, self.table, self.coordinator, self.checker, self.hub = config, table, coordinator, checker, hub
        self.ops, self.cache, self.appender, self.audit, self.clock = ops, cache, appender, audit, clock
        self.streams = streams
        self._in_doubt_pending, self._in_doubt_settled = in_doubt_pending, in_doubt_settled
        self._base = {name: (base_counters or {}).get(name, 0) for name in COUNTERS}
        self._lock = threading.Lock()

    def list_open(self, older_than_ms: int, group: str, limit: int) -> list[TxnView]:
        limits.at_least_zero("older_than_ms", older_than_ms, "0 = every open one")
        limit = limits.limit("limit", limit, default=100, maximum=MAX_LIST)
        now = self.clock.now_ms()
        with self.table.lock:
            views = [self._view(t, now) for t in self.table.live()
                     if t.state in (OPEN, PARKED) and (not group or t.group == group)]
        views = [v for v in views if v.age_ms >= older_than_ms]
        return sorted(views, key=lambda v: v.store_timestamp_ms)[:limit]

    def show(self, txn_id: str) -> TxnView:
        txn = self.coordinator.txn(txn_id)
        with self.table.lock:
            return self._view(txn, self.clock.now_ms())

    def force_resolve(self, txn_id: str, decision: str, reason: str, operator: str) -> Ended:
        if decision not in ("COMMIT", "ROLLBACK"):
            raise InvalidArgument(f"decision must be COMMIT or ROLLBACK, not {decision}")
        txn = self.coordinator.txn(txn_id)
        entry = self.audit.requested(txn_id, decision, txn.view_state, reason, operator or "unknown",
                                     self.clock.now_ms())
        by = f"operator {operator or 'unknown'}: {reason}"
        try:
            if decision == "COMMIT":
                ended = self.coordinator.commit(txn_id, by=by)
            else:
                ended = self.coordinator.rollback(txn_id, by=by)
        except MqStoreError as exc:
            self.audit.finished(entry, f"{type(exc).__name__}: {exc}")
            raise
        self.audit.finished(entry, "already" if ended.already else "done")
        return ended

    def register_metrics(self, metrics: Registry) -> None:
        """The figures an operator pages on: transactions by state, the oldest open one, halves and OP
        messages written and their ratio, check-backs sent and answered (the cache's are its own)."""
        metrics.gauge_fn("mqstore_txn_transactions", "transactions the service knows, by state",
                         lambda: {(state,): n for state, n in self.table.counts().items()}, ("state",))
        metrics.gauge_fn("mqstore_txn_oldest_open_age_seconds", "age of the oldest open transaction (store time)",
                         self._oldest_open_s)
        # The persisted counters (checkpointed across restarts, as Stats reports them).
        for name, doc in (("halves_written", "half messages written"), ("op_messages_written", "OP messages written"),
                          ("checks_sent", "check-back requests sent to producers"),
                          ("check_answers", "check-back answers received")):
            metrics.counter_fn(f"mqstore_txn_{name}_total", doc, lambda name=name: self.counters()[name])
        metrics.gauge_fn("mqstore_txn_half_to_op_ratio", "halves written per OP message written", self._half_to_op)
        metrics.gauge_fn("mqstore_txn_recovering", "1 until the follower has read the log up to its end at start",
                         lambda: int(not self.table.ready))

    def _oldest_open_s(self) -> float:
        now = self.clock.now_ms()
        with self.table.lock:
            firsts = [t.first_store_ms for t in self.table.by_id.values() if t.state == OPEN]
        return (now - min(firsts)) / 1000 if firsts else 0.0

    def _half_to_op(self) -> float:
        counters = self.counters()
        written = counters["op_messages_written"]
        return counters["halves_written"] / written if written else 0.0

    def list_audit(self, txn_id: str, limit: int, page_token: str) -> AuditPage:
        if page_token and not (page_token.isascii() and page_token.isdigit() and len(page_token) <= 18):
            raise InvalidArgument("page_token: pass the next_page_token of the previous answer, or nothing")
        limit = limits.limit("limit", limit, default=100, maximum=MAX_AUDIT_PAGE)
        entries = self.audit.entries(txn_id, int(page_token or 0), limit + 1)
        more = len(entries) > limit
        entries = entries[:limit]
        return AuditPage(entries, str(entries[-1].id) if more else "")

    def counters(self) -> dict:
        """The persisted counters: what the checkpoint recorded plus this process's counts."""
        op, cache, checks = self.ops.stats(), self.cache.stats(), self.checker.counters()
        live = dict(halves_written=self.coordinator.halves_written, op_messages_written=op.messages_written,
                    op_entries_written=op.entries_written, op_flush_by_size=op.flush_by_size,
                    op_flush_by_time=op.flush_by_time, op_flush_other=op.flush_other,
                    op_flush_by_waiter=op.flush_by_waiter, op_fill_sum=op.mean_fill * op.messages_written,
                    op_write_failures=op.write_failures,
                    op_unknown_outcomes=op.unknown_outcomes, cache_hits=cache.hits, cache_misses=cache.misses,
                    cache_evictions=cache.evictions, parked_by_checks=self.checker.parked,
                    appends=self.appender.appends, appended_messages=self.appender.appended_messages,
                    in_doubt_settled=self._in_doubt_settled(), one_way_ends=self.streams.one_way_ends,
                    one_way_failures=self.streams.one_way_failures, **checks)
        return {name: self._base[name] + live[name] for name in COUNTERS}

    def stats(self) -> dict:
        counts = self.table.counts()
        now = self.clock.now_ms()
        with self.table.lock:
            open_ages = [now - t.first_store_ms for t in self.table.live() if t.state == OPEN and t.halves]
            applied = self.table.applied
        total = self.counters()
        op, cache = self.ops.stats(), self.cache.stats()
        return dict(
            open=counts[OPEN], committed=counts[COMMITTED], rolled_back=counts[ROLLED_BACK],
            parked=counts[PARKED], outcome_unknown=counts[OUTCOME_UNKNOWN], in_doubt_appends=self._in_doubt_pending(),
            oldest_open_age_ms=max(open_ages, default=0), halves_written=total["halves_written"],
            op_messages_written=total["op_messages_written"], op_entries_written=total["op_entries_written"],
            half_to_op_ratio=(total["halves_written"] / total["op_messages_written"]
                              if total["op_messages_written"] else 0.0),
            op_flush_by_size=total["op_flush_by_size"], op_flush_by_time=total["op_flush_by_time"],
            op_flush_other=total["op_flush_other"], op_flush_by_waiter=total["op_flush_by_waiter"],
            op_batch_fill=(total["op_fill_sum"] / total["op_messages_written"] if total["op_messages_written"]
                           else 0.0),
            op_write_failures=total["op_write_failures"], op_unknown_outcomes=total["op_unknown_outcomes"],
            op_pending_entries=op.pending, cache_entries=cache.entries, cache_bytes=cache.bytes,
            cache_hits=total["cache_hits"], cache_misses=total["cache_misses"],
            cache_evictions=total["cache_evictions"], checks_sent=total["checks_sent"],
            check_answers=total["check_answers"], check_failures=total["check_failures"],
            appends=total["appends"], appended_messages=total["appended_messages"],
            recovering=not self.table.ready, applied_physical_offset=applied or 0,
            open_streams=self.hub.open_streams(), in_doubt_settled=total["in_doubt_settled"],
            transact_streams=self.streams.open_streams(), one_way_ends=total["one_way_ends"],
            one_way_failures=total["one_way_failures"])

    @staticmethod
    def _view(txn: Txn, now: int) -> TxnView:
        first = txn.first_store_ms
        primary = txn.primary()
        return TxnView(txn.txn_id, txn.group, txn.topic, txn.view_state, len(primary), first,
                       now - first if first else 0, txn.checks_sent, txn.last_answer, txn.last_check_ms,
                       txn.resolved_by, tuple(h.physical_offset for h in txn.halves))
