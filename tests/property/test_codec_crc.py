"""The compiled body CRC (mqstore/codec/_crc.h, folded with PCLMULQDQ where the CPU has it) against the reference,
mqstore.format.record.body_crc (zlib's crc32): the same value for any bytes, any length (the fold takes 64 bytes
and more, in 16-byte blocks, the rest goes to zlib) and any alignment of the first byte.

The compiled module is imported directly, so this runs under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.format import record
from tests.support import compiled as support_compiled

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_records")

SETTINGS = support_compiled.examples(500)


@SETTINGS
@given(data=st.binary(min_size=0, max_size=5000), skip=st.integers(0, 15))
def test_compiled_body_crc_equals_the_reference(data, skip):
    view = memoryview(data)[min(skip, len(data)):]  # the first byte at any alignment
    assert compiled.body_crc(view) == record.body_crc(bytes(view))


def test_every_length_around_the_fold_boundaries():
    """Every length up to 300 (under, at and past 64 bytes, each 16-byte step) and a large one, at each of 16
    alignments: random bytes, all zeros and all ones (the register's extremes)."""
    for fill in (os.urandom(1 << 17), bytes(1 << 17), b"\xff" * (1 << 17)):
        for skip in range(16):
            for length in [*range(301), 1024, 4095, 4096, 4097, (1 << 17) - skip]:
                piece = fill[skip:skip + length]
                assert compiled.body_crc(piece) == record.body_crc(piece), (skip, length)

