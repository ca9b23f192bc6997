"""The table as the follower's projection of the log (mqstore.follow.Projection): Tail frames of the
transaction topics and every COMMIT record -> TxnTable.

  record (records.py)                 what it tells the table
  ----------------------------------- --------------------------------------------------------------------
  half record (half topic)            the transaction exists (OPEN unless known), with this half of its
                                      attempt; an in-doubt Prepare landed
  COMMIT record (any user topic)      its PREPAREDTRANSACTIONOFFSET's half is committed: COMMITTED
  OP record (op topic)                those halves are resolved; a transaction still OPEN or PARKED then was
                                      rolled back (a commit's COMMIT records always come before its OP,
                                      and an operator's rollback of a parked one after its parked copy)
  parked copy (check-max topic)       PARKED

Applying a record again, or after the coordinator's own change, changes nothing (idempotent by
physical offset). After a start the table is ``ready`` only once the follower has applied the log up
to the end it reported first: until then a COMMIT record written before the crash may not have been
seen. Called from the follower's thread only (TxnTable's lock guards the maps).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import structlog

from mqstore.follow import FollowConfig, Follower, GapPolicy, TailSource
from mqstore.format import record, record_reader
from mqstore.model import TailFrame

from . import records as tx
from .opbatch import parse_body
from .table import BY_LOG, COMMIT, COMMITTED, OPEN, PARK, PARKED, PREPARING, ROLLED_BACK, Half, Txn, TxnTable

log = structlog.get_logger("mqstore.txn.projection")


def txn_follower(table: TxnTable, source: TailSource, config: FollowConfig) -> Follower:
    """The table's follower. GapPolicy.STOP: records retention deleted before they were applied cannot be
    rebuilt (a COMMIT record missed would let a transaction be committed twice), so the follower stays and
    reports it."""
    return Follower("txn-follower", source, TxnProjection(table), config, gap_policy=GapPolicy.STOP)


class Damaged:
    __slots__ = ("start_physical_offset", "end_physical_offset", "reason")

    def __init__(self, start: int, end: int, reason: str):
        self.start_physical_offset, self.end_physical_offset, self.reason = start, end, reason


class TxnProjection:
    def __init__(self, table: TxnTable):
        self.table = table

    def resume_offset(self) -> int | None:
        with self.table.lock:
            return self.table.applied

    def apply(self, frame: TailFrame) -> Sequence[Damaged]:
        damaged: list[Damaged] = []
        with self.table.lock:
            for view in _records(frame, damaged):
                self._apply_record(view)
        self.table.set_applied(frame.next_physical_offset, frame.log_end_physical_offset)
        return damaged

    def _apply_record(self, view: record_reader.RecordView) -> None:
        topic = view.topic
        if view.tx_type == record.SYSFLAG_TX_COMMIT:
            self._commit_record(view)
        elif topic == tx.HALF_TOPIC:
            props = view.properties  # decoded once: a find per property cost ~20 us more a half (8 of them)
            self.table.learn_half(props.get(tx.PROPERTY_TRANSACTION_ID) or f"?{view.physical_offset}",
                                  props.get(tx.PROPERTY_PRODUCER_GROUP, ""), props.get(record.PROPERTY_REAL_TOPIC, ""),
                                  props.get(tx.PROPERTY_DIGEST, ""), half_of(view, props))
        elif topic == tx.OP_TOPIC:
            offsets = parse_body(view.body)
            for offset in offsets:
                found = self.table.by_queue_offset.get(offset)
                if found is not None and found[0].state in (OPEN, PARKED, PREPARING):
                    self._resolved_by_log(found[0], ROLLED_BACK)
            self.table.mark_op_written(offsets)
        elif topic == tx.CHECK_MAX_TOPIC:
            txn = self.table.by_id.get(view.property(tx.PROPERTY_TRANSACTION_ID) or "")
            if txn is not None and txn.state == OPEN:
                self._resolved_by_log(txn, PARKED)
            if txn is not None and txn.unknown == PARK:
                txn.unknown = ""

    def _commit_record(self, view: record_reader.RecordView) -> None:
        txn = self.table.by_phys.get(view.prepared_transaction_offset)
        if txn is None:
            return
        for half in txn.halves:
            if half.physical_offset == view.prepared_transaction_offset:
                half.committed = True
        if txn.unknown == COMMIT:
            txn.unknown = ""  # the in-doubt commit landed
        if txn.state == ROLLED_BACK:
            log.error("txn.commit_after_rollback_in_log", transaction_id=txn.txn_id,
                      physical_offset=view.physical_offset)
        elif txn.state != COMMITTED:
            self._resolved_by_log(txn, COMMITTED)

    def _resolved_by_log(self, txn: Txn, state: str) -> None:
        self.table.resolve(txn, state, txn.resolved_by or BY_LOG)
        if self.table.ready:
            self.table.need_op(txn)


def half_of(view: record_reader.RecordView, props: dict[str, str] | None = None) -> Half:
    """The table's Half of a half record (properties as mqstore.txn.records writes them; ``props``: the
    record's properties, decoded already)."""
    if props is None:
        props = view.properties
    real_qid = props.get(record.PROPERTY_REAL_QUEUE_ID, "")
    return Half(view.physical_offset, view.queue_offset, view.store_timestamp_ms,
                uniq_key=props.get(record.PROPERTY_UNIQ_KEY, ""),
                real_queue_id=int(real_qid) if real_qid.isascii() and real_qid.isdigit() else 0,
                attempt=props.get(tx.PROPERTY_ATTEMPT, ""),
                immunity_ms=tx.immunity_ms(props.get(tx.PROPERTY_CHECK_IMMUNITY, "")))


def _records(frame: TailFrame, damaged: list) -> Iterable[record_reader.RecordView]:
    """The sound records of a (filtered) frame; a record failing its checks is skipped and reported."""
    data, position = frame.records, 0
    base = frame.next_physical_offset - len(data)  # exact only for a contiguous frame: for the report
    while position < len(data):
        try:
            size = record_reader.check(data, position, len(data), verify_crc=True)
        except record_reader.RecordError as exc:
            try:
                size = record_reader.check(data, position, len(data), verify_crc=False)
            except record_reader.RecordError:
                size = len(data) - position  # the rest cannot be walked
            damaged.append(Damaged(base + position, base + position + size, str(exc)))
            position += size
            continue
        if record_reader.is_blank(data, position):
            return
        yield record_reader.RecordView(data, position)
        position += size
