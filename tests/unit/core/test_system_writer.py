"""System topics are written only by the service that owns them: MessageStore.append's keyword-only
``system_writer`` is the one way in (the gRPC Append never sets it); born time 0 is the server's time."""

from __future__ import annotations

import pytest

from mqstore import topics
from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.format import record
from mqstore.model import MessageIn
from mqstore.store import MessageStore


@pytest.fixture
def store(small_config):
    clock = FakeClock()
    s = MessageStore(small_config(), clock)
    s.start()
    yield s
    s.stop()


@pytest.mark.parametrize("topic", sorted(topics.SYSTEM_TOPICS))
def test_only_the_owner_writes_a_system_topic(store, topic):
    owner = topics.system_topic_owner(topic)
    others = [o for o in topics.OWNER_DESCRIPTIONS if o != owner]
    for writer in [None, "", *others]:
        with pytest.raises(FailedPrecondition, match=topics.OWNER_DESCRIPTIONS[owner]):
            store.append(topic, [MessageIn(body=b"x")], system_writer=writer)
    assert store.queue_info(topic, 0).max_offset == 0
    if owner == topics.OWNER_STORE:  # no writer may name it: the store appends there itself
        store.create_topic("gone", 1)
        store.delete_topic("gone")
    else:
        result = store.append(topic, [MessageIn(body=b"x")], system_writer=owner)
        assert result[0].queue_offset == 0
    assert store.queue_info(topic, 0).max_offset == 1


def test_system_writer_is_keyword_only(store):
    with pytest.raises(TypeError):
        store.append("RMQ_SYS_TRANS_HALF_TOPIC", [MessageIn(body=b"x")], topics.OWNER_TRANSACTION)


def test_a_system_writer_writes_only_commit_records_into_user_topics(store):
    store.create_topic("orders", 1)
    with pytest.raises(InvalidArgument, match="only COMMIT records"):
        store.append("orders", [MessageIn(body=b"x")], system_writer=topics.OWNER_TRANSACTION)
    commit = MessageIn(body=b"x", sys_flag=record.SYSFLAG_TX_COMMIT, prepared_transaction_offset=0)
    assert store.append("orders", [commit], system_writer=topics.OWNER_TRANSACTION)[0].queue_offset == 0
    with pytest.raises(FailedPrecondition, match="only its own system topics"):
        store.append("orders", [commit], system_writer=topics.OWNER_SCHEDULE)


def test_born_timestamp_zero_is_the_batch_time(store):
    store.clock.advance(5_000)
    store.create_topic("t", 1)
    store.append("t", [MessageIn(body=b"now"), MessageIn(body=b"given", born_timestamp_ms=42)])
    first, second = store.pull("t", 0, 0).messages
    assert first.record.born_timestamp_ms == store.clock.now_ms() > 0
    assert second.record.born_timestamp_ms == 42
