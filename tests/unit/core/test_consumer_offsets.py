"""Consumer offsets in the commit log (mqstore.consumer_offsets, mqstore.format.offset_commit): the record's
bytes, the map against a dict, and the store on real files: a commit is a record of RMQ_SYS_CONSUMER_OFFSETS
(not a SQL row), several rows are one record, the map is rebuilt at start, DeleteTopic tombstones the
topic's offsets, retention deletes the old segments and the offsets survive, the SQL table of earlier
versions is imported once."""

from __future__ import annotations

import os
import random
import threading

import pytest

from mqstore import store_offsets
from mqstore.clock import SystemClock
from mqstore.consumer_offsets import ConsumerOffsets, OffsetMap
from mqstore.errors import InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from mqstore.format import offset_commit
from mqstore.format.offset_commit import TOMBSTONE, Row
from mqstore.meta.sql import MetadataStore
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from tests.conftest import golden_bytes

TOPIC = offset_commit.TOPIC


@pytest.fixture
def open_store(small_config):
    stores = []

    def make(clock=None, **overrides):
        stores.append(build_store(small_config(**overrides), clock))
        stores[-1].start()
        return stores[-1]
    yield make
    for store in stores:
        if store.running:
            store.stop()


# ---- the record's bytes

def test_offset_commit_golden_and_fields(request):
    rows = [Row("g1", "orders", 3, 1_073_741_824), Row("CID_RMQ_SYS_REVIVE_GROUP", "rmq_sys_REVIVE_LOG", 0, 7),
            Row("g1", "gone", 0, TOMBSTONE)]
    data = offset_commit.encode(rows)
    assert data == golden_bytes("offset_commit.bin", data, request)
    assert data[:7] == bytes.fromhex("4d51434f010003")  # magic "MQCO", version 1, 3 rows
    assert data[7:9 + 2] == b"\x00\x02g1" and data[11:13 + 6] == b"\x00\x06orders"
    assert data[19:31] == (3).to_bytes(4, "big") + (1_073_741_824).to_bytes(8, "big")
    assert data[-8:] == b"\xff" * 8  # the tombstone
    assert offset_commit.decode(data) == rows


@pytest.mark.parametrize("bad", [b"", b"MQCO", bytes.fromhex("4d51434f010000"), bytes.fromhex("4d51434f020001"),
                                 bytes.fromhex("00000000010001")])
def test_offset_commit_refuses_what_it_cannot_decode(bad):
    with pytest.raises(ValueError):
        offset_commit.decode(bad)


def test_offset_commit_refuses_short_long_and_bad_rows():
    good = offset_commit.encode([Row("g", "t", 0, 5)])
    for bad in (good[:-1], good + b"\x00", good[:7] + b"\x00\x00" + good[9:]):
        with pytest.raises(ValueError):
            offset_commit.decode(bad)
    for wrong in ([], [Row("", "t", 0, 0)], [Row("g", "", 0, 0)], [Row("g", "t", -1, 0)], [Row("g", "t", 0, -2)],
                  [Row("g" * 121, "t", 0, 0)], [Row("g", "t", 0, 0)] * (offset_commit.MAX_ROWS + 1)):
        with pytest.raises(ValueError):
            offset_commit.encode(wrong)


# ---- the map against a dict

def test_the_map_is_the_latest_row_of_each_key_in_log_order():
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rnd = random.Random(seed)
    model: dict[tuple, tuple[int, int]] = {}
    live = OffsetMap()
    keys = [(f"g{g}", f"t{t}", q) for g in range(3) for t in range(2) for q in range(3)]
    for physical in range(0, 400_000, 1000):
        rows = [Row(*rnd.choice(keys), rnd.choice([TOMBSTONE, rnd.randrange(100)])) for _ in range(rnd.randint(1, 4))]
        live.apply(physical, rows)
        for row in rows:
            if row.offset == TOMBSTONE:
                model.pop(row.key, None)
            else:
                model[row.key] = (row.offset, physical)
        key = rnd.choice(keys)
        assert live.get(key) == (model[key][0] if key in model else None)
        below = rnd.randrange(0, physical + 2000)
        assert live.live_below(below) == sorted((Row(*k, v[0]) for k, v in model.items() if v[1] < below),
                                                key=lambda r: r.key)
    assert live.rows() == sorted((*k, v[0]) for k, v in model.items())
    assert live.floor() == min((v[1] for v in model.values()), default=None)
    assert live.keys_of("t1") == sorted(k for k in model if k[1] == "t1")


def test_a_stale_look_at_the_queue_never_rebuilds_the_map():
    """A thread that saw the queue's end before another read past it (the race of concurrent commits) finds
    the map ahead of what it saw: it must not take that for a cut log and read everything again."""
    records = [(0, 100, offset_commit.encode([Row("g", "t", 0, 5)])),
               (1, 200, offset_commit.encode([Row("g", "t", 0, 6)]))]
    reads: list[int] = []
    looks = [(0, 1)]  # the first look is stale; then the truth

    def read(queue_offset, count):
        reads.append(queue_offset)
        return records[queue_offset:queue_offset + count]

    offsets = ConsumerOffsets(lambda body, replication: None, read, lambda: looks.pop() if looks else (0, len(records)))
    offsets._next = 2  # another thread applied both records meanwhile
    offsets._map.apply(100, [Row("g", "t", 0, 5)])
    offsets._map.apply(200, [Row("g", "t", 0, 6)])
    offsets.catch_up()
    assert reads == [] and offsets.get("g", "t", 0) == 6


# ---- the store

def _records(store: MessageStore) -> list[list[Row]]:
    info = store.queue_info(TOPIC, 0)
    return [offset_commit.decode(m.record.body)
            for m in store.pull(TOPIC, 0, info.min_offset, max_messages=1000).messages]


def test_a_commit_is_a_record_of_the_offsets_topic_not_a_sql_row(open_store):
    store = open_store()
    store.topic_admin.create("t", 2)
    store.append("t", [MessageIn(body=b"x", queue_id=i % 2) for i in range(10)])
    store_offsets.commit_offset(store, "g", "t", 1, 4)
    assert store_offsets.query_offset(store, "g", "t", 1) == 4
    assert _records(store) == [[Row("g", "t", 1, 4)]]
    assert store.topics.meta.list_offsets() == []  # the SQL table is no longer written
    with pytest.raises(OutOfRange):
        store_offsets.commit_offset(store, "g", "t", 1, 6)
    with pytest.raises(InvalidArgument):
        store_offsets.commit_offset(store, "bad group", "t", 1, 1)
    with pytest.raises(NotFound):
        store_offsets.commit_offset(store, "g", "t", 2, 0)  # no such queue
    with pytest.raises(NotFound, match="committed no offset"):
        store_offsets.query_offset(store, "g", "t", 0)
    assert _records(store) == [[Row("g", "t", 1, 4)]]  # nothing refused was appended


def test_the_rows_of_one_call_are_one_record(open_store):
    store = open_store()
    store.topic_admin.create("t", 2)
    store.append("t", [MessageIn(body=b"x", queue_id=i % 2) for i in range(10)])
    rows = [("g", "t", 0, 5), ("g", "t", 1, 2), ("h", "t", 0, 1)]
    store_offsets.commit_offsets(store, rows)
    assert _records(store) == [[Row(*row) for row in rows]]
    with pytest.raises(OutOfRange):
        store_offsets.commit_offsets(store, [("g", "t", 0, 1), ("g", "t", 1, 99)])  # one bad row: none of them
    assert store_offsets.query_offset(store, "g", "t", 0) == 5 and len(_records(store)) == 1


def test_the_map_is_rebuilt_from_the_log_at_start(open_store, small_config):
    store = open_store()
    store.topic_admin.create("t", 2)
    store.append("t", [MessageIn(body=b"x", queue_id=i % 2) for i in range(10)])
    for offset in range(6):
        store_offsets.commit_offset(store, "g", "t", 0, offset)
    store_offsets.commit_offsets(store, [("g", "t", 1, 3), ("h", "t", 0, 2)])
    store_offsets.commit_offset(store, "g", "t", 1, 1)  # back: a reset is allowed, the latest wins
    store.stop()
    again = open_store()
    assert [store_offsets.query_offset(again, *key) for key in (("g", "t", 0), ("g", "t", 1), ("h", "t", 0))] == \
        [5, 1, 2]
    assert again.offsets.rows() == [("g", "t", 0, 5), ("g", "t", 1, 1), ("h", "t", 0, 2)]


def test_delete_topic_tombstones_its_offsets(open_store):
    store = open_store()
    for name in ("t", "keep"):
        store.topic_admin.create(name, 1)
        store.append(name, [MessageIn(body=b"x")] * 3)
        store_offsets.commit_offset(store, "g", name, 0, 2)
    store.topic_admin.delete("t")
    assert _records(store)[-1] == [Row("g", "t", 0, TOMBSTONE)]
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"new")] * 3)
    with pytest.raises(NotFound, match="committed no offset"):
        store_offsets.query_offset(store, "g", "t", 0)
    store.stop()
    again = open_store()
    with pytest.raises(NotFound, match="committed no offset"):
        store_offsets.query_offset(again, "g", "t", 0)
    assert store_offsets.query_offset(again, "g", "keep", 0) == 2


def test_retention_deletes_the_old_segments_and_the_offsets_survive(open_store, fake_clock):
    config = dict(segment_size_bytes=8192, retention_ms=3_600_000, clean_interval_ms=100 * 3_600_000)
    store = open_store(clock=fake_clock, **config)
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x")] * 3)
    store_offsets.commit_offset(store, "idle", "t", 0, 1)  # in the first segment, never committed again
    store_offsets.commit_offset(store, "busy", "t", 0, 1)
    store_offsets.commit_offset(store, "busy", "t", 0, 2)
    store_offsets.commit_offset(store, "gone", "t", 0, 1)
    store_offsets.commit_offset(store, "gone", "t", 0, 2)  # overwritten: nothing of it is live in the first segment
    for i in range(40):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store_offsets.commit_offset(store, "busy", "t", 0, 3)
    store.flusher.flush_now()
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))
    assert store.retention.delete_expired_segments() >= 1
    assert store.segments.min_offset > 0 and store.queue_info(TOPIC, 0).min_offset > 0  # the first records went
    # the live rows of the expired segments were appended again, after everything else (the last commit too
    # when its segment is not the active one: the warmer may have created the next one)
    expected = [("busy", "t", 0, 3), ("gone", "t", 0, 2), ("idle", "t", 0, 1)]
    rewritten = _records(store)[-1]
    assert Row("gone", "t", 0, 2) in rewritten and Row("idle", "t", 0, 1) in rewritten
    assert store.offsets.rows() == expected
    store.stop()
    assert open_store(clock=fake_clock, **config).offsets.rows() == expected


def test_retention_never_passes_a_live_offset_on_a_node_that_does_not_rewrite(open_store, fake_clock):
    config = dict(segment_size_bytes=8192, retention_ms=3_600_000, clean_interval_ms=100 * 3_600_000)
    store = open_store(clock=fake_clock, **config)
    store.topic_admin.create("t", 1)
    store.append("t", [MessageIn(body=b"x")] * 3)
    store_offsets.commit_offset(store, "idle", "t", 0, 1)
    for i in range(40):
        store.append("t", [MessageIn(body=bytes([i]) * 1000)])
    store.flusher.flush_now()
    old = (fake_clock.now_ms() - 2 * 3_600_000) / 1000
    for seg in store.segments.segments:
        os.utime(seg.path, (old, old))
    store.retention._writable = lambda: False  # as a replica: it keeps what its map still needs
    assert store.retention.delete_expired_segments() == 0
    assert store_offsets.query_offset(store, "idle", "t", 0) == 1
    store.retention._writable = lambda: True

    def full(below):
        raise ResourceExhausted("the disk is full")
    store.offsets.rewrite_below = full  # a leader whose rewrite fails: retention goes on, below the floor
    assert store.retention.delete_expired_segments() == 0
    assert store_offsets.query_offset(store, "idle", "t", 0) == 1


def test_the_sql_offsets_of_an_earlier_version_are_imported_once(open_store, small_config):
    store = open_store()
    store.topic_admin.create("t", 2)
    store.append("t", [MessageIn(body=b"x", queue_id=i % 2) for i in range(10)])
    store.topic_admin.create("dropped", 1)
    url = store.config.metadata_url_resolved
    store.stop()
    meta = MetadataStore(url, SystemClock())
    meta.commit_offsets([("g", "t", 0, 4), ("g", "t", 1, 5), ("g", "dropped", 0, 0)])
    meta.delete_topic("dropped")  # its offsets go with it, as the earlier DeleteTopic did
    meta.close()
    again = open_store()
    assert again.offsets.rows() == []  # the store alone imports nothing: its composition asks (commit log's main)
    store_offsets.import_sql_offsets(again)
    assert again.offsets.rows() == [("g", "t", 0, 4), ("g", "t", 1, 5)]
    assert _records(again) == [[Row("g", "t", 0, 4), Row("g", "t", 1, 5)]]
    store_offsets.commit_offset(again, "g", "t", 0, 5)
    again.stop()
    third = open_store()  # the table still has the old rows: not imported again over newer commits
    store_offsets.import_sql_offsets(third)
    assert store_offsets.query_offset(third, "g", "t", 0) == 5 and len(_records(third)) == 2


def test_concurrent_commits_read_each_record_once_and_keep_the_latest(open_store):
    store = open_store()
    store.topic_admin.create("t", 4)
    store.append("t", [MessageIn(body=b"x", queue_id=i % 4) for i in range(400)])
    read = store.offsets._read
    seen: list[int] = []

    def counted(queue_offset, count):
        records = read(queue_offset, count)
        seen.extend(r[0] for r in records)
        return records
    store.offsets._read = counted

    def committer(index: int) -> None:
        for offset in range(1, 101):
            store_offsets.commit_offset(store, f"g{index}", "t", index % 4, offset)
    threads = [threading.Thread(target=committer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert store.offsets.rows() == sorted((f"g{i}", "t", i % 4, 100) for i in range(8))
    assert sorted(seen) == list(range(800)), "every record applied once, in order, never a rebuild"
