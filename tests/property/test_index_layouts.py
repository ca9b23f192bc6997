"""Unsealed and compact layouts give the same answers for every query (Hypothesis)."""

from __future__ import annotations

import pathlib
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.format import compact_index as CI
from mqstore.format.index_file import IndexFile, key_hash

BASE_MS = 1_700_000_000_000
KEYS = ["T#a", "T#b", "T#c", "T#Aa", "T#BB", "polygenelubricants", "T#" + "x" * 40]


class MemReader:
    def __init__(self, data: bytes):
        self.data, self.name, self.size_bytes, self.reads = data, "mem", len(data), 0

    def read(self, position: int, length_bytes: int) -> bytes:
        self.reads += 1
        return self.data[position:position + length_bytes]


puts = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 400), st.integers(0, 4000)),
                min_size=0, max_size=60)
queries = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 300_000), st.integers(0, 300_000),
                             st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot_count=st.integers(1, 9), operations=puts, asks=queries)
def test_unsealed_and_compact_answer_alike(slot_count, operations, asks):
    with tempfile.TemporaryDirectory() as tmp:
        file = IndexFile.create(pathlib.Path(tmp) / "f", slot_count, len(operations) + 2)
        try:
            phy, ts = 1000, BASE_MS
            for key, phy_step, ts_step_ms in operations:
                phy, ts = phy + phy_step, ts + ts_step_ms  # sub-second times too
                file.put(key, phy, ts)
            reader = MemReader(CI.compact_bytes(file))
            header = CI.read_header(reader)
            for key, begin_off, span, max_num, max_scan in asks:
                begin, end = BASE_MS + begin_off, BASE_MS + begin_off + span
                _same(file, reader, header, key, begin, end, max_num, max_scan)
        finally:
            file.close()


def _same(file, reader, header, key, begin, end, max_num, max_scan):
    """Compare page by page, resuming each layout from its own position."""
    entry, ordinal, before = 0, 0, None
    for _ in range(1000):
        reader.reads = 0
        a = file.query(key_hash(key), begin, end, max_num, max_scan_entries=max_scan,
                       before_phy_offset=before, start_entry=entry, start_ordinal=ordinal)
        b = CI.query(reader, header, key, begin, end, max_num, max_scan_entries=max_scan,
                     before_phy_offset=before, start_ordinal=ordinal)
        assert a.matches == b.matches
        assert (a.exhausted, a.next_ordinal) == (b.exhausted, b.next_ordinal)
        assert reader.reads == b.reads <= 2
        if a.exhausted:
            return
        entry, ordinal = a.next_entry, a.next_ordinal
        before = a.matches[-1].physical_offset if a.matches else before
    raise AssertionError("scan did not end")
