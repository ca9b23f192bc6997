"""Topics no user rule decides alone (mqstore.auth.reserved), through Authority.authorize: a system topic
needs the service identity whatever the rules say; a retry or dead-letter topic needs the action on the
group it encodes too."""

from __future__ import annotations

import pytest

from mqstore import topics
from mqstore import access
from mqstore.auth.authority import Authority, Principal
from mqstore.access import ADMIN, ALLOW, DENY, PUB, SUB, SUPER, Rule, group, topic
from mqstore.errors import PermissionDenied

SYSTEM = sorted(topics.SYSTEM_TOPICS) + ["RMQ_SYS_ANYTHING"]


class _Source:
    def version(self) -> int:
        return 1


def _user(*rules: tuple[str, str, str, frozenset]) -> Principal:
    return Principal("mallory", access.NORMAL, tuple(Rule("mallory", kind, pattern, actions, decision)
                                                    for kind, pattern, decision, actions in rules))


EVERYTHING = frozenset((PUB, SUB, ADMIN))
ALLOW_ALL = ((access.TOPIC, "*", ALLOW, EVERYTHING), (access.GROUP, "*", ALLOW, EVERYTHING))


@pytest.mark.parametrize("name", SYSTEM)
@pytest.mark.parametrize("action", [SUB, PUB, ADMIN])
def test_no_rule_and_no_super_user_reaches_a_system_topic(name: str, action: str) -> None:
    authority = Authority(_Source(), default_decision=ALLOW)
    for principal in (_user(*ALLOW_ALL, (access.TOPIC, name, ALLOW, EVERYTHING)), Principal("root", SUPER, ())):
        with pytest.raises(PermissionDenied, match="is a system topic: only the services' own identity") as raised:
            authority.authorize(principal, action, topic(name))
        assert "mqstore acl grant" not in str(raised.value)  # no grant would help
    authority.authorize(Principal(access.SERVICE_USER, SUPER, ()), action, topic(name))


def test_a_deny_rule_is_not_bypassed_through_the_half_topic() -> None:
    authority = Authority(_Source())
    principal = _user((access.TOPIC, "*", ALLOW, frozenset((SUB,))), (access.TOPIC, "secret", DENY, frozenset((SUB,))))
    authority.authorize(principal, SUB, topic("orders"))
    for name in ("secret", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_REVIVE_LOG"):
        with pytest.raises(PermissionDenied):
            authority.authorize(principal, SUB, topic(name))


@pytest.mark.parametrize("name, groups", [
    ("%DLQ%billing", ["billing"]),
    ("%RETRY%billing+svc_payments", ["billing"]),
    ("%RETRY%billing_svc_payments", ["billing", "billing_svc"]),  # legacy: every group it may encode
])
def test_a_retry_or_dead_letter_topic_needs_its_group_too(name: str, groups: list[str]) -> None:
    authority = Authority(_Source())
    on_topics = (access.TOPIC, "*", ALLOW, frozenset((SUB,)))
    for missing in groups:
        granted = [(access.GROUP, g, ALLOW, frozenset((SUB,))) for g in groups if g != missing]
        with pytest.raises(PermissionDenied, match=f"also needs SUB on group '{missing}'"):
            authority.authorize(_user(on_topics, *granted), SUB, topic(name))
    everyone = _user(on_topics, *[(access.GROUP, g, ALLOW, frozenset((SUB,))) for g in groups])
    authority.authorize(everyone, SUB, topic(name))
    with pytest.raises(PermissionDenied, match="no rule of the user grants it"):  # and the topic's own rules
        authority.authorize(_user(*[(access.GROUP, g, ALLOW, frozenset((SUB,))) for g in groups]), SUB, topic(name))
    authority.authorize(Principal("root", SUPER, ()), SUB, topic(name))
    assert authority.decide(everyone, SUB, group("billing")).allowed


def test_a_group_deny_rule_is_named_in_the_denial() -> None:
    authority = Authority(_Source())
    principal = _user(*ALLOW_ALL, (access.GROUP, "victim", DENY, frozenset((SUB,))))
    with pytest.raises(PermissionDenied, match=r"its rule #0 deny SUB on group victim denies that"):
        authority.authorize(principal, SUB, topic("%DLQ%victim"))
