"""IndexFile (RocketMQ layout): puts, chains, capacity, time granularity, sanity checks on open."""

from __future__ import annotations

import struct

import pytest

from index_testing import BASE_MS, key_with_min_hash
from mqstore.errors import DataLoss, ResourceExhausted
from mqstore.format import index_file as IF
from mqstore.format.index_file import CorruptIndexFile, IndexFile, IndexFileFull, key_hash
from mqstore.javahash import java_string_hash


@pytest.fixture
def make(tmp_path):
    files = []

    def _make(slots=4, entries=10, name="f"):
        file = IndexFile.create(tmp_path / name, slots, entries)
        files.append(file)
        return file

    yield _make
    for file in files:
        file.close()


def test_sizes_match_rocketmq():
    assert (IF.HEADER_SIZE, IF.SLOT_SIZE, IF.ENTRY_SIZE) == (40, 4, 20)
    assert IF.file_size_bytes(5_000_000, 20_000_000) == 420_000_040


@pytest.mark.parametrize("text", ["polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"])
def test_min_value_hash_maps_to_zero(text):
    assert java_string_hash(text) == -2**31
    assert key_hash(text) == 0


def test_found_min_value_keys_hash_to_zero():
    key = key_with_min_hash("T#order-")
    assert java_string_hash(key) == -2**31 and key_hash(key) == 0


def test_negative_hashes_are_negated():
    text = "abcdefghij"
    assert java_string_hash(text) < 0
    assert key_hash(text) == -java_string_hash(text)


def test_capacity_is_entry_count_minus_one(make):
    """IndexFileTest: a 400-entry file accepts 399 keys, the 400th put fails."""
    file = make(slots=100, entries=400)
    for i in range(399):
        file.put(f"key{i}", i, BASE_MS)
    with pytest.raises(IndexFileFull) as info:
        file.put("one-more", 399, BASE_MS)
    assert isinstance(info.value, ResourceExhausted)
    assert "399 of 399" in str(info.value)
    assert file.header.index_count == 400 and file.free_entries == 0


def test_header_and_head_insertion(make):
    file = make(slots=1, entries=10)
    file.put("a", 100, BASE_MS)
    file.put("b", 200, BASE_MS + 2500)
    file.put("a", 300, BASE_MS + 7000)
    h = file.header
    assert (h.begin_timestamp_ms, h.end_timestamp_ms) == (BASE_MS, BASE_MS + 7000)
    assert (h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count, h.index_count) == (100, 300, 1, 4)
    assert file.slot_head(0) == 3
    chain = [(n, e.phy_offset, e.time_diff_s, e.prev_index) for n, e in file.chain(0)]
    assert chain == [(3, 300, 7, 2), (2, 200, 2, 1), (1, 100, 0, 0)]
    assert file.entry(0) == IF.Entry(0, 0, 0, 0)  # entry 0 is never used


def test_time_diff_clamped_and_in_seconds():
    assert IF.time_diff_s(BASE_MS + 1999, BASE_MS) == 1
    assert IF.time_diff_s(BASE_MS - 5000, BASE_MS) == 0
    assert IF.time_diff_s(BASE_MS + (1 << 62), BASE_MS) == IF.INT_MAX
    assert IF.time_diff_s(BASE_MS, 0) == 0


def test_query_filters_hash_time_and_max_num(make):
    file = make(slots=1, entries=20)
    for i in range(10):
        file.put("a" if i % 2 == 0 else "b", 100 + i, BASE_MS + i * 1000)
    res = file.query("a", 0, 1 << 62, 100)
    assert [m.physical_offset for m in res.matches] == [108, 106, 104, 102, 100] and res.exhausted
    res = file.query("a", BASE_MS + 2000, BASE_MS + 6000, 100)
    assert [m.physical_offset for m in res.matches] == [106, 104, 102]
    res = file.query("a", 0, 1 << 62, 2)
    assert [m.physical_offset for m in res.matches] == [108, 106] and not res.exhausted
    rest = file.query("a", 0, 1 << 62, 100, start_entry=res.next_entry, start_ordinal=res.next_ordinal)
    assert [m.physical_offset for m in rest.matches] == [104, 102, 100]


def test_scan_bound_and_resume(make):
    file = make(slots=1, entries=40)
    for i in range(30):
        file.put(f"k{i % 3}", i, BASE_MS + i * 1000)
    res = file.query("k0", 0, 1 << 62, 100, max_scan_entries=7)
    assert res.next_ordinal == 7 and not res.exhausted
    found = [m.physical_offset for m in res.matches]
    while not res.exhausted:
        res = file.query("k0", 0, 1 << 62, 100, max_scan_entries=7, start_entry=res.next_entry,
                         start_ordinal=res.next_ordinal)
        found += [m.physical_offset for m in res.matches]
    assert found == list(range(27, -1, -3))


def test_contains_sees_only_the_newest_message(make):
    file = make(slots=2, entries=10)
    file.put("a", 10, BASE_MS)
    file.put("b", 20, BASE_MS)
    assert file.contains(key_hash("b"), 20)
    assert not file.contains(key_hash("a"), 20)


def test_reopen_keeps_everything(make, tmp_path):
    file = make(slots=3, entries=10)
    for i in range(5):
        file.put(f"k{i}", i * 10, BASE_MS + i * 1000)
    file.flush()
    file.close()
    again = IndexFile.open(tmp_path / "f", 3, 10)
    try:
        assert again.header == file.header
        assert [m.physical_offset for m in again.query("k3", 0, 1 << 62, 10).matches] == [30]
    finally:
        again.close()


def _damage(path, position, data):
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


@pytest.mark.parametrize("what, expect", [
    ("truncate", "size is"),
    ("index_count", "indexCount"),
    ("slot_count", "hashSlotCount"),
    ("slot_out", "slot points outside"),
    ("last_entry", "last entry"),
])
def test_open_rejects_damage_naming_file_and_problem(tmp_path, what, expect):
    path = tmp_path / "f"
    file = IndexFile.create(path, 4, 10)
    for i in range(5):
        file.put(f"k{i}", 100 + i, BASE_MS + i)
    file.flush()
    file.close()
    if what == "truncate":
        with open(path, "r+b") as f:
            f.truncate(100)
    elif what == "index_count":
        _damage(path, 36, struct.pack(">i", 11))
    elif what == "slot_count":
        _damage(path, 32, struct.pack(">i", 0))
    elif what == "slot_out":
        _damage(path, 40, struct.pack(">i", 9))
    else:
        _damage(path, 40 + 16 + 20 * 5 + 4, struct.pack(">q", 7))
    with pytest.raises(CorruptIndexFile) as info:
        IndexFile.open(path, 4, 10)
    assert isinstance(info.value, DataLoss)
    assert str(path) in str(info.value) and expect in str(info.value)


def test_forward_pointer_is_reported_not_looped(make):
    file = make(slots=1, entries=10)
    for i in range(3):
        file.put("a", i, BASE_MS)
    IF.ENTRY.pack_into(file._mm, 40 + 4 + 20 * 2, key_hash("a"), 1, 0, 3)  # entry 2 -> 3: a cycle
    with pytest.raises(CorruptIndexFile, match="points forward"):
        file.query("a", 0, 1 << 62, 10)


def test_put_hashes_writes_the_same_bytes_as_put_hash(tmp_path):
    one = IndexFile.create(tmp_path / "one", 7, 40)
    many = IndexFile.create(tmp_path / "many", 7, 40)
    messages = [(["a#1", "a#2", "a#9"], 100, BASE_MS), (["a#2"], 200, BASE_MS + 1500),
                (["a#3", "a#10", "a#17", "a#3"], 300, BASE_MS + 4000)]
    try:
        for keys, phy, ts in messages:
            for key in keys:
                one.put(key, phy, ts)
            many.put_hashes([key_hash(k) for k in keys], phy, ts)
        one.flush()
        many.flush()
        assert (tmp_path / "one").read_bytes() == (tmp_path / "many").read_bytes()
        assert many.header == one.header
        with pytest.raises(IndexFileFull):
            many.put_hashes([1] * 40, 400, BASE_MS)
    finally:
        one.close()
        many.close()
