"""The compiled placing and stamping of a batch against the pure-Python reference (mqstore.log.stamp).

Random batches of records in all four host layouts, with any transaction type, queue ids and tag
codes, appended at any position of a log with small segments (so batches cross segment ends): both
must place the same chunks, write the same bytes into the batch and return the same entries and
consume queue runs. The compiled entries are int64 columns (_stamp.Entries) that must read as the
reference's list of tuples wherever AppendResults.entries is read: indexing, slices, iteration, the
AppendResponse bytes and the timer's note. The compiled module is imported directly, so this runs under
MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.format import cq_unit, record
from mqstore.log import stamp as reference
from mqstore.model import AppendResults
from mqstore.timer import runs as timer_runs
from mqstore_rpc import convert
from tests.support import compiled as support_compiled
from tests.support import records

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_stamp")
records_module = support_compiled.module("_records")
responses_module = support_compiled.module("_responses")

SETTINGS = support_compiled.examples(300)
HOSTS = (records.LOOPBACK_V4, records.LOOPBACK_V6)

one_record = st.fixed_dictionaries({
    "body": st.binary(min_size=1, max_size=200), "queue_id": st.integers(0, 5),
    "sys_flag": st.sampled_from([0, 0x4, 0x8, 0xC]), "born_host": st.sampled_from(HOSTS),
    "store_host": st.sampled_from(HOSTS), "tag_code": st.integers(-(1 << 31), (1 << 31) - 1),
})


def encoded(specs: list[dict]) -> tuple[bytearray, list[int]]:
    """The batch as the encoder leaves it: offsets and store time zero."""
    parts = [records.encode(topic=b"t", body=s["body"], queue_id=s["queue_id"], sys_flag=s["sys_flag"],
                            born_host=s["born_host"], store_host=s["store_host"]) for s in specs]
    return bytearray(b"".join(parts)), [len(p) for p in parts]


@SETTINGS
@given(specs=st.lists(one_record, min_size=1, max_size=30), segment_size=st.integers(400, 3000),
       written=st.integers(0, 10_000), firsts=st.lists(st.integers(0, 1 << 40), min_size=6, max_size=6),
       now=st.integers(0, 1 << 62))
def test_compiled_stamp_equals_the_reference(specs, segment_size, written, firsts, now):
    buf, sizes = encoded(specs)
    if max(sizes) + record.BLANK_SIZE > segment_size:
        segment_size = max(sizes) + record.BLANK_SIZE  # the encoder refuses records that fit no segment
    chunks, end = reference.place(sizes, written, segment_size)
    assert compiled.place(sizes, written, segment_size) == (chunks, end)
    qids = [s["queue_id"] for s in specs]
    tags = [s["tag_code"] for s in specs]
    flags = [s["sys_flag"] for s in specs]
    first_offsets = {qid: firsts[qid] for qid in set(qids)}
    expected_buf, actual_buf = bytearray(buf), bytearray(buf)
    expected = reference.stamp(expected_buf, chunks, sizes, qids, tags, flags, dict(first_offsets), now)
    actual = compiled.stamp(actual_buf, chunks, sizes, qids, tags, flags, dict(first_offsets), now)
    assert actual_buf == expected_buf
    assert actual == expected
    entries, runs = actual
    assert_reads_as(entries, expected[0], now)
    for qid, (first, data, physical_end) in runs.items():  # the runs are what the consume queue reads back
        mine = [(e[0], e[1], e[4]) for e in entries if e[2] == qid and record.takes_queue_offset(e[5])]
        assert [cq_unit.ENTRY.unpack_from(data, i * cq_unit.ENTRY.size) for i in range(len(mine))] == mine
        assert first == first_offsets[qid] and physical_end == mine[-1][0] + mine[-1][1]


def assert_reads_as(entries, expected: list[tuple], now: int) -> None:
    """The compiled Entries read as the reference's list everywhere the append path reads them."""
    n = len(expected)
    assert type(entries) is compiled.Entries and len(entries) == n and list(entries) == expected
    assert entries == expected and not entries != expected and expected == entries
    assert entries != expected[:-1] and entries != [*expected, (0, 0, 0, 0, 0, 0)]
    for i in (0, n // 2, n - 1, -1, -n):
        assert entries[i] == expected[i]
    for sl in (slice(None), slice(1, None), slice(n // 2, n + 3), slice(None, -1), slice(None, None, 2)):
        assert entries[sl] == expected[sl]
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            entries[bad]
    for start in (0, n // 2, n, n + 2):
        assert records_module.timer_note_physicals(entries, start) == timer_runs.note_physicals(expected, start)
    keys = [f"K{i:030X}" for i in range(n)]
    for durability in ("WRITTEN", "FLUSHED"):
        results = AppendResults("0A0000070000C383", entries, keys, now, durability, 2, 5)
        reference_results = AppendResults("0A0000070000C383", expected, keys, now, durability, 2, 5)
        codes = {"WRITTEN": 1, "FLUSHED": 2}
        want = convert.append_response([reference_results]).SerializeToString()
        assert responses_module.append_response([results], codes) == want
        assert responses_module.append_response([reference_results], codes) == want
        assert list(results) == list(reference_results)


@SETTINGS
@given(columns=st.lists(st.tuples(st.integers(0, 70_000), st.sampled_from([0, 0x4, 0x8, 0xC, 0x10, 0x3C])),
                        max_size=40),
       table=st.dictionaries(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 9)), st.integers(0, 1 << 40),
                             max_size=8))
def test_compiled_queue_ranges_equal_the_reference(columns, table):
    """The same ranges in the same order; a queue id out of [0, 65535] on a record that takes a queue offset is
    refused (stamp refuses it too), one on a record that takes none is ignored by both."""
    qids = [q if q <= 65535 or f in (0x4, 0xC) else q % 10 for q, f in columns]
    flags = [f for _, f in columns]
    expected = reference.queue_ranges(qids, flags, dict(table), "t")
    actual = compiled.queue_ranges(qids, flags, dict(table), "t")
    assert list(actual.items()) == list(expected.items())
    with pytest.raises(ValueError, match="outside"):
        compiled.queue_ranges([*qids, 65536], [*flags, 0], dict(table), "t")


def test_inconsistent_columns_are_refused_not_written_past():
    buf, sizes = encoded([{"body": b"x", "queue_id": 0, "sys_flag": 0, "born_host": HOSTS[0],
                           "store_host": HOSTS[0], "tag_code": 0}])
    chunks, _ = compiled.place(sizes, 0, 1 << 20)
    with pytest.raises(ValueError, match="differ in length"):
        compiled.stamp(buf, chunks, sizes, [0, 1], [0], [0], {0: 0}, 1)
    with pytest.raises(ValueError, match="outside the batch"):
        compiled.stamp(buf, [(0, 0, len(buf) + 1, len(buf) + 1)], sizes, [0], [0], [0], {0: 0}, 1)
    with pytest.raises(KeyError):
        compiled.stamp(buf, chunks, sizes, [0], [0], [0], {1: 0}, 1)
    with pytest.raises(ValueError, match="place 0 records"):
        compiled.stamp(buf, [], sizes, [0], [0], [0], {0: 0}, 1)
