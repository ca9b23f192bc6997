"""The compiled compaction record fields (codec _scan.compaction_fields: key, tombstone, body) against the
pure-Python reference (rounds.compaction_fields_python), on random records from a printed seed: all four
host layouts, empty and non-empty bodies, properties with KEYS and DELETE given zero, one or more
times (the last non-empty one wins), empty values, several words, spaces at either end, accented and
ill-formed UTF-8, names that end in KEYS or DELETE. The compiled module is imported directly, so this
runs under MQSTORE_PURE_PYTHON=1 too."""

from __future__ import annotations

import pytest

from mqstore.compaction.rounds import compaction_fields_python
from tests.support import compiled as support_compiled
from tests.support import records
from tests.support.hashkeys import seeded_random

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_scan")
HOSTS = (records.LOOPBACK_V4, records.LOOPBACK_V6)
VALUES = [b"", b"k", b"user-1", b"a b", b" a", b"a ", "é ü".encode(), b"\xff\xfe", b"\xc3", b"x\xc3 y", b"true",
          b"TRUE", b"false", b"tru", b"truee"]
NAMES = [b"KEYS", b"DELETE", b"MYKEYS", b"KEY", b"UNDELETE", b"UNIQ_KEY", b"TAGS", b"DELETEX"]


def test_compiled_compaction_fields_equal_the_reference():
    rng, seed = seeded_random("codec_compaction_fields")
    for trial in range(3000):
        entries = [rng.choice(NAMES) + b"\x01" + rng.choice(VALUES) for _ in range(rng.randint(0, 5))]
        props = b"\x02".join(entries) + (b"\x02" if entries and rng.random() < 0.7 else b"")
        raw = records.encode(topic=rng.choice([b"kv", b"t" * 100]), body=rng.choice([b"", b"v", b"x" * 300]),
                             properties=props, born_host=rng.choice(HOSTS), store_host=rng.choice(HOSTS),
                             queue_offset=trial)
        assert compiled.compaction_fields(raw) == compaction_fields_python(raw), f"seed {seed} trial {trial}: {props!r}"
        view = memoryview(b"--" + raw + b"--")[2:-2]  # a slice of a segment, as rounds and reads pass it
        assert compiled.compaction_fields(view) == compaction_fields_python(view), f"seed {seed} trial {trial}"
