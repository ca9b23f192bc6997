"""RocketMQ's tag expression (a subscription's TAG filter): ``*`` or empty for every message, else tags
joined by ``||`` (``a || b``). Pure functions.

The receive path hands the tags to the consume-queue read (mqstore.queue.pull), which compares each
entry's tag hash code first and then the record's real TAGS (hash collisions), as RocketMQ does.
"""

from __future__ import annotations

from mqstore.errors import InvalidArgument, shown

MAX_TAGS = 64
MAX_EXPRESSION_CHARS = 4096
_SUB_ALL = "*"


def parse(expression: str) -> tuple[str, ...]:
    """The tags ``expression`` accepts, sorted; () for every message."""
    text = expression.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        raise InvalidArgument(f"filter_expression has {len(text)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    if not text or text == _SUB_ALL:
        return ()
    tags = []
    for part in text.split("||"):
        tag = part.strip()
        if not tag:
            raise InvalidArgument(f"filter_expression {shown(text)}: an empty tag between '||'; write tags as "
                                  f"'a || b', or '*' for every message")
        if any(c.isspace() or c in "|\x01\x02" for c in tag) or tag == _SUB_ALL:
            raise InvalidArgument(f"filter_expression {shown(text)}: tag {shown(tag)} holds whitespace, '|', '*' or "
                                  f"a control separator; only TAG expressions ('a || b', '*') are supported")
        tags.append(tag)
    unique = tuple(sorted(set(tags)))
    if len(unique) > MAX_TAGS:
        raise InvalidArgument(f"filter_expression names {len(unique)} tags; the limit is {MAX_TAGS}")
    return unique
