"""System topics are written only by the service that owns them: MessageStore.append's keyword-only
``system_writer`` is the one way in (the gRPC Append never sets it); born time 0 is the server's time."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from mqstore import relayed, store_offsets, topics
from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition, InvalidArgument, InvariantViolation
from mqstore.format import offset_commit, record, tier_upload
from mqstore.model import KIND_NORMAL, MessageIn, TopicRecord
from mqstore.store_parts import build_store
from mqstore.writers import SYSTEM_WRITERS, WriterRules, Writers


@pytest.fixture
def store(small_config):
    clock = FakeClock()
    s = build_store(small_config(), clock)
    s.start()
    yield s
    s.stop()


@pytest.mark.parametrize("topic", sorted(topics.SYSTEM_TOPICS))
def test_only_the_owner_writes_a_system_topic(store, topic):
    rules = SYSTEM_WRITERS.owner_of(topic)
    owner = rules.owner
    others = [o for o in SYSTEM_WRITERS.owners() if o != owner]
    for writer in [None, "", *others]:
        with pytest.raises(FailedPrecondition, match=rules.description):
            store.append(topic, [MessageIn(body=b"x")], system_writer=writer)
    assert store.queue_info(topic, 0).max_offset == 0
    if owner == topics.OWNER_STORE:  # no writer may name it: the store appends there itself
        store.topic_admin.create("gone", 1)
        store.append("gone", [MessageIn(body=b"x")])
        if topic == offset_commit.TOPIC:
            store_offsets.commit_offset(store, "g", "gone", 0, 1)
        elif topic == tier_upload.TOPIC:  # the tier's uploader appends there (mqstore.tier.ledger)
            upload = tier_upload.Upload(tier_upload.STARTED, uuid.uuid4(), 0, 1, bytes(32), 0, "commitlog/x")
            store.append_own(topic, [MessageIn(body=tier_upload.encode(upload))])
        else:
            store.topic_admin.delete("gone")
    else:
        result = store.append(topic, [MessageIn(body=b"x")], system_writer=owner)
        assert result[0].queue_offset == 0
    assert store.queue_info(topic, 0).max_offset == 1


def test_the_stores_own_append_writes_only_its_own_topics(store):
    """append_own (the offsets map's way in, and the topic events') is append without the writers' check:
    only for the store's own topics; any other is a bug of its caller, never written."""
    store.topic_admin.create("orders", 1)
    for topic in ("orders", topics.REVIVE_TOPIC):
        with pytest.raises(InvariantViolation, match="not one of the store's own topics"):
            store.append_own(topic, [MessageIn(body=b"x")])
    assert store.queue_info("orders", 0).max_offset == 0
    body = offset_commit.encode([offset_commit.Row("g", "orders", 0, 1)])
    store.append_own(offset_commit.TOPIC, [MessageIn(body=body)])
    assert store_offsets.query_offset(store, "g", "orders", 0) == 1


def test_system_writer_is_keyword_only(store):
    with pytest.raises(TypeError):
        store.append("RMQ_SYS_TRANS_HALF_TOPIC", [MessageIn(body=b"x")], topics.OWNER_TRANSACTION)


def test_a_system_writer_writes_only_commit_records_into_user_topics(store):
    store.topic_admin.create("orders", 1)
    with pytest.raises(InvalidArgument, match="only COMMIT records"):
        store.append("orders", [MessageIn(body=b"x")], system_writer=topics.OWNER_TRANSACTION)
    commit = MessageIn(body=b"x", sys_flag=record.SYSFLAG_TX_COMMIT, prepared_transaction_offset=0)
    assert store.append("orders", [commit], system_writer=topics.OWNER_TRANSACTION)[0].queue_offset == 0
    with pytest.raises(FailedPrecondition, match="only its own system topics"):
        store.append("orders", [commit], system_writer=topics.OWNER_SCHEDULE)


def test_born_timestamp_zero_is_the_batch_time(store):
    store.clock.advance(5_000)
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"now"), MessageIn(body=b"given", born_timestamp_ms=42)])
    first, second = store.pull("t", 0, 0).messages
    assert first.record.born_timestamp_ms == store.clock.now_ms() > 0
    assert second.record.born_timestamp_ms == 42


def test_the_gateway_writes_its_clients_plain_messages_with_their_born_host(store):
    store.topic_admin.create("orders", 1)
    producer = MessageIn(body=b"x", born_host=b"\x0a\x01\x02\x03", born_port=50123)
    store.append("orders", [producer], system_writer=relayed.WRITER_GATEWAY)
    (stored,) = store.pull("orders", 0, 0).messages
    assert (stored.record.born_host, stored.record.born_port) == (b"\x0a\x01\x02\x03", 50123)
    refused = [MessageIn(body=b"x", sys_flag=record.SYSFLAG_TX_COMMIT),
               MessageIn(body=b"x", sys_flag=record.SYSFLAG_TX_PREPARED),
               MessageIn(body=b"x", prepared_transaction_offset=8), MessageIn(body=b"x", reconsume_times=1)]
    for message in refused:
        with pytest.raises(InvalidArgument, match="plain messages"):
            store.append("orders", [message], system_writer=relayed.WRITER_GATEWAY)
    for topic in sorted(topics.SYSTEM_TOPICS):
        with pytest.raises(FailedPrecondition, match="system topic"):
            store.append(topic, [MessageIn(body=b"x")], system_writer=relayed.WRITER_GATEWAY)
    retry = store.topics.ensure_pop_topic(topics.retry_topic("g", "orders")).name
    with pytest.raises(FailedPrecondition, match="retry or dead-letter"):
        store.append(retry, [MessageIn(body=b"x")], system_writer=relayed.WRITER_GATEWAY)
    assert store.queue_info("orders", 0).max_offset == 1 and store.queue_info(retry, 0).max_offset == 0


def test_an_unknown_writer_is_refused_naming_the_known_ones(store):
    store.topic_admin.create("orders", 1)
    with pytest.raises(InvalidArgument, match="'gateway', 'pop', 'schedule', 'txn'"):
        store.append("orders", [MessageIn(body=b"x")], system_writer="nobody")


def test_every_system_topic_has_one_registered_writer():
    assert {name: SYSTEM_WRITERS.owner_of(name) is not None for name in topics.SYSTEM_TOPICS} == dict.fromkeys(
        topics.SYSTEM_TOPICS, True)


def test_a_writer_registered_from_outside_is_asked_by_the_store(small_config):
    """A new system writer registers its rules; the store is not edited for it (and knows no writer)."""
    asked = []

    def check(topic, messages):
        asked.append((topic.name, len(messages)))
        if topic.name != "mine":
            raise FailedPrecondition("the test writer writes only 'mine'")

    writers = Writers()
    writers.register(WriterRules("tester", "the test writer", prefixes=("mine",), prefixed_what="the tester's",
                                 check=check))
    s = build_store(small_config(), FakeClock(), writers=writers)
    s.start()
    try:
        s.topic_admin.create("mine", 1)
        s.topic_admin.create("other", 1)
        assert s.append("mine", [MessageIn(body=b"x")], system_writer="tester")[0].queue_offset == 0
        with pytest.raises(FailedPrecondition, match="only the test writer writes it"):
            s.append("mine", [MessageIn(body=b"x")])
        with pytest.raises(FailedPrecondition, match="writes only 'mine'"):
            s.append("other", [MessageIn(body=b"x")], system_writer="tester")
        with pytest.raises(InvalidArgument, match=r"known: \['tester'\]"):
            s.append("other", [MessageIn(body=b"x")], system_writer=topics.OWNER_POP)
        with pytest.raises(FailedPrecondition, match="no writer of this process"):  # txn is not registered here
            s.append("RMQ_SYS_TRANS_HALF_TOPIC", [MessageIn(body=b"x")])
        assert asked == [("mine", 1), ("other", 1)]
    finally:
        s.stop()


def test_two_writers_of_one_topic_are_a_composition_bug():
    writers = Writers()
    writers.register(WriterRules("a", "A", frozenset({topics.SCHEDULE_TOPIC})))
    writers.register(WriterRules("a", "A", frozenset({topics.SCHEDULE_TOPIC})))  # the same again: nothing
    with pytest.raises(InvariantViolation, match="two writers"):
        writers.register(WriterRules("b", "B", frozenset({topics.SCHEDULE_TOPIC})))
    with pytest.raises(InvariantViolation, match="not a system topic"):
        writers.register(WriterRules("c", "C", frozenset({"orders"})))
    topic = TopicRecord("orders", 1, KIND_NORMAL, 0, 0)
    writers.check(topic, [MessageIn(body=b"x")], None)  # anybody writes an ordinary topic


def test_the_commit_logs_composition_registers_every_system_writer():
    """The commit log takes other processes' appends (CommitLogInternal): its main composes every writer's
    rules (mqstore.system_writers), without the tests' conftest."""
    code = ("import commitlog_service.main\nfrom mqstore import topics\n"
            "from mqstore.format import offset_commit, tier_upload, topic_event\n"
            "from mqstore.writers import SYSTEM_WRITERS\n"
            "print(SYSTEM_WRITERS.owners(), all(SYSTEM_WRITERS.owner_of(t) for t in topics.SYSTEM_TOPICS\n"
            "    if t not in (topic_event.TOPIC, offset_commit.TOPIC, tier_upload.TOPIC)))"
            "  # the store's own: its store adds them")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['gateway',", "'pop',", "'schedule',", "'txn']", "True"]
