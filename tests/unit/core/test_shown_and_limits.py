"""The two helpers every RPC's checks go through: ``shown`` (a user value in an error message, bounded)
and ``mqstore.limits`` (negative is malformed, 0 the default, past the maximum clamped)."""

from __future__ import annotations

import pytest

from mqstore import limits
from mqstore.errors import InvalidArgument, shown


def test_shown_keeps_short_values_and_cuts_long_ones_saying_how_long():
    assert shown("user-1") == "'user-1'"
    assert shown("a" * 40_000) == "'" + "a" * 64 + "'... (40000 bytes)"
    assert shown("é" * 100, limit=3) == "'ééé'... (200 bytes)"  # the length in UTF-8 bytes
    assert shown(b"\x00" * 1000, limit=2) == "b'\\x00\\x00'... (1000 bytes)"
    assert shown(["k"] * 10_000).endswith("... (50000 characters)") and len(shown(["k"] * 10_000)) < 100
    assert shown(7) == "7"


def test_limits():
    assert limits.limit("max_messages", 0, default=32, maximum=1000) == 32
    assert limits.limit("max_messages", 5, default=32, maximum=1000) == 5
    assert limits.limit("max_messages", 10**9, default=32, maximum=1000) == 1000
    assert limits.limit("heartbeat_ms", 3, default=1000, minimum=10, maximum=60_000) == 10
    with pytest.raises(InvalidArgument, match=r"max_messages is -1; give 0 \(the default, 32\) or 1 to 1000"):
        limits.limit("max_messages", -1, default=32, maximum=1000)
    assert limits.at_least_zero("offset", 0) == 0
    with pytest.raises(InvalidArgument, match=r"offset is -5; it must be 0 or more \(a queue offset\)"):
        limits.at_least_zero("offset", -5, "a queue offset")


def test_within_takes_the_default_for_zero_and_refuses_anything_outside_its_range():
    assert limits.within("batch_size", 0, 1, 1000, default=32) == 32
    assert limits.within("batch_size", 1000, 1, 1000, default=32) == 1000
    for bad in (-1, 1001):
        with pytest.raises(InvalidArgument, match=rf"batch_size is {bad}; give 0 \(the default, 32\) or 1 to 1000$"):
            limits.within("batch_size", bad, 1, 1000, default=32)
    with pytest.raises(InvalidArgument, match=r"invisible_duration_ms is 0; give 100 to 43200000$"):
        limits.within("invisible_duration_ms", 0, 100, 43_200_000)
