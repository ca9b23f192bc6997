"""The compiled walk of a segment's keys (codec _scan.segment_keys: (MD5 digest, entry) pairs split into
buckets, and the keyed tombstones' entries) against the pure-Python reference (rounds.segment_keys_python), on
random segments from a printed seed: records of all four host layouts, keyless ones, keys given zero, one or
more times, several words, accented and ill-formed UTF-8 (hashed as the decoded key's UTF-8, as
offset_map.digest does), empty bodies and DELETE properties (tombstones), gaps between records, 1 to 9
buckets; and its MD5 against hashlib's. The compiled module is imported directly, so this runs under
MQSTORE_PURE_PYTHON=1 too."""

from __future__ import annotations

import hashlib
from array import array

import pytest

from mqstore.compaction.offset_map import PAIR, digest
from mqstore.compaction.rounds import compaction_fields_python, segment_keys_python
from tests.support import compiled as support_compiled
from tests.support import records
from tests.support.hashkeys import seeded_random

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_scan")
HOSTS = (records.LOOPBACK_V4, records.LOOPBACK_V6)
VALUES = [b"", b"k", b"user-1", b"a b", b" a", "é ü".encode(), "日本".encode(), b"\xff\xfe", b"\xc3", b"x\xc3 y",
          b"k" * 70, b"true"]
NAMES = [b"KEYS", b"KEYS", b"DELETE", b"TAGS"]


def _segment(rng, count: int, base: int) -> tuple[bytes, array, array]:
    data, positions, sizes = bytearray(), array("q"), array("i")
    for offset in range(count):
        data += b"\0" * rng.choice([0, 0, 3])  # a gap (a blank) between records
        entries = [rng.choice(NAMES) + b"\x01" + rng.choice(VALUES) for _ in range(rng.randint(0, 3))]
        raw = records.encode(topic=b"kv", body=rng.choice([b"", b"v", b"x" * 200]), properties=b"\x02".join(entries),
                             born_host=rng.choice(HOSTS), store_host=rng.choice(HOSTS), queue_offset=offset)
        positions.append(base + len(data))
        sizes.append(len(raw))
        data += raw
    return bytes(data), positions, sizes


def test_the_walk_equals_the_reference_on_random_segments():
    rng, seed = seeded_random("codec_segment_keys")
    for trial in range(300):
        base, first, buckets = rng.choice([0, 1 << 30, 12345]), rng.randint(0, 10_000), rng.randint(1, 9)
        data, positions, sizes = _segment(rng, rng.randint(0, 40), base)
        expected = segment_keys_python(memoryview(data), positions, sizes, base, first, buckets)
        got = compiled.segment_keys(data, positions, sizes, base, first, buckets)
        assert got == expected, f"seed {seed} trial {trial}"
        # and what it means, from the record-at-a-time fields: every keyed record's pair in its bucket
        pairs = [PAIR.unpack_from(part, at) + (b,) for b, part in enumerate(got[0]) for at in range(0, len(part), 24)]
        keyed = []
        for k in range(len(positions)):
            at = positions[k] - base
            key, tombstone, _ = compaction_fields_python(data[at:at + sizes[k]])
            if key is not None:
                keyed.append((digest(key), first + k, (int.from_bytes(digest(key)[:4], "big") * buckets) >> 32,
                              tombstone))
        assert sorted(pairs, key=lambda p: p[1]) == [p[:3] for p in keyed], f"seed {seed} trial {trial}"
        assert list(array("q", got[1])) == [p[1] for p in keyed if p[3]], f"seed {seed} trial {trial}"


def test_a_record_outside_the_segment_or_mismatched_columns_are_refused_by_both():
    data, positions, sizes = _segment(seeded_random("codec_segment_keys_bad")[0], 3, 100)
    for walk in (compiled.segment_keys, segment_keys_python):
        for bad_positions, bad_sizes in ((array("q", [100 + len(data)]), array("i", [1])),
                                         (array("q", [99]), array("i", [10])), (positions, array("i", [1]))):
            with pytest.raises(ValueError):
                walk(memoryview(data), bad_positions, bad_sizes, 100, 0, 1)
        with pytest.raises(ValueError):
            walk(memoryview(data), positions, sizes, 100, 0, 0)


def test_the_walks_md5_is_hashlibs():
    rng, seed = seeded_random("codec_segment_keys_md5")
    for n in [*range(0, 130), 1000, 4096]:
        raw = rng.randbytes(n)
        assert compiled.md5_digest(raw) == hashlib.md5(raw).digest(), f"seed {seed} length {n}"
