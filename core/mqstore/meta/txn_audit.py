"""The audit trail of ForceResolve: who resolved which transaction how and why, in SQL (SQLAlchemy), in
the metadata database (setting metadata_url: a SQLite file in the txn data dir by default, PostgreSQL
or any SQLAlchemy URL otherwise).

  table txn_audit: id (auto), transaction_id, decision (COMMIT|ROLLBACK), previous_state, reason,
                   operator, at_ms (the service's clock), outcome ("requested", "done", "already", or the
                   error)

Written before the decision is applied ("requested") and updated with its outcome, so an operator
action that crashed half way is still on record. Read back by ``entries`` in pages (ListAudit).

The engine and every transaction are mqstore.meta.sql's (bounded pool, timeouts on every wait): a
database that cannot be reached, or stays locked, is Unavailable (retriable) and a full disk
ResourceExhausted, each naming the database; nothing escapes as an internal error. Thread-safe:
SQLAlchemy's engine and pool are.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from mqstore.errors import InvalidArgument
from mqstore.meta import sql

_META = sa.MetaData()
AUDIT = sa.Table(
    "txn_audit", _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("transaction_id", sa.String(128), nullable=False, index=True),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("previous_state", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(1000), nullable=False),
    sa.Column("operator", sa.String(200), nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("outcome", sa.String(1000), nullable=False),
)
MAX_REASON_CHARS = 1000
MAX_PAGE = 1000
WAIT_TIMEOUT_MS = 5_000  # a ForceResolve waits at most this for the database


@dataclass(frozen=True)
class AuditEntry:
    id: int
    transaction_id: str
    decision: str
    previous_state: str
    reason: str
    operator: str
    at_ms: int
    outcome: str


class AuditTrail:
    def __init__(self, url: str, *, wait_timeout_ms: int = WAIT_TIMEOUT_MS):
        self.engine, self.url_text = sql.open_engine(url, wait_timeout_ms=wait_timeout_ms, pool_size=2)
        self.wait_timeout_ms = wait_timeout_ms
        try:
            with self._transaction(write=True) as conn:
                sql.lock_schema(conn)
                _META.create_all(conn)
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        self.engine.dispose()

    def requested(self, txn_id: str, decision: str, previous_state: str, reason: str, operator: str,
                  at_ms: int) -> int:
        if not reason.strip():
            raise InvalidArgument("reason: say why the transaction is resolved by hand (kept in the audit trail)")
        if len(reason) > MAX_REASON_CHARS:
            raise InvalidArgument(f"reason: {len(reason)} characters, the limit is {MAX_REASON_CHARS}")
        with self._transaction(write=True) as conn:
            row = conn.execute(AUDIT.insert().values(
                transaction_id=txn_id, decision=decision, previous_state=previous_state, reason=reason,
                operator=operator[:200], at_ms=at_ms, outcome="requested"))
            return int(row.inserted_primary_key[0])

    def finished(self, entry_id: int, outcome: str) -> None:
        with self._transaction(write=True) as conn:
            conn.execute(AUDIT.update().where(AUDIT.c.id == entry_id).values(outcome=outcome[:1000]))

    def entries(self, txn_id: str = "", after_id: int = 0, limit: int = MAX_PAGE) -> list[AuditEntry]:
        """Oldest first, ids above ``after_id``, at most ``limit`` (clamped to MAX_PAGE)."""
        if after_id < 0 or limit < 0:
            raise InvalidArgument("after_id and limit must not be negative")
        query = AUDIT.select().where(AUDIT.c.id > after_id).order_by(AUDIT.c.id).limit(min(limit or MAX_PAGE,
                                                                                          MAX_PAGE))
        if txn_id:
            query = query.where(AUDIT.c.transaction_id == txn_id)
        with self._transaction(write=False) as conn:
            return [AuditEntry(*row) for row in conn.execute(query)]

    def _transaction(self, *, write: bool):
        return sql.transaction(self.engine, self.url_text, self.wait_timeout_ms, write=write)
