"""The etcd catalogs (mqstore_rpc.etcd_meta: topics, users, rules, SDK keys of an HA group) against a real
three-member etcd on 127.0.0.1, one cluster for the module, a key prefix per test: the SQL catalog's contract
(the same calls, the same errors, run on both), two writers of one key (one wins, the other AlreadyExists), a
member killed during writes (nothing lost or doubled), the watch's poll, and the one-time import of a SQL
catalog into an empty prefix."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Iterator

import pytest

from mqstore.access import Rule
from mqstore.clock import FakeClock
from mqstore.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from mqstore.meta import MetadataStore
from mqstore.meta.auth import AuthStore
from mqstore.model import KIND_COMPACTION, KIND_NORMAL
from mqstore_rpc import catalogs, etcd_meta
from mqstore_rpc.etcd_client import EtcdCoordination
from tests.support.ha import etcd_cluster_or_skip
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]

WRITES_DURING_KILL = 40


@pytest.fixture(scope="module")
def cluster():
    etcd = etcd_cluster_or_skip(3)
    try:
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def url(cluster) -> str:
    return f"etcd://{cluster.endpoints}/test/{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["sql", "etcd"])
def topics(request, tmp_path, fake_clock: FakeClock) -> Iterator:
    if request.param == "sql":
        catalog = MetadataStore(f"sqlite:///{tmp_path / 'metadata.db'}", fake_clock)
    else:
        catalog = etcd_meta.EtcdTopicCatalog(request.getfixturevalue("url"), fake_clock)
    yield catalog
    catalog.close()


@pytest.fixture(params=["sql", "etcd"])
def auth(request, tmp_path, fake_clock: FakeClock) -> Iterator:
    if request.param == "sql":
        catalog = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", fake_clock)
    else:
        catalog = etcd_meta.EtcdAuthStore(request.getfixturevalue("url"), fake_clock)
    yield catalog
    catalog.close()


def test_the_url_names_the_members_and_the_prefix():
    parsed = etcd_meta.parse_url("etcd://a:1, b:2,c:3/mqstore/meta/")
    assert (parsed.endpoints, parsed.prefix) == ("a:1,b:2,c:3", "/mqstore/meta")
    assert etcd_meta.parse_url("ETCD://a:1").prefix == etcd_meta.DEFAULT_PREFIX
    with pytest.raises(InvalidArgument, match="names no member"):
        etcd_meta.parse_url("etcd:///x")
    with pytest.raises(InvalidArgument, match="not an etcd URL"):
        etcd_meta.parse_url("sqlite:///x.db")


def test_topics_keep_the_sql_catalogs_contract(topics, fake_clock):
    created = topics.create_topic("t", 4, KIND_NORMAL, 0, start_physical_offset=128)
    assert created.created_ms == fake_clock.now_ms() and topics.get_topic("t") == created
    with pytest.raises(AlreadyExists, match="exists already"):
        topics.create_topic("t", 8, KIND_NORMAL, 0)
    topics.create_topic("a%RETRY%", 1, KIND_COMPACTION, 0)
    assert [t.name for t in topics.list_topics()] == ["a%RETRY%", "t"]
    updated = topics.update_topic("t", queue_count=6)
    assert (updated.queue_count, updated.retention_ms, updated.start_physical_offset) == (6, 0, 128)
    with pytest.raises(NotFound, match="'nope' does not exist"):
        topics.update_topic("nope", queue_count=2)
    with pytest.raises(InvalidArgument):
        topics.create_topic("bad", 1, "WEIRD", 0)
    topics.mark_topic_deleting("t")
    assert [t.name for t in topics.list_topics()] == ["a%RETRY%"]
    assert [t.name for t in topics.deleting_topics()] == ["t"]
    with pytest.raises(AlreadyExists):  # a topic being deleted still holds its name
        topics.create_topic("t", 1, KIND_NORMAL, 0)
    topics.delete_topic("t")
    with pytest.raises(NotFound):
        topics.delete_topic("t")
    with pytest.raises(NotFound):
        topics.get_topic("t")
    assert topics.deleting_topics() == [] and topics.list_offsets() == []


def test_users_rules_and_keys_keep_the_sql_catalogs_contract(auth):
    first = auth.version()
    auth.create_user("alice", "normal", "hash-a")
    with pytest.raises(AlreadyExists):
        auth.create_user("alice", "super", "hash-b")
    rule = auth.add_rule(Rule("alice", "topic", "orders*", frozenset({"PUB", "SUB"}), "allow"))
    other = auth.add_rule(Rule("alice", "group", "g", frozenset({"SUB"}), "deny"))
    assert 0 < rule.rule_id < other.rule_id
    assert auth.rules("alice") == [rule, other] and auth.rules("bob") == []
    with pytest.raises(NotFound, match="no user 'bob'"):
        auth.add_rule(Rule("bob", "topic", "x", frozenset({"PUB"}), "allow"))
    auth.create_sdk_key("AK1", "alice", "sealed")
    with pytest.raises(AlreadyExists):
        auth.create_sdk_key("AK1", "alice", "sealed")
    assert auth.sdk_key("AK1").user == "alice" and [k.access_key for k in auth.sdk_keys("alice")] == ["AK1"]
    auth.update_user("alice", kind="super")
    assert auth.user("alice").kind == "super" and auth.user("alice").secret_hash == "hash-a"
    auth.delete_rule(rule.rule_id)
    with pytest.raises(NotFound):
        auth.delete_rule(rule.rule_id)
    assert auth.version() == first + 6  # every change bumped it once
    auth.delete_user("alice")  # its rules and keys go with it
    assert auth.user("alice") is None and auth.rules() == [] and auth.sdk_key("AK1") is None
    with pytest.raises(NotFound):
        auth.delete_user("alice")
    assert auth.version() == first + 7


def test_two_writers_of_one_key_one_wins_the_other_is_told(url, fake_clock):
    """Two catalogs (two clients, as two nodes) create the same topic and the same user at once, many times:
    exactly one of each pair succeeds, the other gets AlreadyExists; the auth version counts the winners."""
    a, b = (etcd_meta.EtcdTopicCatalog(url, fake_clock) for _ in range(2))
    ua, ub = (etcd_meta.EtcdAuthStore(url, fake_clock) for _ in range(2))
    try:
        start = ua.version()
        for i in range(10):
            outcomes: list[str] = []
            barrier = threading.Barrier(4)

            def run(call, *args, barrier=barrier, outcomes=outcomes):
                barrier.wait()
                try:
                    call(*args)
                    outcomes.append("won")
                except AlreadyExists:
                    outcomes.append("told")
            threads = [threading.Thread(target=run, args=(c.create_topic, f"t{i}", 1 + n, KIND_NORMAL, 0))
                       for n, c in enumerate((a, b))]
            threads += [threading.Thread(target=run, args=(u.create_user, f"u{i}", "normal", f"h{n}"))
                        for n, u in enumerate((ua, ub))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert sorted(outcomes) == ["told", "told", "won", "won"], outcomes
        assert [t.name for t in a.list_topics()] == sorted(f"t{i}" for i in range(10))
        assert ua.version() == start + 10
    finally:
        for catalog in (a, b, ua, ub):
            catalog.close()


def test_a_member_killed_during_writes_loses_and_doubles_nothing(cluster, url, fake_clock):
    """Writes go on while the member the client uses is killed: every create and rule returns, and each is
    there exactly once (a transaction sent again to another member after a lost answer is recognised)."""
    etcd = EtcdCoordination(cluster.endpoints, rpc_timeout_s=10, attempt_timeout_s=0.3)
    topics = etcd_meta.EtcdTopicCatalog(url, fake_clock, etcd=etcd)
    auth = etcd_meta.EtcdAuthStore(url, fake_clock, etcd=etcd)
    killed = [m.endpoint for m in cluster.members].index(etcd.current)
    try:
        auth.create_user("w", "normal", "h")
        for i in range(WRITES_DURING_KILL):
            if i == WRITES_DURING_KILL // 4:
                cluster.kill9(killed)
            topics.create_topic(f"k{i:03d}", 1, KIND_NORMAL, 0)
            auth.add_rule(Rule("w", "topic", f"k{i:03d}", frozenset({"PUB"}), "allow"))
        assert etcd.current != cluster.members[killed].endpoint
        assert [t.name for t in topics.list_topics()] == [f"k{i:03d}" for i in range(WRITES_DURING_KILL)]
        assert sorted(r.pattern for r in auth.rules("w")) == [f"k{i:03d}" for i in range(WRITES_DURING_KILL)]
    finally:
        etcd.close()
        cluster.restart(killed)


def test_the_watch_sees_a_topic_created_by_another_node(url, fake_clock):
    leader, replica = (etcd_meta.EtcdTopicCatalog(url, fake_clock) for _ in range(2))
    seen: list[int] = []
    watch = catalogs.TopicWatch(replica, lambda: seen.append(len(replica.list_topics())), poll_ms=20)
    watch.start()
    try:
        wait_until(lambda: watch.state().steps > 0, "the watch's first poll")
        leader.create_topic("made-elsewhere", 2, KIND_NORMAL, 0)
        wait_until(lambda: seen == [1], "the replica to reload after the leader's create", timeout_s=10)
    finally:
        watch.stop(5)
        leader.close()
        replica.close()


def test_a_sql_catalog_is_imported_once_into_an_empty_prefix(tmp_path, url, fake_clock):
    sql = MetadataStore(f"sqlite:///{tmp_path / 'metadata.db'}", fake_clock)
    sql_auth = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", fake_clock)
    kept = sql.create_topic("kept", 3, KIND_NORMAL, 60_000, start_physical_offset=4096)
    fake_clock.advance(5)
    sql.create_topic("half-deleted", 1, KIND_NORMAL, 0)
    sql.mark_topic_deleting("half-deleted")
    sql_auth.create_user("alice", "normal", "hash")
    sql_auth.add_rule(Rule("alice", "topic", "kept", frozenset({"SUB"}), "allow"))
    sql_auth.create_sdk_key("AK", "alice", "sealed")
    fake_clock.advance(1000)
    topics, auth = etcd_meta.EtcdTopicCatalog(url, fake_clock), etcd_meta.EtcdAuthStore(url, fake_clock)
    try:
        assert catalogs.import_topics(sql, topics) == 2
        assert catalogs.import_auth(sql_auth, auth) == (1, 1, 1)
        assert topics.list_topics() == [kept]  # created_ms and the incarnation kept
        assert [t.name for t in topics.deleting_topics()] == ["half-deleted"]
        assert auth.user("alice") == sql_auth.user("alice") and auth.sdk_key("AK") == sql_auth.sdk_key("AK")
        assert [(r.pattern, r.actions) for r in auth.rules("alice")] == [("kept", frozenset({"SUB"}))]
        with pytest.raises(FailedPrecondition, match="empty prefix only"):
            catalogs.import_topics(sql, topics)
        with pytest.raises(FailedPrecondition, match="empty prefix only"):
            catalogs.import_auth(sql_auth, auth)
    finally:
        for catalog in (sql, sql_auth, topics, auth):
            catalog.close()


def test_the_cli_imports_a_sql_catalog_and_run_ha_imports_an_earlier_data_dir_once(tmp_path, url, cluster):
    from mqstore_launcher import ha

    def cli(*args: str) -> subprocess.CompletedProcess:  # a process: the CLI configures logging for its own
        return subprocess.run([sys.executable, "-m", "mqstore_cli", "catalog", "import", "--to", url, *args],
                              capture_output=True, text=True, timeout=60)
    sql = MetadataStore(f"sqlite:///{tmp_path / 'metadata.db'}", FakeClock())
    sql.create_topic("from-sql", 2, KIND_NORMAL, 0)
    sql.close()
    done = cli("--metadata-url", f"sqlite:///{tmp_path / 'metadata.db'}")
    assert (done.returncode, done.stdout) == (0, f"imported 1 topics into {url}\n"), done.stderr
    done = cli("--metadata-url", f"sqlite:///{tmp_path / 'metadata.db'}")
    assert done.returncode == 1 and "empty prefix only" in done.stderr, done.stderr
    # make run-ha on a data dir of an earlier version: its metadata.db into the group's catalog, once
    assert ha.import_earlier_catalogs(tmp_path, cluster.endpoints) == {"topics": 1}
    assert ha.import_earlier_catalogs(tmp_path, cluster.endpoints) == {}
    catalog = etcd_meta.EtcdTopicCatalog(ha.catalog_url(cluster.endpoints), FakeClock())
    try:
        assert [t.name for t in catalog.list_topics()] == ["from-sql"]
    finally:
        catalog.close()
