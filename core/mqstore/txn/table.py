"""The transactions the service knows: open ones and the resolved ones it still remembers, kept in step
with the log (it is the follower's projection) and with the service's own writes.

Sources of truth, all records of the commit log (mqstore.transactions has their layout):
  half record (half topic)         -> the transaction exists, OPEN, with this half
  COMMIT record (any user topic)   -> its PREPAREDTRANSACTIONOFFSET's transaction is COMMITTED
  parked copy (check-max topic)    -> PARKED
  OP record (op topic)             -> those halves are resolved; a transaction still OPEN then was
                                      rolled back (a commit's COMMIT records always come before its OP)
The coordinator also changes states directly as it writes (the follower lags); applying a record
again, or after the direct change, changes nothing (idempotent by physical offset).

After a start the table is ``ready`` only once the follower has applied the log up to the end it
reported first: until then a COMMIT record written before the crash may not have been seen.

Thread-safe: ``lock`` guards every map and every Txn's fields. A Txn's own ``guard`` (a separate
lock) serialises the decisions about one transaction (Commit, Rollback, check answers, ForceResolve):
take ``guard`` first, then ``lock`` for short reads and writes, never the other way round.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import structlog

from mqstore import transactions as tx
from mqstore.errors import invariant
from mqstore.format import record, record_reader
from mqstore.model import TailFrame

from .opbatch import parse_body

log = structlog.get_logger("mqstore.txn.table")

OPEN, COMMITTED, ROLLED_BACK, PARKED = "OPEN", "COMMITTED", "ROLLED_BACK", "PARKED"
STATES = (OPEN, COMMITTED, ROLLED_BACK, PARKED)
BY_LOG = "recovery"  # resolved_by of a state learnt from the log (a restart, or the follower ahead of a caller)


@dataclass(slots=True)
class Half:
    physical_offset: int
    queue_offset: int            # in the half topic, queue 0: what OP bodies name
    store_timestamp_ms: int
    op_written: bool = False


@dataclass(eq=False)
class Txn:
    txn_id: str
    group: str
    topic: str
    halves: list[Half] = field(default_factory=list)
    state: str = OPEN
    checks_sent: int = 0
    last_answer: str = ""
    last_check_ms: int = 0
    resolved_by: str = ""
    op_queued: bool = False      # in memory only: OP entries handed to the OP batcher
    guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def op_written(self) -> bool:
        return all(h.op_written for h in self.halves)

    @property
    def first_store_ms(self) -> int:
        return min(h.store_timestamp_ms for h in self.halves) if self.halves else 0


@dataclass(frozen=True, slots=True)
class Damaged:
    start_physical_offset: int
    end_physical_offset: int
    reason: str


class TxnTable:
    def __init__(self, resolved_keep: int, on_needs_op: Callable[[Txn], None] = lambda txn: None):
        self.lock = threading.RLock()
        self.resolved_keep = resolved_keep
        self.on_needs_op = on_needs_op
        self.by_id: dict[str, Txn] = {}
        self.by_phys: dict[int, Txn] = {}
        self.by_queue_offset: dict[int, Txn] = {}
        self._resolved: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.applied: int | None = None       # every record below it is applied
        self.target: int | None = None        # the log end seen first after start
        self._ready = threading.Event()

    # ---- the coordinator's view -----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def get(self, txn_id: str) -> Txn | None:
        with self.lock:
            return self.by_id.get(txn_id)

    def add_halves(self, txn_id: str, group: str, topic: str, halves: Iterable[Half]) -> Txn:
        with self.lock:
            txn = self.by_id.get(txn_id)
            if txn is None:
                txn = self.by_id[txn_id] = Txn(txn_id, group, topic)
            for half in halves:
                if half.physical_offset not in self.by_phys:
                    txn.halves.append(half)
                    self.by_phys[half.physical_offset] = txn
                    self.by_queue_offset[half.queue_offset] = txn
            return txn

    def resolve(self, txn: Txn, state: str, by: str) -> None:
        """OPEN -> ``state`` (a resolved state is final; the caller checked)."""
        with self.lock:
            invariant(txn.state in (OPEN, PARKED) or txn.state == state,
                      f"transaction {txn.txn_id} is {txn.state}, cannot become {state}")
            if txn.state == state:
                if txn.resolved_by == BY_LOG:  # the follower saw our own record first: name who decided
                    txn.resolved_by = by
                return
            txn.state, txn.resolved_by = state, by
            if state != PARKED:
                self._resolved[txn.txn_id] = None
                self._forget_old()

    def mark_op_written(self, half_queue_offsets: Sequence[int]) -> None:
        with self.lock:
            for offset in half_queue_offsets:
                txn = self.by_queue_offset.get(offset)
                if txn is not None:
                    for half in txn.halves:
                        if half.queue_offset == offset:
                            half.op_written = True
            self._forget_old()

    def transactions(self) -> list[Txn]:
        with self.lock:
            return list(self.by_id.values())

    def counts(self) -> dict[str, int]:
        with self.lock:
            out = dict.fromkeys(STATES, 0)
            for txn in self.by_id.values():
                out[txn.state] += 1
            return out

    def _forget_old(self) -> None:
        """Drop the eldest resolved transactions beyond ``resolved_keep`` once their OP records are written
        and the follower has passed their records (else it would bring them back as OPEN)."""
        while len(self._resolved) > self.resolved_keep:
            txn = self.by_id.get(next(iter(self._resolved)))
            if txn is not None:
                newest = max((h.physical_offset for h in txn.halves), default=-1)
                if not txn.op_written or self.applied is None or newest >= self.applied:
                    return
                del self.by_id[txn.txn_id]
                for half in txn.halves:
                    self.by_phys.pop(half.physical_offset, None)
                    self.by_queue_offset.pop(half.queue_offset, None)
            self._resolved.popitem(last=False)

    # ---- the follower's projection --------------------------------------------------------------------
    def resume_offset(self) -> int | None:
        with self.lock:
            return self.applied

    def apply(self, frame: TailFrame) -> Sequence[Damaged]:
        damaged = []
        with self.lock:
            if self.target is None:
                self.target = frame.log_end_physical_offset
            for view in _records(frame, damaged):
                self._apply_record(view)
            self.applied = frame.next_physical_offset
            became_ready = not self._ready.is_set() and self.applied >= self.target
        if became_ready:
            self._on_ready()
        return damaged

    def _apply_record(self, view: record_reader.RecordView) -> None:
        topic = view.topic
        if view.tx_type == record.SYSFLAG_TX_COMMIT:
            txn = self.by_phys.get(view.prepared_transaction_offset)
            if txn is not None and txn.state != COMMITTED:
                if txn.state == ROLLED_BACK:
                    log.error("txn.commit_after_rollback_in_log", transaction_id=txn.txn_id,
                              physical_offset=view.physical_offset)
                    return
                self._resolved_by_log(txn, COMMITTED)
        elif topic == tx.HALF_TOPIC:
            if view.physical_offset not in self.by_phys:
                self.add_halves(view.property(tx.PROPERTY_TRANSACTION_ID) or f"?{view.physical_offset}",
                                view.property(tx.PROPERTY_PRODUCER_GROUP) or "",
                                view.property(record.PROPERTY_REAL_TOPIC) or "",
                                [Half(view.physical_offset, view.queue_offset, view.store_timestamp_ms)])
        elif topic == tx.OP_TOPIC:
            offsets = parse_body(view.body)
            for offset in offsets:
                txn = self.by_queue_offset.get(offset)
                if txn is not None and txn.state == OPEN:
                    self._resolved_by_log(txn, ROLLED_BACK)
            self.mark_op_written(offsets)
        elif topic == tx.CHECK_MAX_TOPIC:
            txn = self.by_id.get(view.property(tx.PROPERTY_TRANSACTION_ID) or "")
            if txn is not None and txn.state == OPEN:
                self._resolved_by_log(txn, PARKED)

    def _resolved_by_log(self, txn: Txn, state: str) -> None:
        self.resolve(txn, state, txn.resolved_by or BY_LOG)
        if self._ready.is_set() and state != PARKED:
            self._need_op(txn)

    def _need_op(self, txn: Txn) -> None:
        if not txn.op_queued and not txn.op_written and txn.state in (COMMITTED, ROLLED_BACK):
            txn.op_queued = True
            self.on_needs_op(txn)

    def _on_ready(self) -> None:
        """Caught up: every resolved transaction whose OP record is missing gets it now."""
        with self.lock:
            for txn in list(self.by_id.values()):
                self._need_op(txn)
            self._ready.set()
        log.info("txn.recovered", applied_physical_offset=self.applied, transactions=len(self.by_id))


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
