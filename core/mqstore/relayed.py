"""What a gateway may append for its clients through the store's internal way (MessageStore.append's
``system_writer`` ``gateway``: CommitLogInternal.Append with writer "gateway").

The RocketMQ 5 gateway takes that way for one reason: the record's BORNHOST is then the producer's
address (InternalMessage.born_host) rather than the gateway's own, which is all the public Append can
store. Everything else stays as a client's append: user topics only (the registry refuses system topics
and pop consumption's retry and dead-letter topics: mqstore.writers, which follows this check), and
plain records: no transaction type, no prepared offset, no reconsume count.

Thread-safety: stateless.
"""

from __future__ import annotations

from typing import Sequence

from mqstore import codec
from mqstore.errors import InvalidArgument
from mqstore.format.record import SYSFLAG_TX_MASK, SYSFLAG_TX_NOT
from mqstore.model import MessageIn, TopicRecord
from mqstore.writers import WriterRules

WRITER_GATEWAY = "gateway"


def check_internal_append(topic: TopicRecord, messages: Sequence[MessageIn]) -> None:
    if codec.is_wire_messages(messages):
        return  # the compiled codec's: plain messages only (mqstore_rpc.append_wire.parse_internal_batches)
    for index, m in enumerate(messages):
        if m.sys_flag & SYSFLAG_TX_MASK != SYSFLAG_TX_NOT or m.prepared_transaction_offset or m.reconsume_times:
            raise InvalidArgument(f"messages[{index}]: the gateway appends its clients' plain messages (no "
                                  f"transaction_type, prepared_transaction_offset or reconsume_times) into "
                                  f"{topic.name!r}; transactions go through the Transaction service")


# The gateway as a system writer (mqstore.writers; registered by mqstore.system_writers): no topic of its own.
RULES = WriterRules(WRITER_GATEWAY, "the gateway", check=check_internal_append)
