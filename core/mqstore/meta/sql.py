"""Topic registry (and the consumer offsets of earlier versions) in a SQL database, through SQLAlchemy 2.x Core.

This is the only module of ``mqstore`` that imports SQLAlchemy. It stores rows and knows nothing of
topic naming rules or system topics: the facade checks those (``mqstore.topics``) before calling it.
Message data never goes into SQL.

Backends: a SQLite file (``sqlite:////abs/path/metadata.db``; WAL journal, busy timeout, SQLAlchemy
emits BEGIN itself because sqlite3's legacy mode skips it before SELECT and DDL) or PostgreSQL
(``postgresql+psycopg2://user@host:port/db``; statement and lock timeouts on every connection).

Schema version 2 (tables: columns):

  schema_version:    id (always 1: one row), version
  topics:            name PK, queue_count, kind (a model.KIND_* string), retention_ms (0 = store
                     default), created_ms; since version 2: start_physical_offset (the commit log's
                     end when the topic was created: the log's records of this name below it belong to
                     a deleted topic of the same name; 0 for topics of version 1) and deleting (1 while
                     a DeleteTopic is under way: the row is kept until the delete has been announced
                     in the log and the queues are gone, so that a crash resumes it; 0 otherwise)
  consumer_offsets:  (group_name, topic, queue_id) PK, committed_offset (the next queue offset the
                     group will consume), updated_ms. Earlier versions' consumer offsets: the store keeps
                     them in its offsets topic now (mqstore.consumer_offsets) and reads this table once,
                     to import it into an empty offsets topic; DeleteTopic still removes a topic's rows

On open, the steps in ``MIGRATIONS`` newer than the stored version run in one transaction; a stored
version newer than ``SCHEMA_VERSION`` refuses to open. To change the schema, append a step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import structlog
from sqlalchemy import BigInteger, CheckConstraint, Column, Connection, Engine, Index, Integer
from sqlalchemy import MetaData, PrimaryKeyConstraint, String, Table, create_engine, delete, event
from sqlalchemy import func, insert, inspect, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url

from mqstore.clock import Clock
from mqstore.errors import (AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted,
                            Unavailable)
from mqstore.meta.catalog import is_etcd_url
from mqstore.model import TOPIC_KINDS, TopicRecord

log = structlog.get_logger()

# Column widths are storage limits, not naming rules: RocketMQ allows retry/DLQ names up to 255.
_NAME_MAX_CHARS = 255
_KIND_MAX_CHARS = 16
# Arbitrary constant key for pg_advisory_xact_lock: serialises schema creation across processes.
_PG_SCHEMA_LOCK_KEY = 0x6D7173746F7265  # "mqstore"
# Connection execution option read by the SQLite BEGIN hook.
_WRITE_OPTION = "mqstore_write"

# The generic insert() has no ON CONFLICT; these dialect ones do (_build_engine allows only these).
_UPSERT_INSERT: dict[str, Callable[[Table], Any]] = {
    "sqlite": sqlite.insert,
    "postgresql": postgresql.insert,
}

_metadata = MetaData()

schema_version_table = Table(
    "schema_version",
    _metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),
    CheckConstraint("id = 1", name="schema_version_one_row"),
)

topics_table = Table(
    "topics",
    _metadata,
    Column("name", String(_NAME_MAX_CHARS), primary_key=True),
    Column("queue_count", Integer, nullable=False),
    Column("kind", String(_KIND_MAX_CHARS), nullable=False),
    Column("retention_ms", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("start_physical_offset", BigInteger, nullable=False, server_default="0"),  # version 2
    Column("deleting", Integer, nullable=False, server_default="0"),  # version 2: 1 while deleting
)

offsets_table = Table(
    "consumer_offsets",
    _metadata,
    Column("group_name", String(_NAME_MAX_CHARS), nullable=False),
    Column("topic", String(_NAME_MAX_CHARS), nullable=False),
    Column("queue_id", Integer, nullable=False),
    Column("committed_offset", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("group_name", "topic", "queue_id"),
    # delete_topic and list_offsets(topic=...) look offsets up by topic alone.
    Index("consumer_offsets_by_topic", "topic"),
)


# The topics table as version 1 created it (frozen: a fresh database replays every step in order).
_V1_TOPICS = Table(
    "topics",
    MetaData(),
    Column("name", String(_NAME_MAX_CHARS), primary_key=True),
    Column("queue_count", Integer, nullable=False),
    Column("kind", String(_KIND_MAX_CHARS), nullable=False),
    Column("retention_ms", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
)


def _migrate_to_v1(conn: Connection) -> None:
    # When a later version alters these tables, freeze the v1 definitions here (copies of the
    # Tables as they were) so that a fresh database still replays every step in order.
    for table in (_V1_TOPICS, offsets_table):
        if inspect(conn).has_table(table.name):
            raise FailedPrecondition(
                f"table {table.name!r} exists but the database has no mqstore schema version; "
                "point the metadata URL at an empty database or one created by mqstore"
            )
        table.create(conn)


def _migrate_to_v2(conn: Connection) -> None:
    """A topic's incarnation (start_physical_offset) and the deleting mark (the module docstring)."""
    for column in ("start_physical_offset BIGINT NOT NULL DEFAULT 0", "deleting INTEGER NOT NULL DEFAULT 0"):
        conn.exec_driver_sql(f"ALTER TABLE topics ADD COLUMN {column}")


MIGRATIONS: tuple[tuple[int, Callable[[Connection], None]], ...] = ((1, _migrate_to_v1), (2, _migrate_to_v2))
SCHEMA_VERSION = MIGRATIONS[-1][0]


class MetadataStore:
    """The topic registry (and earlier versions' consumer offsets), in SQLite or PostgreSQL.

    Thread-safe: every method checks a connection out of a bounded pool and runs one short
    transaction on it; no Python lock is held across database calls. Several processes may share
    one database (SQLite writers queue on the file lock for up to ``wait_timeout_ms``).

    Errors: NotFound and AlreadyExists for missing or taken keys; ResourceExhausted when the
    database's disk is full (SQLite "database or disk is full", PostgreSQL disk_full), at once and
    not retriable until space is freed; Unavailable (retriable) when the database cannot be reached
    or stays locked longer than ``wait_timeout_ms``; FailedPrecondition when the stored schema is
    newer than this code, or after close().
    """

    def __init__(
        self, url: str, clock: Clock, *, wait_timeout_ms: int = 10_000, pool_size: int = 8
    ) -> None:
        if wait_timeout_ms <= 0 or pool_size <= 0:
            raise InvalidArgument(
                f"wait_timeout_ms ({wait_timeout_ms}) and pool_size ({pool_size}) must be positive"
            )
        parsed = make_url(url)
        self._clock = clock
        self._url_text = parsed.render_as_string(hide_password=True)
        self._wait_timeout_ms = wait_timeout_ms
        self._closed = False
        self._close_lock = threading.Lock()
        self._engine = _build_engine(parsed, wait_timeout_ms=wait_timeout_ms, pool_size=pool_size)
        self._insert = _UPSERT_INSERT[self._engine.dialect.name]
        try:
            self._open_schema()
        except BaseException:
            self._engine.dispose()
            raise

    # -- topics ------------------------------------------------------------------------------------

    def create_topic(self, name: str, queue_count: int, kind: str, retention_ms: int,
                     start_physical_offset: int = 0) -> TopicRecord:
        """Insert a topic; AlreadyExists if the name is taken (also by a topic being deleted).
        created_ms comes from the clock."""
        _check_kind(kind)
        _check_non_negative(queue_count=queue_count, retention_ms=retention_ms,
                            start_physical_offset=start_physical_offset)
        record = TopicRecord(
            name=name,
            queue_count=queue_count,
            kind=kind,
            retention_ms=retention_ms,
            created_ms=self._clock.now_ms(),
            start_physical_offset=start_physical_offset,
        )
        stmt = (
            self._insert(topics_table)
            .values(dataclasses.asdict(record))
            .on_conflict_do_nothing(index_elements=[topics_table.c.name])
        )
        with self._transaction(write=True) as conn:
            if conn.execute(stmt).rowcount == 0:
                raise AlreadyExists(f"topic {name!r} exists already; update it or pick another name")
        log.info("meta.topic_created", topic=name, queue_count=queue_count, kind=kind)
        return record

    def update_topic(
        self, name: str, queue_count: int | None = None, retention_ms: int | None = None
    ) -> TopicRecord:
        """Change the given fields of a topic (None = keep) and return it; NotFound if absent."""
        changes: dict[str, int] = {}
        if queue_count is not None:
            changes["queue_count"] = queue_count
        if retention_ms is not None:
            changes["retention_ms"] = retention_ms
        _check_non_negative(**changes)
        with self._transaction(write=True) as conn:
            if changes:
                stmt = update(topics_table).where(topics_table.c.name == name).values(changes)
                if conn.execute(stmt).rowcount == 0:
                    raise _topic_not_found(name)
            record = _select_topic(conn, name)
        if changes:
            log.info("meta.topic_updated", topic=name, **changes)
        return record

    def mark_topic_deleting(self, name: str) -> TopicRecord:
        """The first step of a delete: the row stays, marked, until :meth:`delete_topic`; a marked
        topic is listed by :meth:`deleting_topics` only. NotFound if absent."""
        stmt = update(topics_table).where(topics_table.c.name == name).values(deleting=1)
        with self._transaction(write=True) as conn:
            if conn.execute(stmt).rowcount == 0:
                raise _topic_not_found(name)
            record = _select_topic(conn, name)
        log.info("meta.topic_deleting", topic=name)
        return record

    def delete_topic(self, name: str) -> None:
        """Delete a topic (marked or not) and every consumer offset committed for it; NotFound if absent."""
        with self._transaction(write=True) as conn:
            if conn.execute(delete(topics_table).where(topics_table.c.name == name)).rowcount == 0:
                raise _topic_not_found(name)
            offsets = conn.execute(delete(offsets_table).where(offsets_table.c.topic == name))
        log.info("meta.topic_deleted", topic=name, offsets_deleted=offsets.rowcount)

    def get_topic(self, name: str) -> TopicRecord:
        """The topic named ``name`` (being deleted or not); NotFound if there is none."""
        with self._transaction(write=False) as conn:
            return _select_topic(conn, name)

    def list_topics(self) -> list[TopicRecord]:
        """Every topic not being deleted, sorted by name (code point order, whatever the database's collation)."""
        return self._topics_where(deleting=0)

    def deleting_topics(self) -> list[TopicRecord]:
        """The topics whose delete was begun and not finished (a crash cut it short), sorted by name."""
        return self._topics_where(deleting=1)

    def _topics_where(self, *, deleting: int) -> list[TopicRecord]:
        with self._transaction(write=False) as conn:
            rows = conn.execute(select(topics_table).where(topics_table.c.deleting == deleting)).all()
        return sorted((_topic_record(row) for row in rows), key=lambda record: record.name)

    # -- consumer offsets --------------------------------------------------------------------------

    def commit_offsets(self, rows: Sequence[tuple[str, str, int, int]]) -> None:
        """Store each (group, topic, queue_id, offset), replacing any earlier one, in one transaction. The
        store no longer calls it: consumer offsets live in its offsets topic (mqstore.consumer_offsets), and
        this table is only read once, by the import at start. Kept as the old write path for the bench's
        comparison point (bench/offsets.py) and for the tests that build an earlier version's table."""
        for _, _, queue_id, offset in rows:
            _check_non_negative(queue_id=queue_id, offset=offset)
        if not rows:
            return
        now_ms = self._clock.now_ms()
        stmt = self._insert(offsets_table)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(offsets_table.primary_key.columns),
            set_={
                "committed_offset": stmt.excluded.committed_offset,
                "updated_ms": stmt.excluded.updated_ms,
            },
        )
        values = [dict(group_name=g, topic=t, queue_id=q, committed_offset=o, updated_ms=now_ms)
                  for g, t, q, o in rows]
        with self._transaction(write=True) as conn:
            conn.execute(stmt, values)

    def list_offsets(
        self, group: str | None = None, topic: str | None = None
    ) -> list[tuple[str, str, int, int]]:
        """(group, topic, queue_id, offset) rows, optionally filtered, sorted by that key (the import of an
        earlier version's offsets at start).

        Sorted here rather than by ORDER BY: PostgreSQL's locale collation would order names
        differently from SQLite's binary one.
        """
        c = offsets_table.c
        stmt = select(c.group_name, c.topic, c.queue_id, c.committed_offset)
        if group is not None:
            stmt = stmt.where(c.group_name == group)
        if topic is not None:
            stmt = stmt.where(c.topic == topic)
        with self._transaction(write=False) as conn:
            rows = conn.execute(stmt).all()
        return sorted((g, t, int(q), int(o)) for g, t, q, o in rows)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every pooled connection. Idempotent; later calls raise FailedPrecondition."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._engine.dispose()
        log.info("meta.closed", url=self._url_text)

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Connection]:
        if self._closed:
            raise FailedPrecondition(f"metadata store {self._url_text} is closed; open a new one")
        with transaction(self._engine, self._url_text, self._wait_timeout_ms, write=write) as conn:
            yield conn

    def _open_schema(self) -> None:
        with self._transaction(write=True) as conn:
            lock_schema(conn)
            stored = self._stored_version(conn)
            if stored > SCHEMA_VERSION:
                raise FailedPrecondition(
                    f"metadata database {self._url_text} has schema version {stored}, newer than "
                    f"version {SCHEMA_VERSION} that this mqstore supports; upgrade mqstore or "
                    "use another database"
                )
            for version, step in MIGRATIONS:
                if version > stored:
                    step(conn)
                    _write_version(conn, version)
                    log.info("meta.schema_migrated", url=self._url_text, version=version)

    def _stored_version(self, conn: Connection) -> int:
        if not inspect(conn).has_table(schema_version_table.name):
            schema_version_table.create(conn)
            return 0
        version = conn.execute(select(schema_version_table.c.version)).scalar_one_or_none()
        if version is None:
            raise FailedPrecondition(
                f"table schema_version in {self._url_text} has no row: the database was not "
                "created by mqstore or was edited by hand; point the metadata URL elsewhere"
            )
        return int(version)


def lock_schema(conn: Connection) -> None:
    """Serialise schema creation across processes opening one database at once (every service of `make
    run --auth` opens the shared auth database at start): in a write transaction (SQLite BEGIN IMMEDIATE
    holds the file's write lock already), plus PostgreSQL's transaction-scoped advisory lock, so that two
    processes never both CREATE TABLE."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(_PG_SCHEMA_LOCK_KEY)))


def sqlite_file(url: str) -> str | None:
    """Where a SQLite URL keeps its database: the file's absolute path, ":memory:" for an in-memory one;
    None for any other backend (commitlog_service.main refuses per-node SQLite for a replication group)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if parsed.database in (None, "", ":memory:"):
        return ":memory:"
    return os.path.abspath(parsed.database)


def open_engine(url: str, *, wait_timeout_ms: int = 10_000, pool_size: int = 8) -> tuple[Engine, str]:
    """An engine as the metadata store builds one (SQLite WAL and busy timeout, PostgreSQL statement and
    lock timeouts, a bounded pool), and the URL to name it by (password hidden). For the other tables
    of mqstore.meta (txn_audit)."""
    if is_etcd_url(url):
        raise InvalidArgument("an etcd:// URL names a catalog of topics or users (the commit log's --metadata-url, "
                              "--auth-url); this database (the Transaction service's audit trail) is SQL: give "
                              "sqlite:////abs/path/txn-audit.db or postgresql+psycopg2://user@host/db, or nothing")
    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        raise InvalidArgument("metadata URL is not a database URL: give e.g. sqlite:////abs/path/metadata.db or "
                              "postgresql+psycopg2://user@host/db") from None
    return _build_engine(parsed, wait_timeout_ms=wait_timeout_ms, pool_size=pool_size), \
        parsed.render_as_string(hide_password=True)


@contextlib.contextmanager
def transaction(engine: Engine, url_text: str, wait_timeout_ms: int, *, write: bool) -> Iterator[Connection]:
    """One database transaction; an outage becomes Unavailable (retriable), a full disk
    ResourceExhausted, each naming the database (never an INTERNAL error)."""
    try:
        with engine.connect() as conn:
            conn.execution_options(**{_WRITE_OPTION: write})
            with conn.begin():
                yield conn
    except (sa_exc.OperationalError, sa_exc.TimeoutError) as exc:
        cause = getattr(exc, "orig", None) or exc
        if _is_disk_full(cause):
            raise ResourceExhausted(
                f"metadata database {url_text}: the disk is full ({cause}); free space, then retry") from exc
        raise Unavailable(
            f"metadata database {url_text} is unavailable or stayed locked for {wait_timeout_ms} ms: {cause}; "
            "retry later"
        ) from exc


def _build_engine(url: URL, *, wait_timeout_ms: int, pool_size: int) -> Engine:
    backend = url.get_backend_name()
    wait_s = wait_timeout_ms / 1000
    # Bounded pool: at most 2 * pool_size connections; a caller waits up to wait_timeout_ms for one.
    pool_args: dict[str, Any] = {
        "pool_size": pool_size, "max_overflow": pool_size, "pool_timeout": wait_s
    }
    if backend == "sqlite":
        _check_sqlite_file(url)
        engine = create_engine(
            url, connect_args={"timeout": wait_s, "check_same_thread": False}, **pool_args
        )
        hook = functools.partial(_on_sqlite_connect, busy_timeout_ms=wait_timeout_ms)
        event.listen(engine, "connect", hook)
        event.listen(engine, "begin", _on_sqlite_begin)
        return engine
    if backend == "postgresql":
        connect_args: dict[str, Any] = {}
        if url.get_driver_name() in ("psycopg2", "psycopg"):
            connect_args["connect_timeout"] = max(1, round(wait_s))  # libpq takes whole seconds
        # pre_ping: a restarted server must not hand out dead pooled connections.
        engine = create_engine(url, connect_args=connect_args, pool_pre_ping=True, **pool_args)
        hook = functools.partial(_on_postgresql_connect, timeout_ms=wait_timeout_ms)
        event.listen(engine, "connect", hook)
        return engine
    raise InvalidArgument(
        f"metadata URL {url.render_as_string(hide_password=True)} uses {backend!r}; "
        "supported are sqlite (a file) and postgresql"
    )


def _check_sqlite_file(url: URL) -> None:
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        # Each pooled connection would get its own empty in-memory database.
        raise InvalidArgument(
            f"metadata URL {url} is an in-memory SQLite database; use a file such as "
            "sqlite:////abs/path/metadata.db"
        )
    directory = os.path.dirname(os.path.abspath(database))
    if not os.path.isdir(directory):
        raise InvalidArgument(
            f"directory {directory!r} of the metadata database does not exist; create it first"
        )


def _on_sqlite_connect(dbapi_connection: Any, _record: Any, *, busy_timeout_ms: int) -> None:
    # Hand BEGIN to SQLAlchemy (see _on_sqlite_begin): sqlite3's legacy mode would skip it.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        journal_mode = _enable_wal(cursor, timeout_ms=busy_timeout_ms)
        # FULL: a committed offset or topic survives power loss, not only a process crash.
        cursor.execute("PRAGMA synchronous = FULL")
    finally:
        cursor.close()
    if journal_mode.lower() != "wal":
        # Some file systems (network mounts) cannot do WAL; it still works, with more lock waits.
        log.warning("meta.sqlite_wal_unavailable", journal_mode=journal_mode)


def _enable_wal(cursor: Any, *, timeout_ms: int) -> str:
    # Switching to WAL takes an exclusive lock, and SQLite answers SQLITE_BUSY at once, without its
    # busy handler, while another connection is mid-switch (seen when several stores open a new
    # file together). So retry here. Real time on purpose: this waits on an OS file lock, which an
    # injected clock cannot release.
    deadline_s = time.monotonic() + timeout_ms / 1000
    delay_s = 0.001
    while True:
        try:
            journal_mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
            if str(journal_mode).lower() == "wal":
                return str(journal_mode)
            return str(cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline_s:
                raise
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.05)


def _on_sqlite_begin(conn: Connection) -> None:
    # Writers take the write lock up front: a deferred transaction that reads and then writes
    # cannot wait for the lock under WAL and fails with SQLITE_BUSY at once.
    write = conn.get_execution_options().get(_WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _on_postgresql_connect(dbapi_connection: Any, _record: Any, *, timeout_ms: int) -> None:
    # A limit on every wait: no statement or row lock wait outlives the store's timeout.
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {int(timeout_ms)}")
            cursor.execute(f"SET lock_timeout = {int(timeout_ms)}")
    finally:
        dbapi_connection.autocommit = autocommit


# SQLite's primary result code for "database or disk is full"; PostgreSQL's SQLSTATE disk_full.
_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


def _is_disk_full(cause: BaseException) -> bool:
    if isinstance(cause, sqlite3.Error):
        return (getattr(cause, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL
    # psycopg2 names the SQLSTATE pgcode, psycopg 3 sqlstate.
    return _PG_DISK_FULL in (getattr(cause, "pgcode", None), getattr(cause, "sqlstate", None))


def _write_version(conn: Connection, version: int) -> None:
    if conn.execute(update(schema_version_table).values(version=version)).rowcount == 0:
        conn.execute(insert(schema_version_table).values(id=1, version=version))


def _select_topic(conn: Connection, name: str) -> TopicRecord:
    row = conn.execute(select(topics_table).where(topics_table.c.name == name)).one_or_none()
    if row is None:
        raise _topic_not_found(name)
    return _topic_record(row)


def _topic_not_found(name: str) -> NotFound:
    return NotFound(f"topic {name!r} does not exist; create it first or check the name")


def _topic_record(row: Any) -> TopicRecord:
    columns = dict(row._mapping)  # _mapping is public API: the row as a column -> value map
    del columns["deleting"]  # a state of the row, not of the topic (list_topics / deleting_topics)
    return TopicRecord(**columns)


def _check_kind(kind: str) -> None:
    if kind not in TOPIC_KINDS:
        raise InvalidArgument(f"topic kind {kind!r} is not one of {', '.join(TOPIC_KINDS)}")


def _check_non_negative(**fields: int) -> None:
    for field, value in fields.items():
        if value < 0:
            raise InvalidArgument(f"{field} is {value}; it must be 0 or more")
