"""Test helpers shared by unit and property tests: printed seeds, keys with chosen Java hashes."""

from __future__ import annotations

import itertools
import os
import random

from mqstore.javahash import java_string_hash

INT_MIN = -0x8000_0000


def seeded_random(name: str) -> tuple[random.Random, int]:
    """A Random from MQSTORE_TEST_SEED or a fresh seed, printed so a failure can be replayed."""
    seed = int(os.environ.get("MQSTORE_TEST_SEED", random.randrange(1 << 32)))
    print(f"{name}: seed {seed} (replay with MQSTORE_TEST_SEED={seed})")
    return random.Random(seed), seed


def key_with_min_hash(prefix: str) -> str:
    """``prefix`` + a counter + four characters whose Java hashCode is Integer.MIN_VALUE: with four
    free UTF-16 units (weights 31^3, 31^2, 31, 1; each unit 33..0xFFFF, no surrogates) about every
    second counter value has a solution, found greedily."""
    weights = (29791, 961, 31, 1)
    for trial in itertools.count():
        stem = f"{prefix}{trial}"
        h = java_string_hash(stem) & 0xFFFFFFFF
        rest = (0x8000_0000 - 923521 * h - 33 * sum(weights)) & 0xFFFFFFFF
        units = []
        for weight in weights:
            unit = min(rest // weight, 0xFFFF - 33)
            units.append(33 + unit)
            rest -= unit * weight
        if rest == 0 and not any(0xD800 <= u <= 0xDFFF for u in units):
            candidate = stem + "".join(map(chr, units))
            if java_string_hash(candidate) == INT_MIN:
                return candidate
    raise AssertionError("unreachable")
