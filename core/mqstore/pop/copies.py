"""The copies pop consumption writes, and what it may write. Pure functions, no I/O.

  copy        topic                       RECONSUMETIMES     properties added to the original's
  ----------- --------------------------- ------------------ ------------------------------------------
  retry       %RETRY%{group}+{topic} q0   original's + 1     RETRY_TOPIC = topic, ORIGIN_MESSAGE_ID
  dead letter %DLQ%{group} q0             original's         DLQ_ORIGIN_TOPIC = topic, DLQ_ORIGIN_MESSAGE_ID

The body, flag, born time and host, TAGS, KEYS, UNIQ_KEY (the client's message id) and user properties
are the original's, so a consumer sees the same message again. ORIGIN_MESSAGE_ID is the offset message id
of the first copy (kept through later retries). A copy made by the revive duty also names the in-flight
entry it ends, POP_CK = "<ck id>:<queue offset>": after a crash between the copy and its ACK record, the
start finds the copy there and writes the ACK instead of copying again (mqstore.pop.replay).
"""

from __future__ import annotations

from typing import Sequence

from mqstore import codec
from mqstore import topics as topic_rules
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.format.record import SYSFLAG_TX_MASK, SYSFLAG_TX_NOT
from mqstore.model import KIND_SYSTEM, MessageIn, StoredMessage, TopicRecord
from mqstore.writers import WriterRules

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_POP_CK = "POP_CK"


def ck_marker(ck_id: int, queue_offset: int) -> str:
    return f"{ck_id}:{queue_offset}"


def with_marker(copy: MessageIn, ck_id: int, queue_offset: int) -> MessageIn:
    """``copy`` naming the in-flight entry (CK, queue offset) whose expiry it is."""
    copy.properties[PROPERTY_POP_CK] = ck_marker(ck_id, queue_offset)
    return copy


def retry_copy(message: StoredMessage, topic: str, delivered: bool = True) -> MessageIn:
    """The copy of ``message`` (received from ``topic`` or its retry topic) for the retry topic; ``delivered``
    false for a message an ordered group held and never handed out (its attempt count stays)."""
    properties = dict(message.record.properties)
    properties[PROPERTY_RETRY_TOPIC] = topic  # ours, whatever the producer set (mqstore.pop.legacy reads it)
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
    return _copy(message, properties, message.record.reconsume_times + (1 if delivered else 0))


def dead_letter_copy(message: StoredMessage, topic: str) -> MessageIn:
    properties = dict(message.record.properties)
    properties[PROPERTY_DLQ_ORIGIN_TOPIC] = topic
    properties.setdefault(PROPERTY_DLQ_ORIGIN_MESSAGE_ID, properties.get(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id))
    return _copy(message, properties, message.record.reconsume_times)


def _copy(message: StoredMessage, properties: dict[str, str], reconsume_times: int) -> MessageIn:
    rec = message.record
    return MessageIn(body=rec.body, properties=properties, flag=rec.flag, born_timestamp_ms=rec.born_timestamp_ms,
                     queue_id=0, born_host=rec.born_host, born_port=rec.born_port, reconsume_times=reconsume_times)


def check_internal_append(topic: TopicRecord, messages: Sequence[MessageIn]) -> None:
    """What pop consumption (MessageStore.append's system_writer ``pop``) may write: its revive topic and
    the retry and dead-letter topics, ordinary (NOT_TYPE) records only. Which system topic is whose is the
    registry's check (mqstore.writers), which follows this one."""
    if topic.kind != KIND_SYSTEM and not topic_rules.is_pop_owned_topic(topic.name):
        raise FailedPrecondition(f"writer {topic_rules.OWNER_POP!r} writes only retry (%RETRY%) and dead-letter "
                                 f"(%DLQ%) topics, not {topic.name!r}")
    if codec.is_wire_messages(messages):
        return  # the compiled codec's: NOT_TYPE, no prepared offset (mqstore_rpc.append_wire.parse_internal_batches)
    for index, m in enumerate(messages):
        if m.sys_flag & SYSFLAG_TX_MASK != SYSFLAG_TX_NOT or m.prepared_transaction_offset:
            raise InvalidArgument(f"messages[{index}]: pop consumption writes NOT_TYPE records with no prepared "
                                  f"offset into {topic.name!r}")


# Pop consumption as a system writer (mqstore.writers; registered by mqstore.system_writers): its revive
# topic, and the retry and dead-letter topics, which no other writer nor any client writes.
RULES = WriterRules(topic_rules.OWNER_POP, topic_rules.OWNER_DESCRIPTIONS[topic_rules.OWNER_POP],
                    frozenset({topic_rules.REVIVE_TOPIC}), topic_rules.POP_OWNED_PREFIXES,
                    "a retry or dead-letter topic", check_internal_append)
