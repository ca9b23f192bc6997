"""Operator tools and figures: ListOpen, Show, ForceResolve (audited), Stats. Thread-safe: reads the
table under its lock; ForceResolve goes through the coordinator (the transaction's guard)."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore import limits
from mqstore.clock import Clock
from mqstore.errors import InvalidArgument, MqStoreError

from mqstore.meta.txn_audit import AuditTrail
from .cache import HalfCache
from .checkback import Checker, CheckHub
from .config import TxnConfig
from .coordinator import Coordinator, Ended
from .opbatch import OpBatcher
from .table import COMMITTED, OPEN, PARKED, ROLLED_BACK, Txn, TxnTable

MAX_LIST = 10_000


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


class Operations:
    def __init__(self, config: TxnConfig, table: TxnTable, coordinator: Coordinator, checker: Checker,
                 hub: CheckHub, ops: OpBatcher, cache: HalfCache, appender, audit: AuditTrail, clock: Clock):
        self.config, self.table, self.coordinator, self.checker, self.hub = config, table, coordinator, checker, hub
        self.ops, self.cache, self.appender, self.audit, self.clock = ops, cache, appender, audit, clock

    def list_open(self, older_than_ms: int, group: str, limit: int) -> list[TxnView]:
        limits.at_least_zero("older_than_ms", older_than_ms, "0 = every open one")
        limit = limits.limit("limit", limit, default=100, maximum=MAX_LIST)
        now = self.clock.now_ms()
        with self.table.lock:
            views = [self._view(t, now) for t in self.table.by_id.values()
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
        entry = self.audit.requested(txn_id, decision, txn.state, reason, operator or "unknown", self.clock.now_ms())
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

    def stats(self) -> dict:
        counts = self.table.counts()
        now = self.clock.now_ms()
        with self.table.lock:
            open_ages = [now - t.first_store_ms for t in self.table.by_id.values() if t.state == OPEN]
            applied = self.table.applied
        op, cache = self.ops.stats(), self.cache.stats()
        halves = self.coordinator.halves_written
        return dict(
            open=counts[OPEN], committed=counts[COMMITTED], rolled_back=counts[ROLLED_BACK], parked=counts[PARKED],
            oldest_open_age_ms=max(open_ages, default=0), halves_written=halves,
            op_messages_written=op.messages_written, op_entries_written=op.entries_written,
            half_to_op_ratio=halves / op.messages_written if op.messages_written else 0.0,
            op_flush_by_size=op.flush_by_size, op_flush_by_time=op.flush_by_time, op_flush_other=op.flush_other,
            op_batch_fill=op.mean_fill, op_write_failures=op.write_failures, op_pending_entries=op.pending,
            cache_entries=cache.entries, cache_bytes=cache.bytes, cache_hits=cache.hits, cache_misses=cache.misses,
            cache_evictions=cache.evictions, checks_sent=self.checker.checks_sent,
            check_answers=self.checker.check_answers, check_failures=self.checker.check_failures,
            appends=self.appender.appends, appended_messages=self.appender.appended_messages,
            recovering=not self.table.ready, applied_physical_offset=applied or 0,
            open_streams=self.hub.open_streams())

    @staticmethod
    def _view(txn: Txn, now: int) -> TxnView:
        first = txn.first_store_ms
        return TxnView(txn.txn_id, txn.group, txn.topic, txn.state, len(txn.halves), first, now - first,
                       txn.checks_sent, txn.last_answer, txn.last_check_ms, txn.resolved_by,
                       tuple(h.physical_offset for h in txn.halves))


def answer_check(coordinator: Coordinator, checker: Checker, txn_id: str, decision: str) -> None:
    """A producer's answer to a check: COMMIT/ROLLBACK resolve (errors such as "already the other way"
    are recorded, not raised: the stream goes on), UNKNOWN is recorded."""
    checker.record_answer(txn_id, decision)
    try:
        if decision == "COMMIT":
            coordinator.commit(txn_id, by="check-back")
        elif decision == "ROLLBACK":
            coordinator.rollback(txn_id, by="check-back")
    except MqStoreError as exc:  # already resolved the other way, the log away: recorded; checked again later
        checker.note_failure(txn_id, exc)
