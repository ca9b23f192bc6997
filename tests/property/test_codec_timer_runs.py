"""The timer enqueue's compiled loops against their pure-Python reference (mqstore.timer.runs).

``timer_noted_units`` and ``noted_units`` over random runs of consume queue entries (their bytes) and record
headers in a segment buffer, noted a batch a note (Timer.note: a batch's physical offsets, due times and store
time, from the index of its first record not read): noted records whose header matches, and every way one does
not (no note, a note naming another physical offset or store time, a header naming another queue or physical
offset, an IPv6 born host's store time, a size below the smallest record, an entry outside the segment, a header
past the buffer's end, fewer due times than records), notes starting inside their batch and reaching past the
run, with random due times (negative, past the read slot, past the horizon: rolls) and records rolled already:
the same index reached, the same units, deliver count and notes left (a note's rest put back where the run
stopped); the first entry not taken is the one the reference stops at (the caller reads it from the log, the
existing fallback).
``timer_units`` and ``encode_units`` over random unit batches (as pre-units, runs.PRE_UNIT: the walk's output):
the same bytes, enqueued-to offset and slot updates (the slots not given read through the callback once each),
and the reference's bytes are mqstore.format.timer_unit's units; a buffer not of whole pre-units is refused by
both.
The compiled module is imported directly, so this runs under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import array
import random
import struct

import pytest

from mqstore.format import cq_unit, timer_unit
from mqstore.timer import runs
from tests.support import compiled as support_compiled

pytestmark = pytest.mark.codec

_records = support_compiled.module("_records")

_Q = struct.Struct(">q")
_I = struct.Struct(">i")


def _due(rng: random.Random) -> int:
    return rng.choice([-5_000, 0, rng.randint(0, 1 << 46)])


def _run_case(rng: random.Random):
    seg_start = rng.choice([0, 1 << 20, 7 << 30])
    buf = bytearray(rng.randint(200, 4000))
    seg_end = seg_start + len(buf) + rng.choice([0, 0, 500])
    first_offset = rng.randint(0, 1 << 40)
    entries, notes, position = [], {}, 0
    count = rng.randint(0, 25)
    noted = dues = stamp = None  # the batch being made: its physical offsets and due times (as Timer.note keeps)
    for index in range(count):
        queue_offset = first_offset + index
        if noted is None or rng.random() < 0.2:  # a new batch: noted (mostly), from its first record or a later one
            lead = rng.choice([0, 0, 0, 1, 2])  # its records before the run (read already)
            noted = [rng.randint(0, 1 << 40) for _ in range(lead)]
            dues, stamp = [_due(rng) for _ in range(lead)], rng.randint(0, 1 << 45)
            if rng.random() > 0.05:
                notes[queue_offset] = (noted, dues, stamp if rng.random() > 0.03 else stamp - 1, lead)
        size = rng.choice([91, 100, 140, 90])
        physical = seg_start + position
        if rng.random() < 0.05:
            physical = rng.choice([seg_start - 200, seg_end, seg_end + 100])
        v6 = rng.random() < 0.3
        record_stamp = stamp if rng.random() > 0.03 else stamp + 7
        if position + 76 <= len(buf):
            named_q = queue_offset if rng.random() > 0.05 else queue_offset + 1
            named_p = physical if rng.random() > 0.05 else physical ^ 8
            buf[position + 20:position + 28] = _Q.pack(named_q)
            buf[position + 28:position + 36] = _Q.pack(named_p)
            buf[position + 36:position + 40] = _I.pack((0x10 if v6 else 0) | rng.choice([0, 0x20, 0x4]))
            buf[position + (68 if v6 else 56):position + (76 if v6 else 64)] = _Q.pack(record_stamp)
            if rng.random() < 0.05:  # the other layout's place holds the stamp: a mismatch
                buf[position + (56 if v6 else 68):position + (64 if v6 else 76)] = _Q.pack(record_stamp)
                buf[position + (68 if v6 else 56):position + (76 if v6 else 64)] = _Q.pack(record_stamp + 1)
        noted.append(physical if rng.random() > 0.03 else physical + 1)
        if rng.random() > 0.02:  # else one due time fewer than entries
            dues.append(_due(rng))
        entries.append((physical, size, rng.randint(-5, 5)))
        position += rng.choice([size, 60, 120])
    if noted is not None and rng.random() < 0.3:  # the last batch goes on past the run (not in the queue yet)
        noted.append(rng.randint(0, 1 << 40))
        dues.append(_due(rng))
    return bytes(buf), seg_start, seg_end, entries, first_offset, {q: (_int64s(n[0]), *n[1:]) for q, n in notes.items()}


def _unit_args(rng: random.Random, first_offset: int, count: int):
    precision = rng.choice([1, 7, 1000])
    read_ms = rng.randint(0, 1 << 45) // precision * precision
    horizon = read_ms + rng.choice([1, precision, 3600_000])
    rolled = {first_offset + i for i in range(count) if rng.random() < 0.1}
    return read_ms, horizon, precision, rolled


def _both(buf, seg_start, seg_end, entries, index, first_offset, notes, unit_args):
    entries = _entry_bytes(entries)
    lead = runs.pack_units([(1, 2, 3, 4, 5)]) if index % 2 else bytearray()  # pre-units there already are kept
    want, got = bytearray(lead), bytearray(lead)
    got_notes = {q: (_int64s(n[0]), list(n[1]), n[2], n[3]) for q, n in notes.items()}
    reached = runs.noted_units(buf, seg_start, seg_end, entries, index, first_offset, notes, *unit_args, want)
    assert _records.timer_noted_units(buf, seg_start, seg_end, entries, index, first_offset, got_notes, *unit_args,
                                      got) == reached
    assert got == want and got_notes == notes
    assert all(first_offset + i not in notes for i in range(index, reached[0]))
    return reached, runs.unpack_units(want)[len(lead) // runs.PRE_UNIT.size:]


@pytest.mark.parametrize("seed", range(40))
def test_noted_units_match_the_reference(seed):
    rng = random.Random(seed)
    for _ in range(50):
        buf, seg_start, seg_end, entries, first_offset, notes = _run_case(rng)
        unit_args = _unit_args(rng, first_offset, len(entries))
        index = rng.randint(0, len(entries))
        while True:  # as the enqueue: a run, then the entry it stopped at read otherwise, then the next run
            (reached, scheduled), units = _both(buf, seg_start, seg_end, entries, index, first_offset, notes,
                                                unit_args)
            assert scheduled == sum(unit[4] == timer_unit.KIND_DELIVER for unit in units)
            taken = [first_offset + i for i in range(index, reached) if first_offset + i not in unit_args[3]]
            assert [unit[2] for unit in units] == taken
            if reached >= len(entries):
                break
            index = reached + 1


def _entry_bytes(entries: list) -> bytes:
    """Consume queue entries (physical, size, tag code) as ConsumeQueue.entry_bytes gives them."""
    return b"".join(cq_unit.ENTRY.pack(*entry) for entry in entries)


def _int64s(values) -> array.array:
    """A note's physical offsets, as Timer.note keeps them."""
    return array.array("q", values)


def test_noted_units_take_a_matching_header_and_stop_at_each_mismatch():
    buf = bytearray(400)
    for i, (physical, stamp, v6) in enumerate([(0, 111, False), (100, 111, True), (200, 333, False)]):
        buf[physical + 20:physical + 36] = _Q.pack(10 + i) + _Q.pack(physical)
        buf[physical + 36:physical + 40] = _I.pack(0x10 if v6 else 0)
        buf[physical + (68 if v6 else 56):physical + (76 if v6 else 64)] = _Q.pack(stamp)
    entries = _entry_bytes([(0, 100, 0), (100, 100, 0), (200, 100, -7)])

    def notes(**changed):  # two batches: records 10-11 at store time 111, record 12 (and 13, not in the run) at 333
        first = (_int64s([0, 100]), [5_500, 1_200], 111, 0)
        second = (_int64s([200, 300]), [9_000, 1], 333, 0)
        return {10: changed.get("first", first), 12: changed.get("second", second)}

    args = (2_000, 9_000, 1_000, set())  # read slot 2 s, horizon 9 s, precision 1 s
    deliver, roll = timer_unit.KIND_DELIVER, timer_unit.KIND_ROLL
    for fn in (runs.noted_units, _records.timer_noted_units):
        units, left = bytearray(), notes()
        assert fn(bytes(buf), 0, 400, entries, 0, 10, left, *args, units) == (3, 2)
        assert runs.unpack_units(units) == [(5_000, 5_500, 10, 0, deliver), (2_000, 1_200, 11, 100, deliver),
                                            (9_000, 9_000, 12, 200, roll)]
        assert left == {13: (_int64s([200, 300]), [9_000, 1], 333, 1)}  # the rest, for the next run
        units = bytearray()
        assert fn(bytes(buf), 0, 400, entries, 0, 10, notes(), 2_000, 9_000, 1_000, {11}, units) == (3, 1)
        assert [unit[2] for unit in runs.unpack_units(units)] == [10, 12]  # rolled already: taken without a unit
        # A note taken from its second record (the first read already)
        units, left = bytearray(), {11: (_int64s([0, 100]), [5_500, 1_200], 111, 1)}
        assert fn(bytes(buf), 0, 400, entries, 1, 10, left, *args, units) == (2, 1) and left == {}
        assert runs.unpack_units(units) == [(2_000, 1_200, 11, 100, deliver)]
        left = notes(second=(_int64s([200]), [9_000], 334, 0))  # another store time
        assert fn(bytes(buf), 0, 400, entries, 0, 10, left, *args, bytearray())[0] == 2
        assert list(left) == [12]  # the note not taken stays
        assert fn(bytes(buf), 0, 400, entries, 0, 10, notes(second=(_int64s([201]), [7], 333, 0)), *args,
                  bytearray())[0] == 2  # another physical offset
        assert fn(bytes(buf), 0, 400, entries, 0, 10, notes(second=(_int64s([200]), [], 333, 0)), *args,
                  bytearray())[0] == 2  # no due time
        left = notes(first=(_int64s([0, 101]), [5_500, 1_200], 111, 0))
        assert fn(bytes(buf), 0, 400, entries, 0, 10, left, *args, bytearray())[0] == 1
        assert left[11][3] == 1 and 10 not in left  # the rest of the note put back where the run stopped
        assert fn(bytes(buf[:250]), 0, 400, entries, 0, 10, notes(), *args,
                  bytearray())[0] == 2  # past the buffer's end
        assert fn(bytes(buf), 0, 200, entries, 0, 10, notes(), *args, bytearray())[0] == 2  # outside the segment
        assert fn(bytes(buf), 0, 400, entries, 0, 11, notes(), *args,
                  bytearray())[0] == 0  # another queue offset named
        units = runs.pack_units([(1, 2, 3, 4, 5)])  # a run that takes nothing leaves what was there
        assert fn(bytes(buf), 0, 400, entries, 0, 11, notes(), *args, units) == (0, 0)
        assert units == runs.pack_units([(1, 2, 3, 4, 5)])


def _units_case(rng: random.Random):
    slot_choices = [rng.randint(0, 1 << 42) * 1000 for _ in range(rng.randint(1, 6))]
    units = [(rng.choice(slot_choices), rng.randint(-1, 1 << 45), rng.randint(0, 1 << 40), rng.randint(0, 1 << 50),
              rng.choice([1, 2, 4])) for _ in range(rng.randint(1, 40))]
    slots = {s: ([rng.randint(0, 1 << 30), rng.randint(0, 1 << 30), rng.randint(1, 99)] if rng.random() < 0.5
                 else [-1, -1, 0]) for s in slot_choices}
    return units, rng.randint(0, 1 << 30) * 48, slots, rng.randint(0, 1 << 40)


class _Reader:
    """TimerFiles._slot_fields's stand-in: the slots' fields, and which slots were asked for."""

    def __init__(self, slots: dict):
        self.slots, self.asked = slots, []

    def __call__(self, slot_ms: int) -> list:
        self.asked.append(slot_ms)
        return list(self.slots[slot_ms])


@pytest.mark.parametrize("seed", range(20))
def test_units_match_the_reference_and_the_unit_format(seed):
    rng = random.Random(seed)
    for _ in range(30):
        units, position, slots, enqueued_to = _units_case(rng)
        before = {s: list(v) for s, v in slots.items()}
        given = {s: list(v) for s, v in slots.items() if rng.random() < 0.5}  # the others read through ``read``
        want_read, got_read = _Reader(slots), _Reader(slots)
        want_slots, got_slots = {s: list(v) for s, v in given.items()}, {s: list(v) for s, v in given.items()}
        packed = runs.pack_units(units)
        assert runs.unpack_units(packed) == units
        want = runs.encode_units(packed, position, want_slots, enqueued_to, want_read)
        got = _records.timer_units(bytes(packed), position, got_slots, enqueued_to, got_read)
        assert got == want and type(got[0]) is bytes
        assert got_slots == want_slots and got_read.asked == want_read.asked
        assert sorted(want_read.asked) == sorted({u[0] for u in units} - set(given))
        # The reference against the unit format: each unit chained to its slot's last before it
        last = {s: v[1] for s, v in before.items()}
        expected, at = b"", position
        for slot_ms, deliver_ms, timer_offset, physical, kind in units:
            expected += timer_unit.encode_fields(deliver_ms, slot_ms, timer_offset, physical, last[slot_ms], kind)
            last[slot_ms], at = at, at + timer_unit.UNIT_SIZE
        assert want[0] == expected
        for slot_ms, (first, last_at, count) in want_slots.items():
            added = [i for i, u in enumerate(units) if u[0] == slot_ms]
            assert count == before[slot_ms][2] + len(added) and last_at == last[slot_ms]
            if added:
                assert first == (before[slot_ms][0] if before[slot_ms][2] else position + 48 * added[0])


@pytest.mark.parametrize("seed", range(5))
def test_note_physicals_match_the_reference(seed):
    rng = random.Random(seed)
    for _ in range(50):
        entries = [(rng.randint(-1, 1 << 62), rng.randint(0, 1 << 20), 0, rng.randint(0, 1 << 40), 0, 0)
                   for _ in range(rng.randint(0, 120))]
        start = rng.randint(0, len(entries) + 2)
        want = runs.note_physicals(entries, start)
        got = _records.timer_note_physicals(entries, start)
        assert type(got) is array.array and got.typecode == want.typecode == "q"
        assert got == want == array.array("q", [entry[0] for entry in entries[start:]])
    for fn in (runs.note_physicals, _records.timer_note_physicals):
        with pytest.raises(ValueError):
            fn([(1, 2, 0, 3, 0, 0)], -1)


def test_units_refuse_a_buffer_not_of_whole_pre_units():
    for fn in (runs.encode_units, _records.timer_units):
        with pytest.raises(ValueError, match="whole pre-units"):
            fn(bytes(runs.PRE_UNIT.size + 1), 0, {}, 0, lambda slot_ms: [-1, -1, 0])
        assert fn(b"", 48, {}, 7, lambda slot_ms: [-1, -1, 0]) == (b"", 7)
