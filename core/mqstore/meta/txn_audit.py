"""The audit trail of ForceResolve: who resolved which transaction how and why, in SQL (SQLAlchemy), in
the metadata database (setting metadata_url: a SQLite file in the txn data dir by default, PostgreSQL
or any SQLAlchemy URL otherwise).

  table txn_audit: id (auto), transaction_id, decision (COMMIT|ROLLBACK), previous_state, reason,
                   operator, at_ms (the service's clock), outcome ("done", "already", or the error)

Written before the decision is applied ("requested") and updated with its outcome, so an operator
action that crashed half way is still on record. Thread-safe: SQLAlchemy's engine and pool are.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from mqstore.errors import InvalidArgument, Unavailable

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
    def __init__(self, url: str):
        try:
            self.engine = sa.create_engine(url, pool_pre_ping=True)
            _META.create_all(self.engine)
        except sa.exc.ArgumentError as exc:
            raise InvalidArgument(f"metadata_url {url!r} is not a database URL: {exc}") from None
        except sa.exc.OperationalError as exc:
            raise Unavailable(f"the audit database cannot be opened: {exc.orig}") from None

    def close(self) -> None:
        self.engine.dispose()

    def requested(self, txn_id: str, decision: str, previous_state: str, reason: str, operator: str,
                  at_ms: int) -> int:
        if not reason.strip():
            raise InvalidArgument("reason: say why the transaction is resolved by hand (kept in the audit trail)")
        if len(reason) > MAX_REASON_CHARS:
            raise InvalidArgument(f"reason: {len(reason)} characters, the limit is {MAX_REASON_CHARS}")
        with self._begin() as conn:
            row = conn.execute(AUDIT.insert().values(
                transaction_id=txn_id, decision=decision, previous_state=previous_state, reason=reason,
                operator=operator[:200], at_ms=at_ms, outcome="requested"))
            return int(row.inserted_primary_key[0])

    def finished(self, entry_id: int, outcome: str) -> None:
        with self._begin() as conn:
            conn.execute(AUDIT.update().where(AUDIT.c.id == entry_id).values(outcome=outcome[:1000]))

    def entries(self, txn_id: str = "") -> list[AuditEntry]:
        query = AUDIT.select().order_by(AUDIT.c.id)
        if txn_id:
            query = query.where(AUDIT.c.transaction_id == txn_id)
        with self._begin() as conn:
            return [AuditEntry(*row) for row in conn.execute(query)]

    def _begin(self):
        try:
            return self.engine.begin()
        except sa.exc.OperationalError as exc:
            raise Unavailable(f"the audit database is unreachable: {exc.orig}") from None
