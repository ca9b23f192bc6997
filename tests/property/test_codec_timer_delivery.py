"""The timer delivery's compiled pass against its pure-Python reference (mqstore.timer.delivery.copy_run).

``timer_copy_run`` and ``copy_run`` over random segment buffers of timer records (the properties the Scheduler and
rolls write, and odd ones: tests/property/test_codec_timer.random_properties) and every way a record is not one
the timer may copy from its bytes: another topic, a damaged body CRC, a PHYSICALOFFSET naming another place, a
blank, a record reaching past the visible end or starting below the log's low end or the timer topic's start, a
cut record, an IPv6 born or store host; runs starting anywhere, reaching past the segment, offsets outside it.
Both must reach the same index; where the compiled one answers, the reference answers the same (real topic,
origin, the Copy: body, BODYCRC, properties bytes, tags, UNIQ_KEY, flag, born time, host and port, queue id,
sharding key); it declines the odd records only. The compiled module is imported directly, so this runs under
MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import random
import types

import pytest

from mqstore.format import record
from mqstore.model import Copy
from mqstore.timer import delivery, messages as tm
from tests.property.test_codec_timer import random_properties
from tests.support import compiled as support_compiled

pytestmark = pytest.mark.codec

_records = support_compiled.module("_records")
TIMER = tm.TIMER_TOPIC.encode()


def _record(rng: random.Random, physical: int, props: bytes, topic: bytes) -> bytes:
    born_host = rng.choice([b"\x0a\0\0\x07", b"\x0a\0\0\x07", bytes(range(16))])
    store_host = rng.choice([b"\x7f\0\0\1", b"\x7f\0\0\1", b"\1" * 16])
    parts: list = []
    body = rng.choice([b"x", b"body" * rng.randint(1, 30)])
    record.encode_parts(parts, record.topic_part(topic), body, props, 0, rng.randint(-3, 3), 0,
                        rng.choice([1, 1_796_000_000_000]), born_host, rng.randint(0, 65535), store_host, 10911, 0)
    raw = bytearray(b"".join(parts))
    record.stamp(raw, 0, rng.randint(0, 1 << 30), physical, 1_796_000_000_000 + rng.randint(0, 999))
    return bytes(raw)


def _segment(rng: random.Random) -> tuple[bytearray, int, list[int], set[int]]:
    """A segment buffer of records, its start, every record's offset, and those made odd on purpose."""
    seg_start = rng.choice([0, 1 << 20, 7 << 30])
    buf, offsets, odd = bytearray(), [], set()
    for _ in range(rng.randint(0, 20)):
        physical = seg_start + len(buf)
        props = random_properties(rng)
        plain = rng.random() < 0.85
        topic = TIMER if plain or rng.random() < 0.5 else b"t"
        raw = bytearray(_record(rng, physical, props, topic))
        if not plain:
            damage = rng.choice(["crc", "offset", "none", "blank"])
            if damage == "crc":
                raw[record.BODY_CRC_AT + 3] ^= 1
            elif damage == "offset":
                raw[record.PHYSICAL_OFFSET_AT + 7] ^= 8
            elif damage == "blank":
                raw = bytearray(record.encode_blank(len(raw)) + bytes(len(raw) - record.BLANK_SIZE))
            if damage != "none" or topic != TIMER:
                odd.add(physical)
        offsets.append(physical)
        buf += raw
    if rng.random() < 0.2 and buf:
        cut = rng.randint(1, 40)
        del buf[-cut:]  # the last record cut short
    return buf, seg_start, offsets, odd


def test_the_compiled_copy_run_is_the_references():
    rng = random.Random(35)
    answered = plain = 0
    for _ in range(1500):
        buf, seg_start, offsets, odd = _segment(rng)
        seg_end = seg_start + len(buf) + rng.choice([0, 0, 300])
        picks = [rng.choice(offsets) if offsets and rng.random() < 0.9 else
                 seg_start + rng.choice([-5, 3, len(buf) + 7, 1 << 40]) for _ in range(rng.randint(0, 30))]
        physicals = sorted(picks) if rng.random() < 0.7 else picks
        units = [rng.randint(0, 1 << 40) for _ in physicals]
        index = rng.randint(0, len(physicals))
        low = seg_start + rng.choice([0, 0, 0, 1])
        visible = seg_start + len(buf) - rng.choice([0, 0, 0, 0, 1, 100])
        owned_from = seg_start + rng.choice([0, 0, 0, 1, 200])
        now = 1_796_000_001_000 + rng.randint(0, 9)
        reference, compiled = [], []
        args = (seg_start, seg_end, low, visible, TIMER, owned_from, physicals, units, index, now, Copy)
        got = _records.timer_copy_run(bytes(buf), *args, compiled)
        assert got == delivery.copy_run(bytes(buf), *args, reference), physicals
        assert len(compiled) == len(reference) == got - index
        for physical, made, want in zip(physicals[index:], compiled, reference, strict=False):
            if made is None:
                continue
            answered += 1
            assert made == want, (physical, made, want)
            assert physical not in odd
        plain += sum(1 for p, want in zip(physicals[index:], reference, strict=False) if want is not None)
    assert answered > 0.6 * plain and answered > 3000, (answered, plain)


def test_a_run_stops_at_the_segments_end_and_checks_its_arguments():
    buf = _record(random.Random(1), 0, b"REAL_TOPIC\x01t\x02TIMER_OUT_MS\x015\x02UNIQ_KEY\x01U\x02", TIMER)
    for run in (_records.timer_copy_run, delivery.copy_run):
        out: list = []
        assert run(buf, 0, len(buf), 0, len(buf), TIMER, 0, [0, len(buf)], [4, 5], 0, 7, Copy, out) == 1
        assert out[0][:2] == ("t", 4) and out[0][2].properties.endswith(b"TIMER_UNIT\x014\x02UNIQ_KEY\x01U\x02")
        out = []
        assert run(b"", 0, 64, 0, 64, TIMER, 0, [0, 3, 64], [1, 2, 3], 0, 7, Copy, out) == 2  # empty: none
        assert out == [None, None]
        with pytest.raises(ValueError):
            run(buf, 0, len(buf), 0, len(buf), TIMER, 0, [0], [], 0, 7, Copy, [])
        with pytest.raises(ValueError):
            run(buf, 0, len(buf), 0, len(buf), TIMER, 0, [0], [1], -1, 7, Copy, [])


def test_copies_takes_a_segment_once_for_its_run(monkeypatch):
    """delivery.copies looks a segment up once for the run of records it holds (not once a record, as the
    lookup of each record did), and gives a roll unit None (the reference way makes its record)."""
    calls = []
    buf = b"".join(_record(random.Random(i), 100 * 0, b"REAL_TOPIC\x01t\x02TIMER_OUT_MS\x015\x02UNIQ_KEY\x01U\x02",
                           TIMER) for i in range(1))
    seg = types.SimpleNamespace(buffer=buf, start=0, end=1 << 20)

    def find(offset):
        calls.append(offset)
        return seg
    store = types.SimpleNamespace(
        commitlog=types.SimpleNamespace(min_offset=0, segments=types.SimpleNamespace(find=find)),
        visible_offset=lambda: len(buf),
        topics=types.SimpleNamespace(get=lambda name: types.SimpleNamespace(start_physical_offset=0)))
    from mqstore.format.timer_unit import KIND_DELIVER, KIND_ROLL
    units = [types.SimpleNamespace(physical_offset=0, timer_offset=9, kind=kind)
             for kind in (KIND_DELIVER, KIND_DELIVER, KIND_ROLL)]
    made = delivery.copies(store, units, 7)
    assert calls == [0]
    assert made[0][:2] == ("t", 9) and made[1] == made[0] and made[2] is None
