"""IndexQueries (index candidates -> verified answers) on a real IndexStore, with the messages served
by the in-memory commit log of fake_log.py. Checked against a trivially correct model: a filter over
every message ever appended."""

from __future__ import annotations

import pytest
from fake_log import BASE_MS, FakeLog
from mqstore.index import paging
from mqstore.index.decode import index_records
from mqstore.index.lookup import IndexQueries, LookupConfig
from mqstore.index.store import IndexStore
from mqstore.index.upkeep import UpkeepState
from index_testing import seeded_random, tiny_config
from mqstore.errors import InvalidArgument, NotFound
from mqstore.follow import FollowerState
from mqstore.javahash import java_string_hash

IDLE = FollowerState(True, 0, 0, 0, "", True, True)
UPKEEP = UpkeepState(0, 0, "", True, True)


@pytest.fixture
def store(tmp_path):
    s = IndexStore(tiny_config(tmp_path, slot_count=4, entry_count=40, max_keys_per_message=4))
    s.start()
    yield s
    s.close()


def feed(store, log: FakeLog) -> None:
    data = b"".join(s.data for s in log.stored)
    store.apply(index_records(data), log.end())


def queries(store, log, **config) -> IndexQueries:
    return IndexQueries(store, log, lambda: IDLE, lambda: UPKEEP, LookupConfig(**config))


def all_pages(q: IndexQueries, topic: str, key: str, page_size: int, **kw) -> list[int]:
    found, token = [], ""
    for _ in range(10_000):
        page = q.by_key(topic, key, kw.get("begin_ms", 0), kw.get("end_ms", 0), page_size, token,
                        kw.get("include_messages", False))
        assert len(page.messages) <= page_size
        found += [m.record.physical_offset for m in page.messages]
        token = page.next_page_token
        if not token:
            return found
    raise AssertionError("too many pages")


def test_random_queries_match_a_filter_over_every_message(store):
    rng, _ = seeded_random("lookup-model")
    log = FakeLog()
    topics, keys = ["t", "u"], [f"k{i}" for i in range(12)] + ["Aa", "BB"]  # Aa/BB: same Java hash
    ts = BASE_MS
    for i in range(300):  # store times never go backwards in log order (the commit log's promise)
        ts += rng.randrange(0, 40)
        log.append(rng.choice(topics), tuple(rng.sample(keys, rng.randrange(3))), f"U{i}", store_timestamp_ms=ts)
    feed(store, log)
    q = queries(store, log, max_rounds=3)
    for _ in range(60):
        topic, key = rng.choice(topics), rng.choice(keys)
        begin = BASE_MS + rng.randrange(0, 6_000)
        end = begin + rng.randrange(0, 6_000)
        expected = [s.physical_offset for s in reversed(log.stored)
                    if s.topic == topic and key in s.keys and begin <= s.store_timestamp_ms <= end]
        assert all_pages(q, topic, key, rng.randrange(1, 9), begin_ms=begin, end_ms=end) == expected


def test_collisions_are_counted_and_the_page_refilled(store):
    assert java_string_hash("t#Aa") == java_string_hash("t#BB")
    log = FakeLog()
    for i in range(20):
        log.append("t", ("Aa" if i % 4 == 0 else "BB",), f"U{i}")
    feed(store, log)
    page = queries(store, log).by_key("t", "Aa", 0, 0, 3, "", False)
    assert [m.record.physical_offset for m in page.messages] == [log.stored[i].physical_offset for i in (16, 12, 8)]
    assert page.collisions_removed >= 9 and page.next_page_token and page.missing_removed == 0
    bounded = queries(store, log, max_rounds=1).by_key("t", "Aa", 0, 0, 1, "", False)
    assert bounded.messages == [] and bounded.collisions_removed == 1 and bounded.next_page_token


def test_max_rounds_bounds_the_work_and_the_token_continues(store):
    log = FakeLog()
    for i in range(30):
        log.append("t", ("Aa" if i == 0 else "BB",), f"U{i}")  # the only Aa is the oldest
    feed(store, log)
    q = queries(store, log, max_rounds=2)
    page = q.by_key("t", "Aa", 0, 0, 4, "", False)
    assert page.messages == [] and page.next_page_token and log.fetched == 8
    assert all_pages(q, "t", "Aa", 4) == [log.stored[0].physical_offset]


def test_messages_gone_from_the_log_are_dropped_and_counted(store):
    log = FakeLog()
    for i in range(10):
        log.append("t", ("k",), f"U{i}")
    feed(store, log)
    log.delete_head(log.stored[4].physical_offset)
    page = queries(store, log).by_key("t", "k", 0, 0, 0, "", False)
    assert len(page.messages) == 6 and page.missing_removed == 4


def test_a_page_stops_before_its_messages_pass_the_byte_budget(store):
    log = FakeLog()
    for i in range(10):
        log.append("t", ("k",), f"U{i}", body=b"x" * 500)
    feed(store, log)
    q = queries(store, log, max_response_bytes=2_000)
    page = q.by_key("t", "k", 0, 0, 10, "", True)
    assert len(page.messages) == 3 and page.size_bytes <= 2_000 and page.next_page_token
    assert paging.decode(page.next_page_token, paging.fingerprint("t", "k", 0, paging.MAX_TIME_MS)).before_phy == \
        page.messages[-1].record.physical_offset
    assert all_pages(q, "t", "k", 10, include_messages=True) == [s.physical_offset for s in reversed(log.stored)]


def test_by_uniq_key_checks_the_uniq_key_itself(store):
    log = FakeLog()
    log.append("t", ("U7",), "U1")  # KEYS holds the other message's id: not a match by id
    target = log.append("t", (), "U7")
    feed(store, log)
    q = queries(store, log)
    assert [m.record.physical_offset for m in q.by_uniq_key("t", "U7", False).messages] == [target.physical_offset]
    with pytest.raises(NotFound):
        q.by_uniq_key("t", "U404", False)
    with pytest.raises(NotFound):
        q.by_uniq_key("other", "U7", False)


def test_bad_arguments_and_clamps(store):
    log = FakeLog()
    log.append("t", ("k",), "U0")
    feed(store, log)
    q = queries(store, log)
    assert len(q.by_key("t", "k", 0, 0, 10**9, "", False).messages) == 1
    for args in (("t", "", 0, 0, 1), ("", "k", 0, 0, 1), ("t", "k", 5, 4, 1), ("t", "k", 0, 0, -1)):
        with pytest.raises(InvalidArgument):
            q.by_key(*args, "", False)
    with pytest.raises(InvalidArgument):
        q.by_time("", 0, 0)
    assert q.by_time("t", 0, 0) == 0
