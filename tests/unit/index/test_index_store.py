"""IndexStore: keys indexed, rolling files, idempotent re-feeds, limits, paging, retention, checkpoint."""

from __future__ import annotations

import pytest

from index_testing import BASE_MS, Model, all_pages, min_hash_key_for_topic, record, tiny_config
from mqstore.index import checkpoint as ckpt
from mqstore.index import paging
from mqstore.index.store import IndexStore
from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.format.index_file import HEADER_SIZE, SLOT_SIZE, CorruptIndexFile, IndexFile


@pytest.fixture
def open_store(tmp_path):
    stores = []

    def _open(**overrides):
        store = IndexStore(tiny_config(tmp_path, **overrides), clock=FakeClock(BASE_MS))
        store.start()
        stores.append(store)
        return store

    yield _open
    for store in stores:
        store.close()


def phys(result):
    return [loc.physical_offset for loc in result.locators]


def test_keys_uniq_key_and_rollback(open_store):
    store = open_store()
    store.apply([record(100, ["k1 k2", "k3"], uniq="U1"),
                 record(200, ["k1"], topic="Other"),
                 record(300, ["k1"], rollback=True)], 400)
    assert phys(store.query("T", "k1")) == [100]
    assert phys(store.query("T", "k2")) == [100] == phys(store.query("T", "k3"))
    assert phys(store.query("T", "U1")) == [100]
    assert phys(store.query("Other", "k1")) == [200]


def test_full_file_rolls_at_once_and_keys_never_straddle(open_store, tmp_path):
    store = open_store(entry_count=8, max_keys_per_message=4)  # 7 entries a file
    model = Model()
    records = [record(100 * i, [f"a{i % 5}", f"b{i % 3}", "c"] if i % 2 else [f"a{i % 5}"])
               for i in range(1, 30)]
    for rec in records:
        store.apply([rec], rec.physical_offset + 100)
        model.add(rec)
    for key in ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2", "c"]:
        assert all_pages(store, "T", key) == model.query("T", key, 0, 1 << 62), key
    store.checkpoint()
    for path in sorted((tmp_path / "index").glob("*.idx")):
        file = IndexFile.open(path, 4, 8)
        per_phy = {}
        for n in range(1, file.header.index_count):
            per_phy.setdefault(file.entry(n).phy_offset, 0)
            per_phy[file.entry(n).phy_offset] += 1
        file.close()
        for phy, count in per_phy.items():
            rec = next(r for r in records if r.physical_offset == phy)
            assert count == len(set(rec.keys)), f"message {phy} straddles two files"
    assert store.stats().files_unsealed > 3


def test_reapply_is_idempotent_and_completes_a_half_indexed_message(open_store):
    store = open_store()
    batch = [record(100, ["a"]), record(200, ["b", "c", "d"])]
    store.apply(batch, 300)
    store.apply(batch, 300)
    assert phys(store.query("T", "a")) == [100] and phys(store.query("T", "d")) == [200]
    assert store.stats().entries == 4
    # A crash after two of three keys of message 300: its keys are completed, none duplicated.
    writable = store._writer.current.file
    writable.put("T#e", 300, BASE_MS + 300_000)
    writable.put("T#f", 300, BASE_MS + 300_000)
    store._writer.end_phy_offset = 300
    store.apply([record(300, ["e", "f", "g"])], 400)
    assert store.stats().entries == 7
    for key in "efg":
        assert phys(store.query("T", key)) == [300]


def tear_slots_of_last_put(file: IndexFile) -> None:
    """A crash between the header and the slots of the last put_hashes: entries and header written,
    every slot the put changed still holding its old head (the first new entry's prev)."""
    end, first = file.header.end_phy_offset, file.header.index_count - 1
    while first > 1 and file.entry(first - 1).phy_offset == end:
        first -= 1
    for number in range(file.header.index_count - 1, first - 1, -1):  # oldest prev wins per slot
        entry = file.entry(number)
        at = HEADER_SIZE + SLOT_SIZE * (entry.key_hash % file.slot_count)
        file._mm[at:at + SLOT_SIZE] = entry.prev_index.to_bytes(SLOT_SIZE, "big")


@pytest.mark.parametrize("before", [[], [record(50, ["a", "b"])], [record(50, ["a"]), record(60, ["x y"])]])
def test_a_put_torn_between_header_and_slots_is_finished_in_place(tmp_path, before):
    """Fed again, the torn message's slots are written as the whole put would have written them: the
    files equal those of a store that never crashed. With no message before it, the torn message fills
    its file alone (3 keys, 3 entries): repairing by re-putting would roll to a second file of the same
    name (it used to fail with FileExistsError)."""
    torn_message = record(100, ["k1 k2", "k3"])
    entries = 3 + len(" ".join(k for r in before for k in r.keys).split())  # fills the first file
    files = {}
    for name in ("whole", "torn"):
        store = IndexStore(tiny_config(tmp_path / name, slot_count=2, entry_count=entries + 1, max_keys_per_message=3),
                           clock=FakeClock(BASE_MS))
        store.start()
        try:
            for rec in before:
                store.apply([rec], rec.physical_offset + 1)
            store.apply([torn_message], 101)
            assert store._writer.current.file.free_entries == 0
            if name == "torn":
                tear_slots_of_last_put(store._writer.current.file)
                assert phys(store.query("T", "k3")) == []  # unreachable until fed again
                store.apply([torn_message, record(120, ["k1"])], 121)
            else:
                store.apply([record(120, ["k1"])], 121)
            for key in ("k1", "k2", "k3"):
                assert 100 in phys(store.query("T", key)), key
            assert phys(store.query("T", "k1")) == [120, 100]
            assert store.stats().entries == entries + 1  # none duplicated; k1 of 120 in the next file
            store.checkpoint()
        finally:
            store.close()
        files[name] = {p.name: p.read_bytes() for p in sorted((tmp_path / name / "index").glob("*.idx"))}
    assert files["torn"] == files["whole"]
    assert len(files["whole"]) == 2


def test_min_value_key_and_many_keys_in_one_slot(open_store):
    store = open_store(slot_count=1, entry_count=64, max_keys_per_message=8)
    special = min_hash_key_for_topic("T")
    model = Model()
    for i in range(40):
        rec = record(10 * (i + 1), [special if i % 4 == 0 else f"k{i % 6}"])
        store.apply([rec], rec.physical_offset + 10)
        model.add(rec)
    for key in [special] + [f"k{j}" for j in range(6)]:
        assert all_pages(store, "T", key) == model.query("T", key, 0, 1 << 62)


def test_colliding_keys_in_one_message_are_deduplicated(open_store):
    store = open_store()
    store.apply([record(100, ["Aa", "BB"])], 200)  # same Java hash: two entries, one message
    assert phys(store.query("T", "Aa")) == [100]
    assert phys(store.query("T", "BB")) == [100]


def test_max_num_default_clamp_and_bad_arguments(open_store):
    store = open_store(entry_count=200, max_keys_per_message=2, default_max_num=5, max_max_num=20)
    store.apply([record(i, ["hot"]) for i in range(1, 100)], 100)
    assert len(store.query("T", "hot").locators) == 5
    result = store.query("T", "hot", max_num=1_000_000)
    assert len(result.locators) == 20 and result.max_num == 20
    for kwargs in ({"max_num": -1}, {"begin_ms": 5, "end_ms": 4}, {"begin_ms": -1}):
        with pytest.raises(InvalidArgument):
            store.query("T", "hot", **kwargs)
    with pytest.raises(InvalidArgument):
        store.query("", "hot")


def test_pages_cover_everything_once(open_store):
    store = open_store(entry_count=10, max_keys_per_message=2)
    store.apply([record(i * 10, ["hot", f"x{i}"]) for i in range(1, 60)], 600)
    expected = list(range(590, 0, -10))
    for max_num in (1, 3, 7, 100):
        assert all_pages(store, "T", "hot", max_num=max_num) == expected


def test_scan_limit_pages_instead_of_dropping(open_store):
    store = open_store(slot_count=1, entry_count=100, max_keys_per_message=2, max_scan_entries=4)
    store.apply([record(i, ["noise"] if i % 5 else ["rare"]) for i in range(1, 90)], 90)
    first = store.query("T", "rare", max_num=50)
    assert first.next_page_token and len(first.locators) < 17
    assert all_pages(store, "T", "rare", max_num=50) == list(range(85, 0, -5))


def test_page_token_is_bound_to_its_query(open_store):
    store = open_store()
    store.apply([record(i, ["hot"]) for i in range(1, 8)], 8)
    token = store.query("T", "hot", max_num=2).next_page_token
    with pytest.raises(InvalidArgument, match="another query"):
        store.query("T", "cold", max_num=2, page_token=token)
    with pytest.raises(InvalidArgument):
        store.query("T", "hot", max_num=2, page_token="not-a-token!")


def test_a_portable_token_continues_on_a_store_whose_files_roll_elsewhere(open_store, tmp_path):
    """paging.portable (issue 34): a token of one Index instance, used on another whose files start at
    other records, continues with nothing skipped or repeated; the raw token names a position that is not one there."""
    records = [record(i, ["hot"]) for i in range(1, 40)]
    big = open_store(entry_count=200)
    big.apply(records, 40)
    small = IndexStore(tiny_config(tmp_path / "small", entry_count=8), clock=FakeClock(BASE_MS))
    small.start()
    try:
        small.apply(records, 40)
        first = big.query("T", "hot", max_num=5)
        token, seen = paging.portable(first.next_page_token), list(phys(first))
        while token:
            page = small.query("T", "hot", max_num=5, page_token=token)
            seen += phys(page)
            token = page.next_page_token and paging.portable(page.next_page_token)
        assert seen == list(range(39, 0, -1))
        with pytest.raises(CorruptIndexFile):  # the raw token there: big's entry number in small's first file
            small.query("T", "hot", max_num=100, page_token=first.next_page_token)
        with pytest.raises(InvalidArgument):
            paging.portable("not-a-token!")
    finally:
        small.close()


def test_time_range_keeps_seconds_and_never_misses(open_store):
    store = open_store(entry_count=64)
    stamps = [BASE_MS + 250, BASE_MS + 1_700, BASE_MS + 2_999, BASE_MS + 4_001]
    store.apply([record(i + 1, ["k"], ts_ms=ts) for i, ts in enumerate(stamps)], 10)
    for begin in range(BASE_MS, BASE_MS + 5000, 137):
        for end in range(begin, BASE_MS + 5000, 411):
            got = set(phys(store.query("T", "k", begin_ms=begin, end_ms=end)))
            exact = {i + 1 for i, ts in enumerate(stamps) if begin <= ts <= end}
            assert exact <= got, (begin, end)
            assert all(begin - 1999 <= stamps[p - 1] <= end + 999 for p in got)


def test_retention_never_deletes_the_newest_or_skips(open_store, tmp_path):
    store = open_store(entry_count=5, max_keys_per_message=2)
    store.apply([record(i * 100, ["k"]) for i in range(1, 13)], 1300)  # files of 4 messages
    names = sorted(p.name for p in (tmp_path / "index").glob("*.idx"))
    assert len(names) == 3
    assert store.delete_before(400) == 0  # the first file ends at 400 exactly: still needed
    assert store.delete_before(401) == 1
    assert store.delete_before(10**9) == 1  # never the newest
    assert sorted(p.name for p in (tmp_path / "index").glob("*.idx")) == names[2:]
    assert phys(store.query("T", "k")) == [1200, 1100, 1000, 900]


def test_checkpoint_round_trip_and_resume(open_store, tmp_path):
    store = open_store()
    store.apply([record(100, ["a"])], 250)
    cp = store.checkpoint()
    assert cp.next_physical_offset == 250
    assert ckpt.load(tmp_path / "index" / ckpt.FILE_NAME) == cp
    store.close()
    again = open_store()
    assert again.resume_physical_offset() == 250
    assert phys(again.query("T", "a")) == [100]


def test_checkpoint_is_written_by_apply_on_its_interval(tmp_path):
    clock = FakeClock(BASE_MS)
    store = IndexStore(tiny_config(tmp_path, checkpoint_interval_ms=1000), clock=clock)
    store.start()
    store.apply([record(1, ["a"])], 10)
    assert ckpt.load(tmp_path / "index" / ckpt.FILE_NAME) is None
    clock.advance(1000)
    store.apply([record(20, ["a"])], 30)
    assert ckpt.load(tmp_path / "index" / ckpt.FILE_NAME).next_physical_offset == 30
    store.close()


def test_closed_store_refuses(open_store):
    store = open_store()
    store.close()
    with pytest.raises(FailedPrecondition):
        store.apply([record(1, ["a"])], 2)


def test_uniq_keys_sharing_a_prefix_are_found_across_topics(tmp_path):
    # UNIQ_KEYs of one batch differ only in the last four characters; the writer reuses the hash state
    # of the shared part. Every key must still be found under its own topic.
    from mqstore.index.config import IndexConfig
    from mqstore.index.records import IndexRecord
    from mqstore.index.store import IndexStore

    store = IndexStore(IndexConfig(data_dir=tmp_path, slot_count=64, entry_count=1024))
    store.start()
    try:
        records, phy = [], 100
        for batch in range(3):
            for i in range(6):
                uniq = f"7F00000117F9877B6447687B{batch:08X}{i:04X}"
                topic = "A" if i % 2 else "B"
                records.append(IndexRecord(phy, 1_700_000_000_000 + phy, topic, ("k",), uniq))
                phy += 100
        store.apply(records, phy)
        for rec in records:
            found = [loc.physical_offset for loc in store.query(rec.topic, rec.uniq_key).locators]
            assert found == [rec.physical_offset]
            assert store.query("A" if rec.topic == "B" else "B", rec.uniq_key).locators == ()
    finally:
        store.close()
