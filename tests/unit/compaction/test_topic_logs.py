"""Which topic of a name a compactor's logs hold (topic.incarnation): a record of a newer topic of the
name replaces the older one's logs, one of an older topic is refused, and a reopen keeps the answer."""

from __future__ import annotations

from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from tests.support.compaction import BASE_MS, raw


def test_a_newer_topic_of_the_name_replaces_the_logs_of_an_older_one(tmp_path):
    store = CompactionStore(tmp_path, CompactionConfig(segment_size_bytes=4096), FakeClock(BASE_MS))
    for offset in range(5):
        assert store.append("kv", 0, raw(f"k{offset}", b"old", offset, BASE_MS), offset, None, BASE_MS, 100)
    assert store.incarnation("kv") == 100
    assert not store.append("kv", 0, raw("x", b"older", 9, BASE_MS), 9, None, BASE_MS, 50)  # an older topic's
    assert store.append("kv", 0, raw("k1", b"new", 0, BASE_MS), 0, None, BASE_MS, 900)
    assert store.incarnation("kv") == 900 and set(store.slot("kv", 0).qlog.latest) == {"k1"}
    store.close()
    again = CompactionStore(tmp_path, CompactionConfig(segment_size_bytes=4096), FakeClock(BASE_MS))
    assert again.incarnation("kv") == 900 and again.slot("kv", 0).qlog.next_offset() == 1
    again.drop_topic("kv")
    assert again.incarnation("kv") is None and list(tmp_path.iterdir()) == []
    again.close()
