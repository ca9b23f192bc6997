"""The compiled compaction key map (codec _offset_map) against its pure-Python reference (PyOffsetMap).

Both get the same random operations from a printed seed: put (when can_put says so), get, can_put,
put_pairs (with a minimum value, over pairs that may not all fit), mark_superseded, clear, with keys
from a small pool (so they repeat) and digests built to share a home slot (so probes run long and
wrap). After each operation the results, the tables byte for byte, the sizes and last_offset must be
equal. The compiled module is imported directly, so this runs under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import pytest

from mqstore.compaction.offset_map import ENTRY_COST_BYTES, PAIR, SLOT_BYTES, PyOffsetMap, digest
from mqstore.errors import InvalidArgument, InvariantViolation
from tests.support import compiled as support_compiled
from tests.support.hashkeys import seeded_random

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_offset_map")


def _digests(rng, count: int) -> list[bytes]:
    out = [digest(f"key-{i}") for i in range(count // 2)]
    home = rng.randbytes(8)
    out += [rng.randbytes(8) + home for _ in range(count - len(out))]  # one home slot for all of these
    return out


def _same(ref: PyOffsetMap, fast) -> None:
    assert bytes(fast.table) == bytes(ref.table)
    assert (len(fast), fast.last_offset, fast.capacity, fast.slots) == (len(ref), ref.last_offset, ref.capacity,
                                                                        ref.slots)


def test_compiled_offset_map_equals_the_reference():
    rng, seed = seeded_random("codec_offset_map")
    for trial in range(40):
        budget = rng.choice([ENTRY_COST_BYTES, 2 * ENTRY_COST_BYTES + 5, 7 * ENTRY_COST_BYTES, 100 * ENTRY_COST_BYTES])
        ref, fast = PyOffsetMap(budget), compiled.OffsetMap(budget)
        keys = _digests(rng, rng.randint(2, 3 * ref.capacity + 4))
        value = 0
        for _ in range(rng.randint(1, 120)):
            op = rng.choice(["put", "put", "get", "can_put", "pairs", "mark", "clear"])
            d = rng.choice(keys)
            where = f"seed {seed} trial {trial} op {op}"
            if op == "put":
                assert fast.can_put(d) == ref.can_put(d), where
                if ref.can_put(d):
                    value += rng.randint(0, 3)
                    ref.put(d, value)
                    fast.put(d, value)
                else:
                    with pytest.raises(InvariantViolation):
                        fast.put(d, value)
            elif op == "get":
                assert fast.get(d) == ref.get(d), where
            elif op == "can_put":
                assert fast.can_put(d) == ref.can_put(d), where
            elif op == "pairs":
                pairs = bytearray()
                for _ in range(rng.randint(0, 2 * ref.capacity + 2)):
                    value += rng.randint(0, 2)
                    pairs += PAIR.pack(rng.choice(keys), value)
                low = rng.randint(0, value + 1)
                assert fast.put_pairs(bytes(pairs), low) == ref.put_pairs(bytes(pairs), low), where
            elif op == "mark":
                pairs = b"".join(PAIR.pack(rng.choice(keys), rng.randint(0, value)) for _ in range(rng.randint(0, 30)))
                bits_ref, bits_fast = bytearray(value // 8 + 1), bytearray(value // 8 + 1)
                assert fast.mark_superseded(pairs, bits_fast) == ref.mark_superseded(pairs, bits_ref), where
                assert bits_fast == bits_ref, where
            else:
                ref.clear()
                fast.clear()
            _same(ref, fast)


def test_a_key_costs_32_bytes_and_a_budget_below_one_key_is_refused():
    for cls in (PyOffsetMap, compiled.OffsetMap):
        m = cls(64 << 20)
        assert m.capacity == (64 << 20) // 32
        assert len(m.table) == m.slots * SLOT_BYTES <= (64 << 20) + SLOT_BYTES  # 24 B a slot at load 0.75
        with pytest.raises(InvalidArgument, match="at least 32"):
            cls(31)


def test_a_full_map_refuses_new_keys_and_keeps_updating_old_ones():
    for cls in (PyOffsetMap, compiled.OffsetMap):
        m = cls(2 * ENTRY_COST_BYTES)
        a, b, c = digest("a"), digest("b"), digest("c")
        pairs = PAIR.pack(a, 1) + PAIR.pack(b, 2) + PAIR.pack(a, 3) + PAIR.pack(c, 4) + PAIR.pack(b, 5)
        assert m.put_pairs(pairs, 0) == 3  # c does not fit: stops before it
        assert (m.get(a), m.get(b), m.get(c), m.can_put(c), m.can_put(a)) == (3, 2, None, False, True)
