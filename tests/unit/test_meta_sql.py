"""MetadataStore on a real SQLite file and, when MQSTORE_TEST_PG_URL is set, a real PostgreSQL.

Each PostgreSQL test gets a schema of its own (search_path set through the URL) that is dropped
afterwards, so runs are independent and may share one database.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy
from sqlalchemy.pool import NullPool

from mqstore.clock import FakeClock
from mqstore.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from mqstore.meta import SCHEMA_VERSION, MetadataStore
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, KIND_SYSTEM, TopicRecord

PG_URL_ENV = "MQSTORE_TEST_PG_URL"
THREADS = 8
COMMITS_PER_THREAD = 40


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'metadata.db'}"
    else:
        yield from _fresh_pg_schema()


def _fresh_pg_schema() -> Iterator[str]:
    base = os.environ.get(PG_URL_ENV)
    if not base:
        pytest.skip(
            f"{PG_URL_ENV} not set: export a SQLAlchemy URL such as "
            "postgresql+psycopg2://postgres@127.0.0.1:55432/mqstore_test (.ci/run starts one)"
        )
    schema = f"mqstore_test_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = sqlalchemy.make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def store(db_url: str, fake_clock: FakeClock) -> Iterator[MetadataStore]:
    opened = MetadataStore(db_url, fake_clock)
    yield opened
    opened.close()


def _set_stored_version(url: str, version: int) -> None:
    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("UPDATE schema_version SET version = :v"), {"v": version})
    engine.dispose()


# -- topics --------------------------------------------------------------------------------------


def test_create_then_get(store: MetadataStore, fake_clock: FakeClock) -> None:
    created = store.create_topic("orders", 8, KIND_NORMAL, 0)
    assert created == TopicRecord("orders", 8, KIND_NORMAL, 0, fake_clock.now_ms())
    assert store.get_topic("orders") == created


def test_create_duplicate_keeps_the_first(store: MetadataStore, fake_clock: FakeClock) -> None:
    first = store.create_topic("orders", 8, KIND_NORMAL, 0)
    fake_clock.advance(1000)
    with pytest.raises(AlreadyExists, match="'orders'"):
        store.create_topic("orders", 2, KIND_COMPACTION, 60_000)
    assert store.get_topic("orders") == first


def test_get_missing_names_the_topic(store: MetadataStore) -> None:
    with pytest.raises(NotFound, match="topic 'nope' does not exist"):
        store.get_topic("nope")


def test_list_topics_sorted_by_code_point(store: MetadataStore, fake_clock: FakeClock) -> None:
    assert store.list_topics() == []
    names = ["b", "a", "C", "_x", "%RETRY%g", "a-1", "B|c"]
    for i, name in enumerate(names):
        fake_clock.advance(1)
        store.create_topic(name, i + 1, KIND_NORMAL, i)
    listed = store.list_topics()
    assert [t.name for t in listed] == sorted(names)
    assert {t.name: t.queue_count for t in listed} == {n: i + 1 for i, n in enumerate(names)}


def test_kinds_stored_as_strings(store: MetadataStore) -> None:
    for kind in (KIND_NORMAL, KIND_COMPACTION, KIND_SYSTEM):
        store.create_topic(f"t-{kind}", 1, kind, 0)
        assert store.get_topic(f"t-{kind}").kind == kind


def test_update_changes_only_given_fields(store: MetadataStore, fake_clock: FakeClock) -> None:
    created = store.create_topic("orders", 4, KIND_COMPACTION, 1000)
    fake_clock.advance(5000)
    after_queues = store.update_topic("orders", queue_count=16)
    assert after_queues == TopicRecord("orders", 16, KIND_COMPACTION, 1000, created.created_ms)
    after_retention = store.update_topic("orders", retention_ms=7)
    assert after_retention == TopicRecord("orders", 16, KIND_COMPACTION, 7, created.created_ms)
    both = store.update_topic("orders", queue_count=2, retention_ms=0)
    assert (both.queue_count, both.retention_ms) == (2, 0)
    assert store.update_topic("orders") == both
    assert store.get_topic("orders") == both


def test_update_missing_raises_not_found(store: MetadataStore) -> None:
    with pytest.raises(NotFound, match="'ghost'"):
        store.update_topic("ghost", queue_count=2)
    with pytest.raises(NotFound, match="'ghost'"):
        store.update_topic("ghost")


def test_delete_topic(store: MetadataStore) -> None:
    store.create_topic("orders", 4, KIND_NORMAL, 0)
    store.create_topic("keep", 4, KIND_NORMAL, 0)
    store.delete_topic("orders")
    with pytest.raises(NotFound):
        store.get_topic("orders")
    assert [t.name for t in store.list_topics()] == ["keep"]
    with pytest.raises(NotFound, match="'orders'"):
        store.delete_topic("orders")
    store.create_topic("orders", 2, KIND_NORMAL, 0)  # the name is free again
    assert store.get_topic("orders").queue_count == 2


def test_a_delete_in_two_steps_keeps_the_row_marked_until_it_ends(store: MetadataStore) -> None:
    store.create_topic("orders", 4, KIND_NORMAL, 0, start_physical_offset=4096)
    store.create_topic("keep", 4, KIND_NORMAL, 0)
    store.commit_offsets([("g", "orders", 0, 3)])
    marked = store.mark_topic_deleting("orders")
    assert marked.start_physical_offset == 4096 and marked.queue_count == 4
    assert [t.name for t in store.list_topics()] == ["keep"]
    assert [(t.name, t.start_physical_offset) for t in store.deleting_topics()] == [("orders", 4096)]
    with pytest.raises(AlreadyExists):  # the name is free only once the delete has ended
        store.create_topic("orders", 2, KIND_NORMAL, 0)
    assert _offset(store, "g", "orders", 0) == 3
    store.delete_topic("orders")
    assert store.deleting_topics() == [] and store.list_offsets(topic="orders") == []
    assert store.create_topic("orders", 2, KIND_NORMAL, 0, start_physical_offset=9000).start_physical_offset == 9000
    with pytest.raises(NotFound):
        store.mark_topic_deleting("nope")


def test_a_version_1_database_migrates_with_every_topic_at_offset_0(db_url: str, fake_clock: FakeClock) -> None:
    engine = sqlalchemy.create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:  # what version 1 created, with one topic in it
        conn.exec_driver_sql("CREATE TABLE schema_version (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO schema_version VALUES (1, 1)")
        conn.exec_driver_sql("CREATE TABLE topics (name VARCHAR(255) PRIMARY KEY, queue_count INTEGER NOT NULL, "
                             "kind VARCHAR(16) NOT NULL, retention_ms BIGINT NOT NULL, created_ms BIGINT NOT NULL)")
        conn.exec_driver_sql("CREATE TABLE consumer_offsets (group_name VARCHAR(255) NOT NULL, topic VARCHAR(255) "
                             "NOT NULL, queue_id INTEGER NOT NULL, committed_offset BIGINT NOT NULL, updated_ms "
                             "BIGINT NOT NULL, PRIMARY KEY (group_name, topic, queue_id))")
        conn.exec_driver_sql("INSERT INTO topics VALUES ('old', 3, 'NORMAL', 0, 5)")
    engine.dispose()
    store = MetadataStore(db_url, fake_clock)
    try:
        assert store.list_topics() == [TopicRecord("old", 3, KIND_NORMAL, 0, 5, start_physical_offset=0)]
        assert store.deleting_topics() == []
    finally:
        store.close()
    assert SCHEMA_VERSION == 2


def test_delete_topic_removes_its_offsets_only(store: MetadataStore) -> None:
    store.create_topic("orders", 2, KIND_NORMAL, 0)
    store.create_topic("keep", 2, KIND_NORMAL, 0)
    for group in ("g1", "g2"):
        for queue_id in (0, 1):
            store.commit_offsets([(group, "orders", queue_id, 10 + queue_id)])
            store.commit_offsets([(group, "keep", queue_id, 20 + queue_id)])
    store.delete_topic("orders")
    assert store.list_offsets(topic="orders") == []
    with pytest.raises(NotFound):
        _offset(store, "g1", "orders", 0)
    assert store.list_offsets() == [
        ("g1", "keep", 0, 20),
        ("g1", "keep", 1, 21),
        ("g2", "keep", 0, 20),
        ("g2", "keep", 1, 21),
    ]


def test_bad_arguments_rejected(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument, match="kind 'WEIRD'"):
        store.create_topic("orders", 1, "WEIRD", 0)
    with pytest.raises(InvalidArgument, match="retention_ms is -1"):
        store.create_topic("orders", 1, KIND_NORMAL, -1)
    with pytest.raises(InvalidArgument, match="offset is -5"):
        store.commit_offsets([("g", "orders", 0, -5)])
    with pytest.raises(InvalidArgument, match="queue_id is -1"):
        store.commit_offsets([("g", "orders", -1, 0)])
    assert store.list_topics() == []
    assert store.list_offsets() == []


# -- offsets -------------------------------------------------------------------------------------


def _offset(store: MetadataStore, group: str, topic: str, queue_id: int) -> int:
    """The table's offset of the key (the store reads offsets from its offsets topic now: the table is only
    read by the import at start, mqstore.store)."""
    found = [o for g, t, q, o in store.list_offsets(group=group, topic=topic) if q == queue_id]
    if not found:
        raise NotFound(f"no row for {group}/{topic}/{queue_id}")
    return found[0]


def test_commit_offset_upserts(store: MetadataStore) -> None:
    store.commit_offsets([("g", "orders", 0, 5)])
    assert _offset(store, "g", "orders", 0) == 5
    store.commit_offsets([("g", "orders", 0, 9)])
    assert _offset(store, "g", "orders", 0) == 9
    store.commit_offsets([("g", "orders", 0, 2)])  # going back is allowed: a reset
    assert _offset(store, "g", "orders", 0) == 2
    big = 2**62
    store.commit_offsets([("g", "orders", 1, big)])
    assert _offset(store, "g", "orders", 1) == big
    assert store.list_offsets() == [("g", "orders", 0, 2), ("g", "orders", 1, big)]


def test_list_offsets_filters(store: MetadataStore) -> None:
    rows = [
        ("g2", "b", 1, 7),
        ("g1", "b", 0, 3),
        ("g1", "a", 2, 1),
        ("g1", "a", 0, 4),
        ("G0", "a", 0, 9),
    ]
    for row in rows:
        store.commit_offsets([row])
    assert store.list_offsets() == sorted(rows)
    assert store.list_offsets(group="g1") == [("g1", "a", 0, 4), ("g1", "a", 2, 1), ("g1", "b", 0, 3)]
    assert store.list_offsets(topic="a") == [("G0", "a", 0, 9), ("g1", "a", 0, 4), ("g1", "a", 2, 1)]
    assert store.list_offsets(group="g1", topic="b") == [("g1", "b", 0, 3)]
    assert store.list_offsets(group="nobody") == []


def test_concurrent_commits_last_value_wins(store: MetadataStore) -> None:
    # Each thread writes an increasing sequence to its own key and to one shared key.
    start = threading.Barrier(THREADS, timeout=30)

    def worker(thread_id: int) -> None:
        start.wait()
        for i in range(COMMITS_PER_THREAD):
            store.commit_offsets([("g", "orders", thread_id, i)])
            store.commit_offsets([("g", "shared", 0, thread_id * 1000 + i)])
            if i % 10 == 0:
                _offset(store, "g", "orders", thread_id)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(worker, t) for t in range(THREADS)]
        for future in futures:
            future.result(timeout=120)  # re-raises any error from the thread

    last = COMMITS_PER_THREAD - 1
    for thread_id in range(THREADS):
        assert _offset(store, "g", "orders", thread_id) == last
    # The shared key holds the final write of whichever thread committed last.
    assert _offset(store, "g", "shared", 0) in {t * 1000 + last for t in range(THREADS)}
    assert len(store.list_offsets(topic="orders")) == THREADS


# -- lifecycle and schema ------------------------------------------------------------------------


def test_reopen_keeps_data(db_url: str, fake_clock: FakeClock) -> None:
    first = MetadataStore(db_url, fake_clock)
    created = first.create_topic("orders", 4, KIND_COMPACTION, 3600_000)
    first.commit_offsets([("g", "orders", 3, 42)])
    first.close()
    second = MetadataStore(db_url, FakeClock(start_ms=0))
    try:
        assert second.get_topic("orders") == created
        assert _offset(second, "g", "orders", 3) == 42
    finally:
        second.close()


def test_schema_too_new_refuses_to_open(db_url: str, fake_clock: FakeClock) -> None:
    MetadataStore(db_url, fake_clock).close()
    _set_stored_version(db_url, SCHEMA_VERSION + 1)
    with pytest.raises(FailedPrecondition) as raised:
        MetadataStore(db_url, fake_clock)
    message = str(raised.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert f"version {SCHEMA_VERSION} that this mqstore supports" in message


def test_schema_version_row_written_once(db_url: str, fake_clock: FakeClock) -> None:
    for _ in range(2):
        MetadataStore(db_url, fake_clock).close()
    engine = sqlalchemy.create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT id, version FROM schema_version")).all()
    engine.dispose()
    assert [tuple(row) for row in rows] == [(1, SCHEMA_VERSION)]


def test_concurrent_open_of_empty_database(db_url: str, fake_clock: FakeClock) -> None:
    stores = _open_together(db_url, fake_clock, THREADS)
    stores[0].create_topic("orders", 1, KIND_NORMAL, 0)
    assert [s.get_topic("orders").name for s in stores] == ["orders"] * THREADS
    for opened in stores:
        opened.close()


def _open_together(url: str, clock: FakeClock, count: int) -> list[MetadataStore]:
    start = threading.Barrier(count, timeout=30)

    def open_one() -> MetadataStore:
        start.wait()
        return MetadataStore(url, clock)

    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(open_one) for _ in range(count)]
        return [future.result(timeout=60) for future in futures]


def test_foreign_tables_refused(db_url: str, fake_clock: FakeClock) -> None:
    engine = sqlalchemy.create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE topics (id INTEGER)"))
    engine.dispose()
    with pytest.raises(FailedPrecondition, match="table 'topics' exists"):
        MetadataStore(db_url, fake_clock)


def test_closed_store_refuses_calls(store: MetadataStore) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(FailedPrecondition, match="closed"):
        store.list_topics()


# -- SQLite specifics ----------------------------------------------------------------------------


def test_sqlite_file_uses_wal(tmp_path, fake_clock: FakeClock) -> None:
    path = tmp_path / "metadata.db"
    MetadataStore(f"sqlite:///{path}", fake_clock).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_locked_past_timeout_is_unavailable(tmp_path, fake_clock: FakeClock) -> None:
    path = tmp_path / "metadata.db"
    store = MetadataStore(f"sqlite:///{path}", fake_clock, wait_timeout_ms=100)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(Unavailable, match="locked"):
            store.commit_offsets([("g", "orders", 0, 1)])
        holder.execute("ROLLBACK")
        store.commit_offsets([("g", "orders", 0, 1)])  # works again once the lock is gone
        assert _offset(store, "g", "orders", 0) == 1
    finally:
        holder.close()
        store.close()


def test_sqlite_stores_opening_a_new_file_together(tmp_path, fake_clock: FakeClock) -> None:
    # The switch to WAL answers SQLITE_BUSY at once (no busy handler) while another connection is
    # switching; before the store retried it, about one round in six failed here.
    for round_number in range(10):
        url = f"sqlite:///{tmp_path / f'round{round_number}.db'}"
        stores = _open_together(url, fake_clock, THREADS)
        for opened in stores:
            opened.close()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_refused(url: str, fake_clock: FakeClock) -> None:
    with pytest.raises(InvalidArgument, match="in-memory"):
        MetadataStore(url, fake_clock)


def test_missing_directory_refused(tmp_path, fake_clock: FakeClock) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        MetadataStore(f"sqlite:///{tmp_path / 'absent' / 'metadata.db'}", fake_clock)


def test_unsupported_backend_refused(fake_clock: FakeClock) -> None:
    with pytest.raises(InvalidArgument, match="supported are sqlite"):
        MetadataStore("mysql://user:secret@localhost/db", fake_clock)


def test_nodes_sharing_a_database_open_their_registries_at_the_same_time(db_url, fake_clock) -> None:
    """Commit log nodes sharing one database (HA, PostgreSQL) each create the system topics they do not
    find at start. A node that listed the topics before another created them must take the other's rows,
    not fail to start with AlreadyExists (seen in make compose-check-ha: one node of three died at start)."""
    from mqstore.store_topics import TopicRegistry
    from mqstore.topics import SYSTEM_TOPICS

    def registry() -> TopicRegistry:
        return TopicRegistry(4, queue_info=lambda topic, queue_id: None, refuse_write=lambda: None,
                             log_end=lambda: 0, append_lock=threading.Lock())

    first, late = registry(), registry()
    first.open(MetadataStore(db_url, fake_clock))
    stale = MetadataStore(db_url, fake_clock)
    stale.list_topics = lambda: []  # what it listed before the first node created the system topics
    late.open(stale)
    try:
        assert late.names() == first.names() >= SYSTEM_TOPICS
        assert {n: late.get(n) for n in SYSTEM_TOPICS} == {n: first.get(n) for n in SYSTEM_TOPICS}
    finally:
        first.close()
        late.close()


def test_an_etcd_url_is_refused_where_only_sql_is_opened(tmp_path) -> None:
    """etcd:// names the commit log's catalogs, opened by its service (mqstore_rpc.etcd_meta): the Transaction
    service's audit trail and a store built without that opener say so instead of failing on the URL."""
    from mqstore.config import StoreConfig
    from mqstore.meta.sql import open_engine
    from mqstore.store_parts import build_store
    with pytest.raises(InvalidArgument, match="audit trail\\) is SQL"):
        open_engine("etcd://a:1,b:2/mqstore/meta")
    store = build_store(StoreConfig(data_dir=tmp_path / "data", metadata_url="etcd://a:1/mqstore/meta"))
    with pytest.raises(InvalidArgument, match="opened by the CommitLog service"):
        store.start()
