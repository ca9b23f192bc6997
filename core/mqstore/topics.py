"""Topic and consumer group rules: names, queue counts, system topics. Pure functions, no I/O.

RocketMQ's ``TopicValidator``: names use only ``[%|a-zA-Z0-9_-]``; a topic is at most 127 characters
(so it fits the 1-byte TOPICLENGTH of a V1 record), a group at most 120. The facade calls these before
it touches the metadata store, which enforces none of them.

Pop consumption's own topics, named so that no two (group, topic) pairs share one:

  topic          name                        written by                      read by
  -------------- --------------------------- ------------------------------- -------------------------------
  retry          ``%RETRY%{group}+{topic}``  pop consumption (the revive     Receive of {topic} by {group};
                                             duty), one queue                Pull needs SUB on {group} too
  dead letter    ``%DLQ%{group}``            pop consumption                 Pull needs SUB on {group} too
  retry, legacy  ``%RETRY%{group}_{topic}``  versions before this one        Receive, each message by its
                                                                             owner only (below)

``+`` is RocketMQ 5's separator (KeyBuilder.buildPopRetryTopicV2, ``POP_RETRY_SEPARATOR_V2``): it is not a
legal character of a group or topic name, so the name splits one way only, and a client can neither
create such a topic nor name one that is not pop's (:func:`validate_topic_name` takes ``+`` only in a
well-formed retry name; CreateTopic refuses every ``%RETRY%``/``%DLQ%`` name). The legacy name of
RocketMQ 4 and of earlier versions of this store, with ``_``, collides: (``billing_svc``, ``payments``)
and (``billing``, ``svc_payments``) share ``%RETRY%billing_svc_payments``. Stores that have such topics
keep them: mqstore.pop.receive reads a group's legacy topic beside its new one and delivers from it only
the messages whose owner is that group and topic (mqstore.pop.legacy), so an unacked message left
there is delivered once more to its own consumers and to nobody else; new retry copies go to the new name.
"""

from __future__ import annotations

import re

from mqstore.errors import InvalidArgument
from mqstore.format import offset_commit, tier_upload, topic_event

TOPIC_NAME_MAX_CHARS = 127
GROUP_NAME_MAX_CHARS = 120
QUEUE_COUNT_MIN = 1
QUEUE_COUNT_MAX = 1024

NAME_CHARSET_DESCRIPTION = "letters a-z A-Z, digits 0-9, '%', '|', '_' and '-'"
_ILLEGAL_NAME_CHAR = re.compile(r"[^%|a-zA-Z0-9_-]")

SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
# The names of the system writers (MessageStore.append's ``system_writer``). Which topics each writes and
# what it may write there is the writer's to say: it registers its rules (mqstore.writers) at its
# composition, and the store knows none of them. Clients never write system topics.
OWNER_TRANSACTION = "txn"
OWNER_SCHEDULE = "schedule"
OWNER_POP = "pop"
OWNER_STORE = ""  # the commit log itself: no writer may name it, the store appends these records alone
REVIVE_TOPIC = "rmq_sys_REVIVE_LOG"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Descriptions of the writers' names, for mqstore.txn.records' check of a writer's name (the registry's
# WriterRules.description says the same; this goes once that check asks mqstore.writers).
OWNER_DESCRIPTIONS = {
    OWNER_TRANSACTION: "the Transaction service",
    OWNER_SCHEDULE: "the delayed-message scheduler",
    OWNER_POP: "pop consumption, the Consumer service of the commit log",
    OWNER_STORE: "the commit log itself, on DeleteTopic,",
}
# The system topics: reserved in every process whether or not their writer is registered there (no client
# creates, changes, deletes or writes one; the store creates them at start).
SYSTEM_TOPICS = frozenset({
    "RMQ_SYS_TRANS_HALF_TOPIC",  # half (prepared) transaction messages
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",  # OP records: which half messages are resolved
    "TRANS_CHECK_MAX_TIME_TOPIC",  # half messages that ran out of check-backs
    SCHEDULE_TOPIC,  # delayed messages (tag code = delivery time)
    REVIVE_TOPIC,  # pop consumption's in-flight state: CK and ACK records (mqstore.pop.records)
    topic_event.TOPIC,  # topic events (a topic deleted): mqstore.format.topic_event
    offset_commit.TOPIC,  # consumer offsets: mqstore.format.offset_commit, mqstore.consumer_offsets
    tier_upload.TOPIC,  # uploads to the object storage tier: mqstore.format.tier_upload, mqstore.tier.ledger
})

# Pop consumption's per-group topics (RocketMQ's names, the module docstring): NORMAL topics, created on
# demand and written only by pop consumption (OWNER_POP), never by CommitLog.Append; reading one needs SUB
# on the group it names as well (mqstore.auth.authority).
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
POP_OWNED_PREFIXES = (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX)
RETRY_SEPARATOR = "+"          # RocketMQ 5's POP_RETRY_SEPARATOR_V2: illegal in group and topic names
RETRY_SEPARATOR_LEGACY = "_"   # RocketMQ 4's (and this store's before): legal in names, so names collide


def validate_topic_name(name: str) -> None:
    """Raise InvalidArgument unless ``name`` is a legal topic name: a name a client may create, or a retry
    topic's (``%RETRY%{group}+{topic}``, which only pop consumption creates)."""
    if isinstance(name, str) and RETRY_SEPARATOR in name and parse_retry_topic(name) is not None:
        return
    _validate_name("topic", name, TOPIC_NAME_MAX_CHARS)


def validate_group_name(name: str) -> None:
    """Raise InvalidArgument unless ``name`` is a legal consumer or producer group name."""
    _validate_name("group", name, GROUP_NAME_MAX_CHARS)


def is_system_topic(name: str) -> bool:
    """True for the store's own topics, which clients may not create, change or delete."""
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIX)


def is_pop_owned_topic(name: str) -> bool:
    """True for a retry (%RETRY%...) or dead-letter (%DLQ%...) topic: written only by pop consumption."""
    return name.startswith(POP_OWNED_PREFIXES)


def retry_topic(group: str, topic: str) -> str:
    """``%RETRY%{group}+{topic}``, the group's retry topic for ``topic`` (RocketMQ 5's
    buildPopRetryTopicV2): distinct for every pair of legal names. InvalidArgument when the name does not
    fit a topic name (a V1 record holds at most 127 bytes of topic)."""
    return _pop_topic_name(f"{RETRY_TOPIC_PREFIX}{group}{RETRY_SEPARATOR}{topic}", "group and topic")


def legacy_retry_topic(group: str, topic: str) -> str:
    """``%RETRY%{group}_{topic}``, the name earlier versions gave the retry topic (ambiguous: the module
    docstring); read during the migration only, never written."""
    return _pop_topic_name(f"{RETRY_TOPIC_PREFIX}{group}{RETRY_SEPARATOR_LEGACY}{topic}", "group and topic")


def parse_retry_topic(name: str) -> tuple[str, str] | None:
    """(group, topic) of a retry topic name ``%RETRY%{group}+{topic}`` of legal names; None for any
    other name (a legacy one included)."""
    if not name.startswith(RETRY_TOPIC_PREFIX) or len(name) > TOPIC_NAME_MAX_CHARS:
        return None
    group, sep, topic = name[len(RETRY_TOPIC_PREFIX):].partition(RETRY_SEPARATOR)
    if not sep or not _is_legal(group, GROUP_NAME_MAX_CHARS) or not _is_legal(topic, TOPIC_NAME_MAX_CHARS):
        return None
    return group, topic


def dlq_topic(group: str) -> str:
    """``%DLQ%{group}``, the group's dead-letter topic (one name per group: no collision)."""
    return _pop_topic_name(f"{DLQ_TOPIC_PREFIX}{group}", "group")


def pop_topic_groups(name: str) -> tuple[str, ...]:
    """The consumer groups whose messages the retry or dead-letter topic ``name`` may hold: one for a
    retry (``%RETRY%{group}+{topic}``) or dead-letter name; for a legacy retry name
    (``%RETRY%{group}_{topic}``) every group it may encode (the part before each ``_``; the whole rest
    when there is none, as RocketMQ 4's push consumers name theirs ``%RETRY%{group}``); () for any other
    name. Reading such a topic needs SUB on each of them."""
    if name.startswith(DLQ_TOPIC_PREFIX):
        rest = name[len(DLQ_TOPIC_PREFIX):]
        return (rest,) if rest else ()
    if not name.startswith(RETRY_TOPIC_PREFIX):
        return ()
    parsed = parse_retry_topic(name)
    if parsed is not None:
        return (parsed[0],)
    rest = name[len(RETRY_TOPIC_PREFIX):]
    if not rest:
        return ()
    splits = [rest[:i] for i, c in enumerate(rest) if c == RETRY_SEPARATOR_LEGACY and 0 < i < len(rest) - 1]
    return tuple(splits) or (rest,)


def _pop_topic_name(name: str, what: str) -> str:
    if len(name) > TOPIC_NAME_MAX_CHARS:
        raise InvalidArgument(f"the {what} are too long for pop consumption: its topic {name[:40]}... would have "
                              f"{len(name)} characters, the limit is {TOPIC_NAME_MAX_CHARS}; use shorter names")
    return name


def validate_queue_count(queue_count: int) -> None:
    """Raise InvalidArgument unless ``queue_count`` is an int in [1, 1024]."""
    # bool is an int subclass; True as a queue count is a caller bug, not 1.
    if not isinstance(queue_count, int) or isinstance(queue_count, bool):
        raise InvalidArgument(
            f"queue_count must be an integer, got {type(queue_count).__name__} {queue_count!r}"
        )
    if not QUEUE_COUNT_MIN <= queue_count <= QUEUE_COUNT_MAX:
        raise InvalidArgument(
            f"queue_count is {queue_count}; it must be between {QUEUE_COUNT_MIN} and "
            f"{QUEUE_COUNT_MAX}"
        )


def _validate_name(what: str, name: str, max_chars: int) -> None:
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidArgument(f"{what} name is empty; give 1 to {max_chars} characters "
                              f"(names match {_pattern(max_chars)})")
    if len(name) > max_chars:
        raise InvalidArgument(
            f"{what} name is {len(name)} characters long; the limit is {max_chars} "
            f"(names match {_pattern(max_chars)})"
        )
    illegal = _ILLEGAL_NAME_CHAR.search(name)
    if illegal is not None:
        raise InvalidArgument(
            f"{what} name {name!r} has the illegal character {illegal.group()!r} at position "
            f"{illegal.start()} (0-based); allowed are {NAME_CHARSET_DESCRIPTION} "
            f"(names match {_pattern(max_chars)})"
        )


def _is_legal(name: str, max_chars: int) -> bool:
    return 0 < len(name) <= max_chars and _ILLEGAL_NAME_CHAR.search(name) is None


def _pattern(max_chars: int) -> str:
    return f"[%|a-zA-Z0-9_-]{{1,{max_chars}}}"
