"""A replica's copy of its primary's compaction logs (mqstore.compaction.replica.ReplicaCopy): pages from
its own next offset, each record as stored and counted once, a wrong record refused; topics the primary
no longer lists, or lists with another start, dropped; a page of an older topic than the one held ignored."""

from __future__ import annotations

import pytest

from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.replica import ReplicaCopy
from mqstore.compaction.store import CompactionStore
from mqstore.errors import Unavailable
from tests.support.compaction import BASE_MS, raw


@pytest.fixture
def store(tmp_path):
    store = CompactionStore(tmp_path / "logs", CompactionConfig(), FakeClock(BASE_MS))
    yield store
    store.close()


def _primary(records: list[bytes], page: int = 2):
    """``pull(offset)`` over ``records`` (queue offsets 0..), ``page`` at a time; the offsets asked for."""
    asked = []

    def pull(offset: int) -> list[bytes]:
        asked.append(offset)
        return records[offset:offset + page]
    return pull, asked


def test_a_queue_is_copied_page_by_page_from_its_own_next_offset_and_counted_once(store):
    copy = ReplicaCopy(store, "primary:1")
    records = [raw(f"k{i}", b"v", i, BASE_MS) for i in range(5)]
    pull, asked = _primary(records)
    copy.copy("kv", 0, 0, pull)
    assert asked == [0, 2, 4, 5] and store.slot("kv", 0).qlog.next_offset() == 5 and copy.applied == 5
    pull, asked = _primary(records + [raw("k5", b"v", 5, BASE_MS)])
    copy.copy("kv", 0, 0, pull)  # the next pass: only what is newer
    assert asked == [5, 6] and copy.applied == 6


def test_a_record_of_another_queue_is_refused(store):
    copy = ReplicaCopy(store, "primary:1")
    pull, _ = _primary([raw("a", b"v", 0, BASE_MS, queue_id=1)])
    with pytest.raises(Unavailable, match="primary:1 answered a record of kv/1 for kv/0"):
        copy.copy("kv", 0, 0, pull)
    assert copy.applied == 0


def test_topics_not_listed_as_held_are_dropped(store):
    copy = ReplicaCopy(store, "primary:1")
    for topic in ("kv", "gone", "again"):
        copy.copy(topic, 0, 0, _primary([raw("a", b"v", 0, BASE_MS, topic=topic)])[0])
    copy.reconcile({"kv": 0, "again": 900})  # gone: deleted; again: deleted and created again at 900
    assert store.topics() == ["kv"]


def test_a_page_of_an_older_topic_than_the_one_held_is_ignored(store):
    copy = ReplicaCopy(store, "primary:1")
    copy.copy("kv", 0, 900, _primary([raw("new", b"v", 0, BASE_MS)])[0])
    pull, asked = _primary([raw("old", b"v", 0, BASE_MS)])
    copy.copy("kv", 0, 0, pull)  # the primary's list was older than what was copied
    assert asked == [] and set(store.slot("kv", 0).qlog.latest) == {"new"} and copy.applied == 1
