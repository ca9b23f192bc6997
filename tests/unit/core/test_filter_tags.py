"""RocketMQ's TAG expression (mqstore.filters.tags)."""

from __future__ import annotations

import pytest

from mqstore.errors import InvalidArgument
from mqstore.filters import tags as tag_filter


@pytest.mark.parametrize("expression, tags", [
    ("", ()), ("*", ()), ("  *  ", ()), ("a", ("a",)), ("a || b", ("a", "b")), ("b||a||b", ("a", "b")),
])
def test_expressions(expression, tags):
    assert tag_filter.parse(expression) == tags


@pytest.mark.parametrize("expression", ["a ||", "|| a", "a || || b", "a b", "a | b", "a || *", "x\x01y"])
def test_malformed_expressions_are_refused(expression):
    with pytest.raises(InvalidArgument, match="filter_expression"):
        tag_filter.parse(expression)


def test_limits():
    with pytest.raises(InvalidArgument, match="the limit is 64"):
        tag_filter.parse(" || ".join(f"t{i}" for i in range(65)))
    with pytest.raises(InvalidArgument, match="characters"):
        tag_filter.parse("a" * 5000)
