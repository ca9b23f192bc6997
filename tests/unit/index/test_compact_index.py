"""Compact layout: conversion, header checks, verify, and at most two ranged reads per query."""

from __future__ import annotations

import pytest

from index_testing import BASE_MS
from mqstore.format import compact_index as CI
from mqstore.format.index_file import CorruptIndexFile, IndexFile


class CountingReader:
    """A RangeReader over bytes that records every read."""

    def __init__(self, data: bytes, name: str = "mem"):
        self.data, self.name, self.size_bytes = data, name, len(data)
        self.reads: list[tuple[int, int]] = []

    def read(self, position: int, length_bytes: int) -> bytes:
        self.reads.append((position, length_bytes))
        return self.data[position:position + length_bytes]


@pytest.fixture
def source(tmp_path):
    file = IndexFile.create(tmp_path / "src", 5, 64)
    for i in range(40):
        file.put(f"T#k{i % 7}", 1000 + i * 10, BASE_MS + i * 1000)
    yield file
    file.close()


def test_file_and_bytes_agree_and_verify(source, tmp_path):
    header = CI.compact_to_file(source, tmp_path / "c")
    data = (tmp_path / "c").read_bytes()
    assert data == CI.compact_bytes(source)
    assert len(data) == header.size_bytes == 64 + 5 * 8 + 40 * 16
    reader = CI.FileRangeReader(tmp_path / "c")
    try:
        assert CI.read_header(reader) == header
        CI.verify(reader, header)
    finally:
        reader.close()
    assert (header.entry_count, header.slot_count, header.begin_phy_offset, header.end_phy_offset) == \
        (40, 5, 1000, 1390)


def test_runs_are_newest_first_and_contiguous(source):
    data = CI.compact_bytes(source)
    header = CI.read_header(CountingReader(data))
    position = header.entries_at
    for slot in range(header.slot_count):
        pos, length = CI.SLOT.unpack_from(data, 64 + 8 * slot)
        if length:
            assert pos == position
            phys = [e[1] for e in CI.ENTRY.iter_unpack(data[pos:pos + length])]
            assert phys == sorted(phys, reverse=True)
            position += length
    assert position == len(data)


def test_query_reads_slot_then_run(source):
    data = CI.compact_bytes(source)
    reader = CountingReader(data)
    header = CI.read_header(reader)
    reader.reads.clear()
    res = CI.query(reader, header, "T#k3", 0, 1 << 62, 100)
    assert [m.physical_offset for m in res.matches] == [1000 + i * 10 for i in range(39, -1, -1) if i % 7 == 3]
    assert res.reads == 2 == len(reader.reads)
    assert reader.reads[0][1] == 8
    assert res.matches == source.query("T#k3", 0, 1 << 62, 100).matches


def test_run_read_is_bounded(source):
    data = CI.compact_bytes(source)
    reader = CountingReader(data)
    header = CI.read_header(reader)
    reader.reads.clear()
    res = CI.query(reader, header, "T#k3", 0, 1 << 62, 100, max_scan_entries=2)
    assert reader.reads[1][1] == 2 * CI.ENTRY_SIZE and not res.exhausted and res.next_ordinal == 2
    more = CI.query(reader, header, "T#k3", 0, 1 << 62, 100, max_scan_entries=2,
                    start_ordinal=res.next_ordinal)
    assert more.reads == 2


def test_empty_bucket_is_one_read(tmp_path):
    file = IndexFile.create(tmp_path / "src", 8, 10)
    file.put("a", 1, BASE_MS)
    reader = CountingReader(CI.compact_bytes(file))
    header = CI.read_header(reader)
    reader.reads.clear()
    empty_key = next(k for k in (f"x{i}" for i in range(100))
                     if CI.key_hash(k) % 8 != CI.key_hash("a") % 8)
    res = CI.query(reader, header, empty_key, 0, 1 << 62, 10)
    assert res.matches == [] and res.reads == 1 == len(reader.reads)
    file.close()


@pytest.mark.parametrize("position, expect", [(0, "magic"), (10, "header CRC"), (4, "version")])
def test_header_damage_is_detected(source, position, expect):
    data = bytearray(CI.compact_bytes(source))
    data[position] ^= 0x01 if position != 4 else 0
    if position == 4:
        data[4:8] = (2).to_bytes(4, "big")
    with pytest.raises(CorruptIndexFile, match=expect):
        CI.read_header(CountingReader(bytes(data), "broken.cidx"))


def test_truncation_is_detected(source):
    data = CI.compact_bytes(source)
    with pytest.raises(CorruptIndexFile, match="size is"):
        CI.read_header(CountingReader(data[:-16]))
    with pytest.raises(CorruptIndexFile, match="short read"):
        CI.read_header(CountingReader(data[:30]))


def test_verify_finds_a_flipped_entry_and_slot(source):
    data = bytearray(CI.compact_bytes(source))
    header = CI.read_header(CountingReader(bytes(data)))
    entry_damaged = bytearray(data)
    entry_damaged[-3] ^= 0xFF
    with pytest.raises(CorruptIndexFile, match="entries CRC"):
        CI.verify(CountingReader(bytes(entry_damaged)), header)
    slot_damaged = bytearray(data)
    slot_damaged[64 + 3] ^= 0x10
    with pytest.raises(CorruptIndexFile, match="slot table CRC"):
        CI.verify(CountingReader(bytes(slot_damaged)), header)


def test_query_rejects_a_slot_pointing_outside(source):
    data = bytearray(CI.compact_bytes(source))
    header = CI.read_header(CountingReader(bytes(data)))
    slot = CI.key_hash("T#k1") % 5
    CI.SLOT.pack_into(data, 64 + 8 * slot, len(data) - 16, 32)
    with pytest.raises(CorruptIndexFile, match="outside the entry region"):
        CI.query(CountingReader(bytes(data)), header, "T#k1", 0, 1 << 62, 10)
