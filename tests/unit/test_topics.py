"""Topic and group name rules, queue counts and system topics (mqstore.topics)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.errors import InvalidArgument
from mqstore.topics import (
    GROUP_NAME_MAX_CHARS,
    SYSTEM_TOPICS,
    TOPIC_NAME_MAX_CHARS,
    is_system_topic,
    validate_group_name,
    validate_queue_count,
    validate_topic_name,
)

# The rule as RocketMQ's TopicValidator states it; fullmatch, so a trailing newline does not pass.
TOPIC_MODEL = re.compile(r"[%|a-zA-Z0-9_-]{1,127}")
GROUP_MODEL = re.compile(r"[%|a-zA-Z0-9_-]{1,120}")
LEGAL_CHARS = "%|_-abcXYZ019"


@pytest.mark.parametrize(
    "name", ["a", "orders", "%RETRY%my-group", "a|b", "Topic_01-x", "x" * TOPIC_NAME_MAX_CHARS]
)
def test_legal_topic_names_pass(name: str) -> None:
    validate_topic_name(name)


def test_empty_topic_name_says_empty() -> None:
    with pytest.raises(InvalidArgument, match="topic name is empty"):
        validate_topic_name("")


def test_too_long_topic_name_gives_length_and_limit() -> None:
    with pytest.raises(InvalidArgument, match="128 characters long; the limit is 127"):
        validate_topic_name("t" * 128)


@pytest.mark.parametrize(
    ("name", "char", "position"),
    [
        ("ab.c", ".", 2),
        ("orders\n", "\n", 6),
        (" lead", " ", 0),
        ("café", "é", 3),
        ("a/b/c", "/", 1),
    ],
)
def test_illegal_character_named_with_its_position(name: str, char: str, position: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate_topic_name(name)
    message = str(raised.value)
    assert f"illegal character {char!r} at position {position}" in message
    assert "allowed are" in message


def test_non_string_topic_name_rejected() -> None:
    with pytest.raises(InvalidArgument, match="must be a string"):
        validate_topic_name(42)  # type: ignore[arg-type]


def test_group_name_limit_is_120() -> None:
    validate_group_name("g" * GROUP_NAME_MAX_CHARS)
    with pytest.raises(InvalidArgument, match="group name is 121 characters long; the limit is 120"):
        validate_group_name("g" * 121)
    with pytest.raises(InvalidArgument, match="group name is empty"):
        validate_group_name("")
    with pytest.raises(InvalidArgument, match=r"illegal character '\*' at position 1"):
        validate_group_name("g*")


@given(st.text(alphabet=LEGAL_CHARS + ".# \n\té", max_size=130))
def test_topic_rule_matches_regex_model(name: str) -> None:
    assert _accepts(validate_topic_name, name) == (TOPIC_MODEL.fullmatch(name) is not None)


@given(st.text(alphabet=LEGAL_CHARS + "./:\x00", max_size=125))
def test_group_rule_matches_regex_model(name: str) -> None:
    assert _accepts(validate_group_name, name) == (GROUP_MODEL.fullmatch(name) is not None)


def test_system_topics() -> None:
    for name in (
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SCHEDULE_TOPIC_XXXX",
    ):
        assert name in SYSTEM_TOPICS
        assert is_system_topic(name)
    assert is_system_topic("RMQ_SYS_ANYTHING")
    assert not is_system_topic("orders")
    assert not is_system_topic("rmq_sys_lowercase")  # the prefix is case-sensitive, as in RocketMQ
    assert not is_system_topic("MY_RMQ_SYS_TOPIC")


@pytest.mark.parametrize("count", [1, 8, 1024])
def test_queue_count_in_range_passes(count: int) -> None:
    validate_queue_count(count)


@pytest.mark.parametrize("count", [0, -1, 1025])
def test_queue_count_out_of_range_gives_the_range(count: int) -> None:
    with pytest.raises(InvalidArgument, match=f"queue_count is {count}; it must be between 1 and 1024"):
        validate_queue_count(count)


@pytest.mark.parametrize("count", [True, 1.0, "4", None])
def test_queue_count_must_be_an_int(count: object) -> None:
    with pytest.raises(InvalidArgument, match="queue_count must be an integer"):
        validate_queue_count(count)  # type: ignore[arg-type]


def _accepts(validate, name: str) -> bool:
    try:
        validate(name)
    except InvalidArgument:
        return False
    return True
