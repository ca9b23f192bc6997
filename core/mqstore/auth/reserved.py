"""Topics whose access no user rule decides alone: the store's system topics, and pop consumption's
retry and dead-letter topics. Pure functions; :meth:`mqstore.auth.authority.Authority.decide` asks
:func:`decide` before the user's rules, so every RPC that names a topic (the interceptor's permission
table, and the servicers' deferred checks) is covered in one place.

* **System topics** (mqstore.topics.is_system_topic: ``RMQ_SYS_*``, ``rmq_sys_REVIVE_LOG``,
  ``SCHEDULE_TOPIC_XXXX``, ``TRANS_CHECK_MAX_TIME_TOPIC``...) hold other users' data in the store's own
  layout: half messages of every transactional topic, pop consumption's state, delayed messages. A rule
  on ``*`` would otherwise reach them and bypass a deny rule on the topic whose messages they carry
  (``allow SUB *, deny SUB secret``: a Pull of ``RMQ_SYS_TRANS_HALF_TOPIC`` returned the halves of
  ``secret``). Any action naming one needs the services' own identity (``service``,
  mqstore.access.SERVICE_USER): no rule grants it, and a super user is refused too. RocketMQ lets an
  admin read system topics; the issue this follows asks for the internal identity alone, and an operator
  who must look inside one does it with the service's credentials (where MQSTORE_INTERNAL_TOKEN is).
  Reading the whole log (Tail without topics, GetMessage by position) is a CLUSTER read, a separate
  grant, which does include the system topics' records.
* **Retry and dead-letter topics** (``%RETRY%{group}+{topic}``, ``%DLQ%{group}``; the legacy
  ``%RETRY%{group}_{topic}``) hold one group's messages: an action naming one also needs that action on
  the group it encodes (on every group a legacy name may encode: mqstore.topics.pop_topic_groups),
  besides the rules on the topic name itself.

The denials name only what the caller sent (the topic and group names) and the rule: none says whether
the topic exists or what it holds.
"""

from __future__ import annotations

from typing import Callable

from mqstore import topics as topic_rules
from mqstore.access import SERVICE_USER, TOPIC, Decision, Resource, group


def decide(user: str, action: str, resource: Resource,
           decide_group: Callable[[str, Resource], Decision]) -> Decision | None:
    """The decision for ``user`` doing ``action`` on ``resource`` when the module docstring's rules make it
    (a denial, or the service's allowance of a system topic); None when the user's rules decide.
    ``decide_group(action, group resource)``: the user's decision on a group (cached by the caller)."""
    if resource.kind != TOPIC:
        return None
    if topic_rules.is_system_topic(resource.name):
        if user == SERVICE_USER:
            return Decision(True, None)
        return Decision(False, None, f"{resource} is a system topic: only the services' own identity (user "
                                     f"{SERVICE_USER!r}) may name it, whatever a user's rules say (super users "
                                     f"included); read your own topics instead")
    for name in topic_rules.pop_topic_groups(resource.name):
        on_group = decide_group(action, group(name))
        if not on_group.allowed:
            why = (f"its rule {on_group.rule.describe()} denies that" if on_group.rule is not None else
                   "no rule of the user grants that")
            return Decision(False, on_group.rule, f"a retry or dead-letter topic holds the messages of a consumer "
                                                  f"group: {action} on {resource} also needs {action} on group "
                                                  f"{name!r}, and {why}; an admin grants it with: mqstore acl grant "
                                                  f"<user> --group {name} --actions {action}")
    return None
