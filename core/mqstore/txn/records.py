"""Transaction records as RocketMQ 5 writes them, and the rules of the internal way into the log.

Pure functions and constants, no I/O. The Transaction service (services/txn) builds the records; the
store (MessageStore.append with ``system_writer``) checks them with :func:`check_internal_append`.

  record          topic                          SYSFLAG tx type  properties
  --------------- ------------------------------ ---------------- -----------------------------------------
  half message    RMQ_SYS_TRANS_HALF_TOPIC q0    NOT (0)          REAL_TOPIC, REAL_QID, TRAN_MSG=true, PGROUP,
                                                                  __transactionId__, TRAN_ATTEMPT, TRAN_DIGEST,
                                                                  user properties
  real (commit)   REAL_TOPIC / REAL_QID          COMMIT (0x8)     the half's minus REAL_*/TRAN_MSG/TRAN_ATTEMPT/
                                                                  TRAN_DIGEST; PREPAREDTRANSACTIONOFFSET = the
                                                                  half's offset
  OP message      RMQ_SYS_TRANS_OP_HALF_TOPIC q0 NOT              tag ``d``; body ``"17,18,23,"`` (half queue
                                                                  offsets, ASCII, each followed by ``,``)
  parked          TRANS_CHECK_MAX_TIME_TOPIC q0  NOT              the half's, TRANSACTION_CHECK_TIMES

The half is NOT_TYPE (not PREPARED) so that it gets a queue offset and a consume-queue entry in the
half topic: the OP body names halves by that queue offset. Two properties are this service's own
(RocketMQ has neither): TRAN_ATTEMPT names the Prepare call that appended the half (16 hex digits,
the same on every half of the call), so that a Prepare appended twice is told apart from one of two
messages; TRAN_DIGEST is the digest of the Prepare request (32 hex digits), so that an identical retry
gets the first answer also after a restart. CHECK_IMMUNITY_TIME_IN_SECONDS is RocketMQ's: a producer
sets it on a message to delay its first check-back.
"""

from __future__ import annotations

from typing import Sequence

from mqstore.errors import FailedPrecondition, InvalidArgument, shown
from mqstore.format.record import SYSFLAG_TX_COMMIT, SYSFLAG_TX_MASK
from mqstore.model import KIND_COMPACTION, KIND_SYSTEM, MessageIn, TopicRecord
from mqstore import codec
from mqstore import topics as topic_rules
from mqstore.relayed import WRITER_GATEWAY

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
OP_TAG = "d"

PROPERTY_TRAN_MSG = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # the producer's first-check delay, seconds
PROPERTY_ATTEMPT = "TRAN_ATTEMPT"
PROPERTY_DIGEST = "TRAN_DIGEST"
MAX_CHECK_IMMUNITY_S = 7 * 24 * 3600  # longer would outlive the log's default retention (72 h) anyway
# Delivery-delay properties of RocketMQ 4 and 5: delay + transaction loops HALF <-> SCHEDULE (#1540).
DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "__STARTDELIVERTIME")
# Properties the service writes itself: a producer may not set them.
RESERVED_PROPERTIES = (PROPERTY_TRAN_MSG, PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_ID, PROPERTY_CHECK_TIMES,
                       PROPERTY_ATTEMPT, PROPERTY_DIGEST, "REAL_TOPIC", "REAL_QID")
# A half's properties that its real (COMMIT) message does not carry.
HALF_ONLY_PROPERTIES = ("REAL_TOPIC", "REAL_QID", PROPERTY_TRAN_MSG, PROPERTY_ATTEMPT, PROPERTY_DIGEST)


def tx_type(sys_flag: int) -> int:
    return sys_flag & SYSFLAG_TX_MASK


def check_real_topic(topic: TopicRecord) -> None:
    """A transaction's real topic must be an ordinary topic (INVALID_ARGUMENT otherwise)."""
    if topic.kind == KIND_SYSTEM or topic_rules.is_system_topic(topic.name):
        raise InvalidArgument(f"topic {topic.name!r} is a system topic: transactions write to user topics only")
    if topic.kind == KIND_COMPACTION:
        raise InvalidArgument(f"topic {topic.name!r} is a COMPACTION topic: transactions are not supported there "
                              f"(a half message would need a key-latest rule it cannot follow); use a NORMAL topic")


def check_message_properties(index: int, properties: dict[str, str]) -> None:
    """No delay on a transactional message, no property the service writes itself."""
    for name in DELAY_PROPERTIES:
        if properties.get(name):
            raise InvalidArgument(f"messages[{index}].properties[{name!r}]: a transactional message cannot be "
                                  f"delayed (delay + transaction is not supported); send it without {name}")
    for name in RESERVED_PROPERTIES:
        if name in properties:
            raise InvalidArgument(f"messages[{index}].properties[{name!r}] is set by the Transaction service; "
                                  f"remove it")
    immunity = properties.get(PROPERTY_CHECK_IMMUNITY)
    if immunity is not None and not (_is_number(immunity) and int(immunity) <= MAX_CHECK_IMMUNITY_S):
        raise InvalidArgument(f"messages[{index}].properties[{PROPERTY_CHECK_IMMUNITY!r}]: give whole seconds in "
                              f"[0, {MAX_CHECK_IMMUNITY_S}] (the delay before the first check-back)")


def immunity_ms(value: str) -> int:
    """CHECK_IMMUNITY_TIME_IN_SECONDS as milliseconds; 0 when absent or not a number (records of others)."""
    return min(int(value), MAX_CHECK_IMMUNITY_S) * 1000 if _is_number(value) else 0


def _is_number(value: str) -> bool:
    return 0 < len(value) <= 12 and value.isascii() and value.isdigit()


def check_internal_append(topic: TopicRecord, messages: Sequence[MessageIn], writer: str) -> None:
    """The rules of MessageStore.append's ``system_writer`` door (who may write what). The owner check of
    system topics is the registry's (store_topics.check_system_writer); this adds the transaction type:
    system topics take only NOT_TYPE records, user topics only COMMIT records with a prepared offset, and
    only from the Transaction service."""
    if writer not in topic_rules.OWNER_DESCRIPTIONS:
        raise InvalidArgument(f"writer {shown(writer)} is not one of the store's internal writers; known: "
                              f"{sorted([*topic_rules.OWNER_DESCRIPTIONS, WRITER_GATEWAY])}")
    if topic.kind == KIND_SYSTEM:
        if codec.is_wire_messages(messages):
            return  # the compiled codec's (the timer's records of a delayed Append): no sys flag, no prepared offset
        for index, m in enumerate(messages):  # tx_type(m.sys_flag) != SYSFLAG_TX_NOT, inlined (every timer append)
            if m.sys_flag & SYSFLAG_TX_MASK or m.prepared_transaction_offset:
                raise InvalidArgument(f"messages[{index}]: records of system topic {topic.name!r} are NOT_TYPE "
                                      f"with no prepared offset")
        return
    if writer != topic_rules.OWNER_TRANSACTION:
        raise FailedPrecondition(f"writer {shown(writer)} may write only its own system topics, not {topic.name!r}")
    check_real_topic(topic)
    if codec.is_wire_messages(messages):  # the compiled codec's are NOT_TYPE: the first one is refused
        messages = messages.to_messages(MessageIn)[:1]
    for index, m in enumerate(messages):
        # The half's offset may be 0 (the first record of a log), so only its sign is checked.
        if tx_type(m.sys_flag) != SYSFLAG_TX_COMMIT or m.prepared_transaction_offset < 0:
            raise InvalidArgument(f"messages[{index}]: the Transaction service writes only COMMIT records with "
                                  f"the half's offset (prepared_transaction_offset) into user topics")
