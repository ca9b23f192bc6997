"""The migration from the legacy retry topic names (``%RETRY%{group}_{topic}``) to RocketMQ 5's
(``%RETRY%{group}+{topic}``, mqstore.topics): whose is a message in a legacy retry topic.

The legacy name is ambiguous: (``billing_svc``, ``payments``) and (``billing``, ``svc_payments``) share
``%RETRY%billing_svc_payments``, and a store made by an earlier version may hold unacked messages of
both there. The choice, RocketMQ 5's own (``retrieveMessageFromPopRetryTopicV1``: a broker reads the V1
retry topic beside the V2 one while old copies remain), made safe:

* nothing is renamed or copied at start: a legacy topic stays as it is, and a Receive of (group, topic)
  reads the group's legacy topic as one more source (records.SOURCE_RETRY_LEGACY, its own pop offset
  and in-flight entries, as before the upgrade) when that topic exists;
* from it the receive delivers only the messages :func:`owner` attributes to that group and topic,
  and passes over the others as it passes over a filtered message: the other group sharing the name
  advances its own offset over them, and so never sees them;
* a delivered legacy message that is not acked is copied to the new retry topic like any other (the
  revive duty writes only new names), so the legacy topic only drains.

So no message is lost (each one left unconsumed is delivered to its owner, from the owner's own pop
offset, which the upgrade keeps) and none is delivered twice beyond at-least-once (nothing is copied
at start, so a crash during the upgrade cannot duplicate). In-flight entries from before the upgrade
keep working: their CK records say SOURCE_RETRY_LEGACY (the value 1 that meant the retry topic), so
their receipt handles still ack, and their expiry goes to the new retry topic. The cost is one more
queue per receive for a group whose legacy topic exists, and a read of one CK record per message
delivered from it.

Whose a message is, read from the message itself: every retry copy names the in-flight entry it ended,
POP_CK = "<ck id>:<queue offset>" (mqstore.pop.copies), and the CK record at that physical offset of the
revive topic names its group and topic (a producer cannot forge either). A copy whose CK record is gone
(retention) is attributed by its RETRY_TOPIC property, the topic it was received from, the group being
the rest of the name. That property is weaker: earlier versions kept a RETRY_TOPIC the producer had set
(this one overwrites it, mqstore.pop.copies), so a forged one decides only for a legacy copy whose CK
retention already removed. A message that names neither is nobody's, and is passed over.

Pure reads of the store; thread-safe as the store is.
"""

from __future__ import annotations

import structlog

from mqstore import topics as topic_rules
from mqstore.errors import DataLoss, InvalidArgument, NotFound, OutOfRange
from mqstore.model import StoredMessage
from mqstore.pop import copies, records

log = structlog.get_logger("mqstore.pop.legacy")


def owner(store, name: str, message: StoredMessage) -> tuple[str, str] | None:
    """(group, topic) whose retry copy ``message`` (of the legacy retry topic ``name``) is, or None."""
    props = message.record.properties
    marker = props.get(copies.PROPERTY_POP_CK, "")
    ck_id, _, _ = marker.partition(":")
    if ck_id.isdigit():
        found = _ck_owner(store, int(ck_id))
        if found is not None:
            return found if _named(name, *found) else None
    topic = props.get(copies.PROPERTY_RETRY_TOPIC, "")
    suffix = topic_rules.RETRY_SEPARATOR_LEGACY + topic
    rest = name[len(topic_rules.RETRY_TOPIC_PREFIX):]
    if not topic or not name.startswith(topic_rules.RETRY_TOPIC_PREFIX) or not rest.endswith(suffix):
        return None
    group = rest[:-len(suffix)]
    return (group, topic) if group else None


def _ck_owner(store, ck_id: int) -> tuple[str, str] | None:
    try:
        ck_record = store.get_message(ck_id)
    except (NotFound, OutOfRange, DataLoss, InvalidArgument):
        return None  # retention removed it (or the marker is not a record start): the property decides
    if ck_record.record.topic != topic_rules.REVIVE_TOPIC:
        return None
    try:
        ck = records.decode_ck(ck_record.record.body)
    except records.BadRecord:
        return None
    return ck.group, ck.topic


def _named(name: str, group: str, topic: str) -> bool:
    try:
        return topic_rules.legacy_retry_topic(group, topic) == name
    except InvalidArgument:
        return False
