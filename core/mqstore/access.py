"""The access model: users, actions on resources, rules that allow or deny them, and the decision.

Shaped on RocketMQ ACL 2.0 (rocketmq.apache.org, "Access Control 2.0"):

* a **user** has a name, a hashed secret (mqstore.auth.secrets) and a kind: ``super`` (every action on
  every resource, no rule consulted) or ``normal`` (rules decide);
* an **action** is PUB (write messages), SUB (read messages, commit and query offsets), or ADMIN
  (create, update, delete topics; force-resolve transactions; compaction rounds; users and rules;
  operator figures);
* a **resource** is a topic, a consumer or producer group, or the cluster (what names neither: the
  log read by position, the store's figures);
* a **rule** of a user: allow or deny some actions on the resources whose kind it names and whose name
  its pattern matches: a literal name (``orders``), a prefix (``orders-*``) or everything (``*``);
  a cluster rule's pattern is ``*``.

The decision for (user, action, resource): a super user is allowed. Otherwise, of the user's rules
that name the action and match the resource, the most specific one decides: a literal pattern before
any prefix, a longer prefix before a shorter one, a prefix before ``*``; between equally specific rules
DENY wins. No matching rule: the default policy (deny unless the service is configured to allow).

Names are bounded and checked (a user name is ``[A-Za-z0-9_.@-]{1,64}``; a pattern is a topic or group
name, optionally ending in ``*``), so every message that names one can quote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from mqstore.errors import InvalidArgument, shown

PUB, SUB, ADMIN = "PUB", "SUB", "ADMIN"
ACTIONS = (PUB, SUB, ADMIN)
TOPIC, GROUP, CLUSTER = "topic", "group", "cluster"
RESOURCE_KINDS = (TOPIC, GROUP, CLUSTER)
ALLOW, DENY = "allow", "deny"
DECISIONS = (ALLOW, DENY)
SUPER, NORMAL = "super", "normal"
USER_KINDS = (SUPER, NORMAL)

# The services' own identity (the secret is MQSTORE_INTERNAL_TOKEN, never stored): a super user that
# no one can create, change or delete through the Access API.
SERVICE_USER = "service"

_USER_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_ACCESS_KEY = re.compile(r"^[A-Za-z0-9]{8,64}$")
# Topic and group names as mqstore.topics allows them ([%|a-zA-Z0-9_-]{1,127}), plus an optional "*".
_PATTERN = re.compile(r"^(\*|[%|a-zA-Z0-9_-]{1,127}\*?)$")


def check_user_name(name: str) -> str:
    if not _USER_NAME.match(name):
        raise InvalidArgument("user name: 1 to 64 characters of A-Z a-z 0-9 _ . @ -")
    return name


def check_access_key(access_key: str) -> str:
    if not _ACCESS_KEY.match(access_key):
        raise InvalidArgument("access key: 8 to 64 characters of A-Z a-z 0-9, as `mqstore user sdk-key list` shows")
    return access_key


def is_access_key(access_key: str) -> bool:
    return bool(_ACCESS_KEY.match(access_key))


def is_user_name(name: str) -> bool:
    return bool(_USER_NAME.match(name))


class Resource(NamedTuple):
    """What a call touches: a topic or group by name, or the cluster (name ""). A tuple: one is made per
    call on the hot path, and a tuple is the cheapest immutable value to make."""

    kind: str
    name: str = ""

    def __str__(self) -> str:
        return "the cluster" if self.kind == CLUSTER else f"{self.kind} {self.name!r}"

    def flag(self) -> str:
        """How ``mqstore acl`` names it."""
        return "--cluster" if self.kind == CLUSTER else f"--{self.kind} {self.name}"


def topic(name: str) -> Resource:
    return Resource(TOPIC, name)


def group(name: str) -> Resource:
    return Resource(GROUP, name)


CLUSTER_RESOURCE = Resource(CLUSTER)


@dataclass(frozen=True, slots=True)
class User:
    name: str
    kind: str
    secret_hash: str   # mqstore.auth.secrets format; never logged or returned
    created_ms: int
    updated_ms: int


@dataclass(frozen=True, slots=True)
class SdkKey:
    """An SDK credential of a user: the access key the RocketMQ SDKs send in clear, and its secret key
    sealed under the kek (mqstore.auth.sealing; never logged or returned)."""

    access_key: str
    user: str
    sealed_secret: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of a user's access list. ``rule_id`` is the store's (0 before it is stored)."""

    user: str
    kind: str
    pattern: str
    actions: frozenset[str]
    decision: str
    rule_id: int = 0

    def __post_init__(self) -> None:
        check_user_name(self.user)
        if self.kind not in RESOURCE_KINDS:
            raise InvalidArgument(f"resource kind: one of {', '.join(RESOURCE_KINDS)}, not {shown(self.kind)}")
        if self.kind == CLUSTER and self.pattern != "*":
            raise InvalidArgument("a cluster rule's pattern is *")
        if not _PATTERN.match(self.pattern):
            raise InvalidArgument("pattern: a topic or group name ([%|a-zA-Z0-9_-]{1,127}), optionally ending in "
                                  "* for a prefix, or * alone for every name")
        if not self.actions or not self.actions <= set(ACTIONS):
            raise InvalidArgument(f"actions: one or more of {', '.join(ACTIONS)}")
        if self.decision not in DECISIONS:
            raise InvalidArgument(f"decision: allow or deny, not {shown(self.decision)}")

    def matches(self, action: str, resource: Resource) -> bool:
        return action in self.actions and resource.kind == self.kind and pattern_matches(self.pattern, resource.name)

    def specificity(self) -> tuple[int, int]:
        """Higher is more specific: literal, then longer prefixes, then ``*``."""
        if self.pattern == "*":
            return (0, 0)
        if self.pattern.endswith("*"):
            return (1, len(self.pattern))
        return (2, len(self.pattern))

    def describe(self) -> str:
        target = "the cluster" if self.kind == CLUSTER else f"{self.kind} {self.pattern}"
        return f"#{self.rule_id} {self.decision} {','.join(sorted(self.actions))} on {target}"


def pattern_matches(pattern: str, name: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    rule: Rule | None      # the deciding rule; None: the default policy (or a super user)
    reason: str = ""       # a denial's whole explanation, when no rule alone made it (mqstore.auth.reserved)


def decide(user_kind: str, rules: tuple[Rule, ...], action: str, resource: Resource, default: str) -> Decision:
    """The decision of the module docstring."""
    if user_kind == SUPER:
        return Decision(True, None)
    best: Rule | None = None
    for rule in rules:
        if not rule.matches(action, resource):
            continue
        if best is None or rule.specificity() > best.specificity() or (
                rule.specificity() == best.specificity() and rule.decision == DENY):
            best = rule
    if best is None:
        return Decision(default == ALLOW, None)
    return Decision(best.decision == ALLOW, best)


def parse_actions(text: str) -> frozenset[str]:
    """``PUB,SUB`` (any case) -> the set; InvalidArgument naming the valid ones."""
    actions = frozenset(part.strip().upper() for part in text.split(",") if part.strip())
    if not actions or not actions <= set(ACTIONS):
        raise InvalidArgument(f"actions: a comma-separated list of {', '.join(ACTIONS)}")
    return actions
