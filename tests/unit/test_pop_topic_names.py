"""Pop consumption's topic names (mqstore.topics): the retry topic of RocketMQ 5
(``%RETRY%{group}+{topic}``) is distinct for every pair of legal names, where the legacy one
(``%RETRY%{group}_{topic}``) collides; the dead-letter topic names one group; which groups a name encodes."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mqstore import topics
from mqstore.errors import InvalidArgument

NAME_CHARS = "%|_-abAB09"
groups = st.text(alphabet=NAME_CHARS, min_size=1, max_size=40)
names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=60)


@given(groups, names, groups, names)
def test_two_different_pairs_never_share_a_retry_topic(g1: str, t1: str, g2: str, t2: str) -> None:
    assume((g1, t1) != (g2, t2))
    assert topics.retry_topic(g1, t1) != topics.retry_topic(g2, t2)
    assert topics.parse_retry_topic(topics.retry_topic(g1, t1)) == (g1, t1)
    assert topics.retry_topic(g1, t1) not in (topics.dlq_topic(g2), topics.legacy_retry_topic(g2, t2))


@given(groups, groups)
def test_two_groups_never_share_a_dead_letter_topic(g1: str, g2: str) -> None:
    assume(g1 != g2)
    assert topics.dlq_topic(g1) != topics.dlq_topic(g2)
    assert topics.pop_topic_groups(topics.dlq_topic(g1)) == (g1,)


@given(groups, names)
def test_a_retry_name_is_a_legal_topic_name_and_encodes_its_group(group: str, topic: str) -> None:
    name = topics.retry_topic(group, topic)
    topics.validate_topic_name(name)
    assert topics.is_pop_owned_topic(name) and topics.pop_topic_groups(name) == (group,)
    assert group in topics.pop_topic_groups(topics.legacy_retry_topic(group, topic))


def test_the_old_name_collides_and_the_new_one_does_not() -> None:
    victim, attacker = ("billing_svc", "payments"), ("billing", "svc_payments")
    assert topics.legacy_retry_topic(*victim) == topics.legacy_retry_topic(*attacker) == "%RETRY%billing_svc_payments"
    assert (topics.retry_topic(*victim), topics.retry_topic(*attacker)) == (
        "%RETRY%billing_svc+payments", "%RETRY%billing+svc_payments")
    # Reading the shared legacy topic needs SUB on every group it may be.
    assert topics.pop_topic_groups("%RETRY%billing_svc_payments") == ("billing", "billing_svc")
    assert topics.pop_topic_groups("%RETRY%solo") == ("solo",)
    assert topics.pop_topic_groups("orders") == () and topics.pop_topic_groups("RMQ_SYS_TRANS_HALF_TOPIC") == ()


@pytest.mark.parametrize("name", ["a+b", "+", "%RETRY%+t", "%RETRY%g+", "%RETRY%a+b+c", "%DLQ%g+t", "%RETRY%a.b+c"])
def test_a_plus_outside_a_well_formed_retry_name_is_illegal(name: str) -> None:
    with pytest.raises(InvalidArgument, match=r"illegal character '\+'|illegal character '\.'"):
        topics.validate_topic_name(name)
    assert topics.parse_retry_topic(name) is None


def test_a_retry_name_over_127_characters_is_refused_with_the_limit() -> None:
    with pytest.raises(InvalidArgument, match="would have 128 characters, the limit is 127; use shorter names"):
        topics.retry_topic("g" * 60, "t" * 60)
    assert len(topics.retry_topic("g" * 60, "t" * 59)) == 127
