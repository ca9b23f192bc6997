"""The composition of mqstore's system writers: importing this module registers every one of them into
the process's registry (mqstore.writers.SYSTEM_WRITERS), which every MessageStore of the process asks.

A process whose store takes appends from other parts of mqstore imports it at its composition: the commit
log (its internal way in serves the Transaction service, the gateway and pop consumption of other
processes), and the tests. Each writer's rules are its feature's (pop consumption: mqstore.pop.copies;
the gateway: mqstore.relayed; the Transaction service and the delayed-message scheduler: below, with
mqstore.txn.records' check); the store's own (its topic events) are registered by the store.

Thread-safety: the registration runs once, at import.
"""

from __future__ import annotations

import functools

from mqstore import relayed
from mqstore import topics as topic_rules
from mqstore.pop import copies as pop_copies
from mqstore.txn import records as transactions
from mqstore.writers import SYSTEM_WRITERS, WriterRules

# The Transaction service: its three system topics, NOT_TYPE records there; COMMIT records of a prepared
# half into user topics (mqstore.txn.records.check_internal_append).
TRANSACTION = WriterRules(
    topic_rules.OWNER_TRANSACTION, topic_rules.OWNER_DESCRIPTIONS[topic_rules.OWNER_TRANSACTION],
    frozenset({transactions.HALF_TOPIC, transactions.OP_TOPIC, transactions.CHECK_MAX_TOPIC}),
    check=functools.partial(transactions.check_internal_append, writer=topic_rules.OWNER_TRANSACTION))
# The delayed-message scheduler: its system topic only, NOT_TYPE records.
SCHEDULE = WriterRules(
    topic_rules.OWNER_SCHEDULE, topic_rules.OWNER_DESCRIPTIONS[topic_rules.OWNER_SCHEDULE],
    frozenset({topic_rules.SCHEDULE_TOPIC}),
    check=functools.partial(transactions.check_internal_append, writer=topic_rules.OWNER_SCHEDULE))

ALL = (pop_copies.RULES, relayed.RULES, TRANSACTION, SCHEDULE)
for _rules in ALL:
    SYSTEM_WRITERS.register(_rules)
