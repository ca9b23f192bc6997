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
