"""Prepare, Commit, Rollback and ForceResolve: the transaction state machine (txn.proto states when each
answer is durable and what a crash at each step means).

  Prepare   check -> choose the real queue (as the commit log would) -> append the halves (batched with
            other producers') -> [txn.prepare.after_half] -> OPEN in the table, halves cached -> answer
  Commit    guard -> halves from the cache, else the log -> append the real messages, one Append ->
            [txn.commit.after_real] -> COMMITTED -> OP entries queued -> answer
  Rollback  guard -> ROLLED_BACK -> OP entries queued -> wait until the OP record is durable -> answer

Thread-safe: a transaction's decisions are serialised by its ``guard`` (TxnTable); the table, the cache,
the appender and the OP batcher are thread-safe themselves.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol, Sequence

import structlog

from mqstore import failpoints, javahash
from mqstore import topics as topic_rules
from mqstore import transactions as tx
from mqstore.clock import Clock
from mqstore.errors import AlreadyExists, DataLoss, FailedPrecondition, InvalidArgument, NotFound, Unavailable, shown
from mqstore.format import record
from mqstore.model import AppendResult, MessageIn, StoredMessage, TopicRecord, MessageLookup

from .cache import HalfCache
from .config import TxnConfig
from .table import COMMITTED, PARKED, ROLLED_BACK, Half, Txn, TxnTable

log = structlog.get_logger("mqstore.txn.coordinator")
_TXN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
TOPIC_INFO_TTL_S = 5.0      # queue counts may grow: topic facts are asked again after this
MAX_MESSAGES = 1000


class LogReader(Protocol):
    def topic(self, name: str) -> TopicRecord: ...

    def get_messages_batch(self, physical_offsets: Sequence[int]) -> list[MessageLookup]: ...


class Appender(Protocol):
    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]: ...


class OpQueue(Protocol):
    def add(self, half_queue_offsets: Sequence[int]) -> int: ...

    def wait_written(self, seq: int, timeout_s: float) -> None: ...


@dataclass(frozen=True)
class Prepared:
    transaction_id: str
    results: list[AppendResult]
    real_queue_ids: list[int]


@dataclass(frozen=True)
class Ended:
    state: str
    already: bool
    results: list[AppendResult]


class Coordinator:
    def __init__(self, config: TxnConfig, table: TxnTable, log_reader: LogReader, appender: Appender,
                 ops: OpQueue, cache: HalfCache[MessageIn], clock: Clock):
        self.config, self.table, self.log_reader, self.appender = config, table, log_reader, appender
        self.ops, self.cache, self.clock = ops, cache, clock
        self._topics: dict[str, tuple[TopicRecord, float]] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._lock = threading.Lock()  # the two dicts above
        self._op_seq: dict[str, int] = {}
        self.halves_written = 0
        table.on_needs_op = self._queue_op_locked

    # ---- Prepare --------------------------------------------------------------------------------------
    def prepare(self, topic: str, messages: Sequence[MessageIn], group: str, txn_id: str = "") -> Prepared:
        self.check_ready()
        topic_rules.validate_topic_name(topic)
        topic_rules.validate_group_name(group)
        if not 1 <= len(messages) <= MAX_MESSAGES:
            raise InvalidArgument(f"messages: give 1 to {MAX_MESSAGES} messages, not {len(messages)}")
        for index, m in enumerate(messages):
            tx.check_message_properties(index, m.properties)
        txn_id = txn_id or uuid.uuid4().hex
        if not _TXN_ID.match(txn_id):
            raise InvalidArgument(f"transaction_id {shown(txn_id)}: use 1 to 128 of A-Z a-z 0-9 _ . : -")
        if self.table.get(txn_id) is not None:
            raise AlreadyExists(f"transaction {txn_id} exists already; give a new id or none (one is generated)")
        real = self._topic(topic)
        tx.check_real_topic(real)
        qids = self._queues(real, messages)
        halves = [_half_message(m, topic, qid, group, txn_id) for m, qid in zip(messages, qids, strict=True)]
        results = self.appender.append(tx.HALF_TOPIC, halves)
        failpoints.hit("txn.prepare.after_half")
        self.table.add_halves(txn_id, group, topic, [Half(r.physical_offset, r.queue_offset, r.store_timestamp_ms)
                                                     for r in results])
        for m, qid, r in zip(messages, qids, results, strict=True):
            self.cache.put(r.physical_offset, _real_from_input(m, qid, group, txn_id, r), len(m.body))
        with self._lock:
            self.halves_written += len(results)
        return Prepared(txn_id, results, qids)

    def _topic(self, name: str) -> TopicRecord:
        now = time.monotonic()
        with self._lock:
            cached = self._topics.get(name)
        if cached is not None and now - cached[1] < TOPIC_INFO_TTL_S:
            return cached[0]
        topic = self.log_reader.topic(name)
        with self._lock:
            self._topics[name] = (topic, now)
        return topic

    def _queues(self, topic: TopicRecord, messages: Sequence[MessageIn]) -> list[int]:
        """The queue a non-transactional send would get: queue_id, else the sharding key's hash, else
        round robin (this service's own counter per topic)."""
        out = []
        for index, m in enumerate(messages):
            if m.queue_id is not None:
                if not 0 <= m.queue_id < topic.queue_count:
                    raise InvalidArgument(f"messages[{index}].queue_id {m.queue_id} is outside [0, "
                                          f"{topic.queue_count}) for topic {topic.name}")
                out.append(m.queue_id)
            elif m.sharding_key:
                out.append(javahash.java_string_hash(m.sharding_key) % topic.queue_count)
            else:
                with self._lock:
                    counter = self._round_robin.setdefault(topic.name, itertools.count())
                    out.append(next(counter) % topic.queue_count)
        return out

    # ---- Commit / Rollback ----------------------------------------------------------------------------
    def commit(self, txn_id: str, by: str = "producer") -> Ended:
        self.check_ready()
        txn = self.txn(txn_id)
        with txn.guard:
            if txn.state == COMMITTED:
                return Ended(COMMITTED, True, [])
            if txn.state == ROLLED_BACK or (txn.state == PARKED and not by.startswith("operator")):
                raise FailedPrecondition(f"transaction {txn_id} is {txn.state}: it cannot be committed"
                                         + (" (an operator may, with ForceResolve)" if txn.state == PARKED else ""))
            messages = self._real_messages(txn)
            results = self.appender.append(txn.topic, messages)
            failpoints.hit("txn.commit.after_real")
            self.table.resolve(txn, COMMITTED, by)
            self._queue_op(txn)
        log.debug("txn.committed", transaction_id=txn_id, messages=len(results), by=by)
        return Ended(COMMITTED, False, results)

    def rollback(self, txn_id: str, by: str = "producer") -> Ended:
        self.check_ready()
        txn = self.txn(txn_id)
        with txn.guard:
            if txn.state == COMMITTED:
                raise FailedPrecondition(f"transaction {txn_id} is COMMITTED: it cannot be rolled back")
            if txn.state == PARKED and not by.startswith("operator"):
                raise FailedPrecondition(f"transaction {txn_id} is PARKED: only an operator may resolve it "
                                         f"(ForceResolve)")
            already = txn.state == ROLLED_BACK
            if not already:
                for half in txn.halves:
                    self.cache.take(half.physical_offset)  # a hit removes the entry; the body is not needed
                self.table.resolve(txn, ROLLED_BACK, by)
                self._queue_op(txn)
            with self.table.lock:
                seq = self._op_seq.get(txn_id, 0)
        if seq and not txn.op_written:
            self.ops.wait_written(seq, self.config.op_batch_interval_ms / 1000 + 10)
        return Ended(ROLLED_BACK, already, [])

    def _real_messages(self, txn: Txn) -> list[MessageIn]:
        """One COMMIT message per half: from the cache (a hit removes it), the misses from the log."""
        found = {h.physical_offset: self.cache.take(h.physical_offset) for h in txn.halves}
        missing = [offset for offset, m in found.items() if m is None]
        if missing:
            for offset, lookup in zip(missing, self.log_reader.get_messages_batch(missing), strict=True):
                if lookup.message is None:
                    raise DataLoss(f"half message of transaction {txn.txn_id} at physical offset {offset} cannot be "
                                   f"read: {lookup.missing}; nothing was committed")
                found[offset] = _real_from_half(lookup.message)
        return [found[h.physical_offset] for h in sorted(txn.halves, key=lambda h: h.physical_offset)]

    def _queue_op(self, txn: Txn) -> None:
        with self.table.lock:
            if not txn.op_queued and not txn.op_written:
                txn.op_queued = True
                self._queue_op_locked(txn)

    def _queue_op_locked(self, txn: Txn) -> None:
        """Called with the table's lock held (also by the table itself, for resolutions found in the log)."""
        self._op_seq[txn.txn_id] = self.ops.add([h.queue_offset for h in txn.halves if not h.op_written])

    def txn(self, txn_id: str) -> Txn:
        if not txn_id:
            raise InvalidArgument("transaction_id is empty")
        txn = self.table.get(txn_id)
        if txn is None:
            raise NotFound(f"transaction {shown(txn_id)} is unknown (never prepared here, or resolved long ago: the "
                           f"service remembers the last {self.config.resolved_keep} resolved ones)")
        return txn

    def check_ready(self) -> None:
        if not self.table.ready:
            raise Unavailable("recovering: the Transaction service is reading the log up to the end it saw at "
                              "start (it cannot tell yet what was committed); retry shortly")


def _half_message(m: MessageIn, topic: str, qid: int, group: str, txn_id: str) -> MessageIn:
    props = dict(m.properties)
    props.update({record.PROPERTY_REAL_TOPIC: topic, record.PROPERTY_REAL_QUEUE_ID: str(qid),
                  tx.PROPERTY_TRAN_MSG: "true", tx.PROPERTY_PRODUCER_GROUP: group, tx.PROPERTY_TRANSACTION_ID: txn_id})
    return MessageIn(m.body, m.tags, m.keys, props, m.flag, m.born_timestamp_ms, 0, "", m.born_host, m.born_port)


def _real_from_input(m: MessageIn, qid: int, group: str, txn_id: str, half: AppendResult) -> MessageIn:
    props = dict(m.properties)
    props.update({tx.PROPERTY_PRODUCER_GROUP: group, tx.PROPERTY_TRANSACTION_ID: txn_id,
                  record.PROPERTY_UNIQ_KEY: half.uniq_key})
    born = m.born_timestamp_ms or half.store_timestamp_ms  # what the half record holds
    return MessageIn(m.body, m.tags, m.keys, props, m.flag, born, qid, "", m.born_host, m.born_port,
                     record.SYSFLAG_TX_COMMIT, half.physical_offset)


def _real_from_half(half: StoredMessage) -> MessageIn:
    r = half.record
    props = {k: v for k, v in r.properties.items()
             if k not in (record.PROPERTY_REAL_TOPIC, record.PROPERTY_REAL_QUEUE_ID, tx.PROPERTY_TRAN_MSG)}
    real_qid = r.properties.get(record.PROPERTY_REAL_QUEUE_ID, "")
    if not real_qid.isdigit():
        raise DataLoss(f"half message at physical offset {r.physical_offset} has no valid REAL_QID ({real_qid!r})")
    return MessageIn(r.body, "", (), props, r.flag, r.born_timestamp_ms, int(real_qid), "", r.born_host, r.born_port,
                     record.SYSFLAG_TX_COMMIT, r.physical_offset)
