"""Message filters of a Pull or a pop Receive: RocketMQ's tag expression (tags) and its SQL92 property
selector (sql92_lexer: the tokens, sql92: the parser and the cache of compiled expressions, sql92_eval:
the three-valued values and conditions its closures are made of). Pure functions over a record's TAGS
and properties map; the read path (mqstore.queue.pull) applies them, a tag filter (and an SQL92 one that
requires TAGS) through the consume queue's tag codes first.
"""

from __future__ import annotations

from typing import Sequence

from mqstore.errors import InvalidArgument

from .sql92 import Sql92Filter, compile_filter
from .tags import parse as parse_tags

TAG, SQL92 = "TAG", "SQL92"
Selection = tuple[tuple[str, ...], Sql92Filter | None]  # what selection() gives: (tags to read, SQL92 filter)


def selection(filter_type: str, expression: str, tags: Sequence[str] = ()) -> Selection:
    """(the tags to read, the SQL92 filter or None) of a request's filter: ``filter_type`` TAG reads
    ``expression`` as a tag expression (it may not be combined with ``tags``), SQL92 compiles it (cached)."""
    if filter_type == SQL92:
        return tuple(tags), compile_filter(expression)
    if filter_type != TAG:
        raise InvalidArgument(f"filter_type {filter_type!r} is not one of {TAG}, {SQL92}")
    if expression.strip() and tags:
        raise InvalidArgument("set either tags or a TAG filter_expression, not both (or make filter_type SQL92 "
                              "to combine tags with an SQL92 filter)")
    return (parse_tags(expression) if expression.strip() else tuple(tags)), None
