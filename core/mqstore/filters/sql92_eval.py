"""The values and conditions of a compiled SQL92 selector (mqstore.filters.sql92 builds closures of these).

A value is None (NULL), a str (a property's value or a string literal), an int or float (a number literal)
or a bool; a condition is True, False or None (UNKNOWN). The rules are sql92's docstring's. Pure functions.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional

Props = Mapping[str, str]
Value = Optional[object]            # None (NULL), str, int, float or bool
Cond = Optional[bool]               # None is UNKNOWN
TAGS_ATTRIBUTE = "required_tags"    # set on a condition's closure that is TRUE only for these TAGS
_TAGS = "TAGS"
_INT_TEXT = re.compile(r"[+-]?\d+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def as_number(value: Value) -> int | float | None:
    """``value`` as a long or double (a numeric string is converted), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    text = value.strip()
    if _INT_TEXT.fullmatch(text):
        return int(text)
    if _FLOAT_TEXT.fullmatch(text):
        return float(text)
    return None


def as_boolean(value: Value) -> Cond:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.lower()
        return True if low == "true" else False if low == "false" else None
    return None


def equal(left: Value, right: Value) -> Cond:
    if left is None or right is None:
        return None
    if isinstance(left, bool) or isinstance(right, bool):
        a, b = as_boolean(left), as_boolean(right)
        return None if a is None or b is None else a == b
    if isinstance(left, (int, float)) or isinstance(right, (int, float)):
        a, b = as_number(left), as_number(right)
        return None if a is None or b is None else a == b
    return left == right


_ORDER: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def ordered(op: str, left: Value, right: Value) -> Cond:
    a, b = as_number(left), as_number(right)
    return None if a is None or b is None else _ORDER[op](a, b)


def negated(c: Cond) -> Cond:
    return None if c is None else not c


def literal(value: Value):
    fn = lambda p: value  # noqa: E731
    fn.literal = True
    return fn


def names(fn) -> str | None:
    """The property a value closure reads, if it is one."""
    return getattr(fn, "property", None)


def requiring(test, tags: frozenset[str] | None):
    if tags is not None:
        setattr(test, TAGS_ATTRIBUTE, tags)
    return test


def string_literal_of(fn) -> str | None:
    if getattr(fn, "literal", False) and isinstance(fn(None), str):
        return fn(None)
    return None


def comparison(op: str, left, right) -> Callable[[Props], Cond]:
    if op == "=":
        tags = None
        for side, other in ((left, right), (right, left)):
            if names(side) == _TAGS and string_literal_of(other) is not None:
                tags = frozenset({string_literal_of(other)})
        return requiring(lambda p: equal(left(p), right(p)), tags)
    if op in ("<>", "!="):
        return lambda p: negated(equal(left(p), right(p)))
    return lambda p: ordered(op, left(p), right(p))


def between(value: Value, low: Value, high: Value) -> Cond:
    above, below = ordered(">=", value, low), ordered("<=", value, high)
    return all_of_values((above, below))


def in_values(value: Value, values: frozenset[str]) -> Cond:
    if value is None:
        return None
    return (value if isinstance(value, str) else _text(value)) in values


def _text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _string_test(check: Callable[[str, str], bool]):
    def build(left, literal: str):
        def test(p) -> Cond:
            value = left(p)
            return None if value is None else check(_text(value), literal)
        return test
    return build


STRING_TESTS = {"CONTAINS": _string_test(lambda v, s: s in v),
                   "STARTSWITH": _string_test(lambda v, s: v.startswith(s)),
                   "ENDSWITH": _string_test(lambda v, s: v.endswith(s))}


def all_of_values(results) -> Cond:
    unknown = False
    for r in results:
        if r is False:
            return False
        unknown = unknown or r is None
    return None if unknown else True


def all_of(parts: list[Callable[[Props], Cond]]) -> Callable[[Props], Cond]:
    """AND: TRUE needs every part TRUE, so it requires the tags every part requiring some requires."""
    sets = [getattr(part, TAGS_ATTRIBUTE) for part in parts if hasattr(part, TAGS_ATTRIBUTE)]

    def test(p) -> Cond:
        unknown = False
        for part in parts:
            r = part(p)
            if r is False:
                return False
            unknown = unknown or r is None
        return None if unknown else True
    return requiring(test, frozenset.intersection(*sets) if sets else None)


def any_of(parts: list[Callable[[Props], Cond]]) -> Callable[[Props], Cond]:
    """OR: TRUE needs one part TRUE, so it requires tags only when every part does (their union)."""
    sets = [getattr(part, TAGS_ATTRIBUTE, None) for part in parts]

    def test(p) -> Cond:
        unknown = False
        for part in parts:
            r = part(p)
            if r is True:
                return True
            unknown = unknown or r is None
        return None if unknown else False
    return requiring(test, frozenset.union(*sets) if None not in sets else None)
