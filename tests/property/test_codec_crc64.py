"""The compiled CRC-64/NVME (mqstore/codec/_crc.h: folded with PCLMULQDQ where the CPU has it, eight bytes a step by
tables otherwise and for the tail) against mqstore.format.crc64's Python reference (a bit-reflected table loop,
which tests/support/crc64 also uses), anchored to the standard's check value: the same value for any bytes, any
length (the fold takes 64 bytes and more, in 16-byte blocks), any alignment of the first byte and any split into
pieces (a CRC continued from the previous piece's, as the uploader's read-back does), and S3's check value.

The compiled module is imported directly, so this runs under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import mmap
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.format import crc64
from tests.support import compiled as support_compiled
from tests.support.crc64 import CHECK, crc64nvme

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_records")

SETTINGS = support_compiled.examples(300)


def test_the_check_value_and_the_empty_input():
    assert compiled.crc64nvme(b"123456789") == crc64.crc64nvme_python(b"123456789") == CHECK == crc64.CHECK
    assert compiled.crc64nvme(b"") == crc64.crc64nvme_python(b"") == 0
    assert compiled.crc64nvme(b"", 12345) == 12345


@SETTINGS
@given(data=st.binary(min_size=0, max_size=3000), skip=st.integers(0, 15), cut=st.integers(0, 3000),
       crc=st.integers(0, (1 << 64) - 1))
def test_compiled_crc64_equals_the_definition_in_one_piece_or_two(data, skip, cut, crc):
    view = memoryview(data)[min(skip, len(data)):]  # the first byte at any alignment
    expected = crc64nvme(bytes(view), crc)
    assert compiled.crc64nvme(view, crc) == expected == crc64.crc64nvme_python(view, crc)
    cut = min(cut, len(view))
    assert compiled.crc64nvme(view[cut:], compiled.crc64nvme(view[:cut], crc)) == expected


def test_every_length_around_the_fold_boundaries():
    """Every length up to 300 (under, at and past 64 bytes, each 16-byte step) and larger ones, at each of 16
    alignments: random bytes, all zeros and all ones (the register's extremes)."""
    for fill in (os.urandom(1 << 14), bytes(1 << 14), b"\xff" * (1 << 14)):
        for skip in range(16):
            for length in [*range(301), 1023, 1024, 1025, (1 << 14) - skip]:
                piece = fill[skip:skip + length]
                assert compiled.crc64nvme(piece) == crc64nvme(piece), (skip, length)


def test_a_read_only_memory_map_as_the_uploader_hands_it(tmp_path):
    data = os.urandom((1 << 20) + 13)
    path = tmp_path / "segment"
    path.write_bytes(data)
    with open(path, "rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with memoryview(mapped) as view:
            assert compiled.crc64nvme(view) == crc64nvme(data)
