"""The transactions the service knows: open ones and the resolved ones it still remembers, kept in step
with the log (the follower's projection, projection.py) and with the service's own writes.

States (txn.proto has the contract):

  state        how it is entered                                       leaves to
  ------------ ------------------------------------------------------- -------------------------------
  PREPARING    a Prepare reserved the id (atomically: a second Prepare  OPEN (halves appended), or the
               of a live id never merges into it)                       id is released (nothing written)
  OPEN         halves appended (or found in the log)                    COMMITTED, ROLLED_BACK, PARKED
  COMMITTED    COMMIT records appended (or found in the log)            final
  ROLLED_BACK  decided by a Rollback; durable once every half has an    final
               OP record (``op_written``)
  PARKED       copies appended to TRANS_CHECK_MAX_TIME_TOPIC           COMMITTED, ROLLED_BACK (operator)

On top of the state, ``Txn.unknown`` names an append whose outcome is unknown (PREPARE, COMMIT or
PARK: the commit log may or may not hold it; mqstore.errors.OutcomeUnknown). While it is set the
transaction takes no decision (callers get UNAVAILABLE) and is not checked back: the in-doubt
resolver (indoubt.py) clears it once the follower has read the log past the end the commit log
reported after the failure. Then the records the follower found decide: a COMMIT record makes it
COMMITTED, a parked copy PARKED, halves OPEN; nothing found means the append did not land (the state
stays, a PREPARING id is released). ``Txn.deciding`` marks a check-back answer being applied, so
that the checker neither checks nor parks the transaction meanwhile.

Halves carry the attempt of the Prepare call that appended them (TRAN_ATTEMPT). Normally a
transaction has one attempt; a second one can only come from a Prepare appended twice (an append whose
outcome the resolver misjudged, or a log written by an older version). The primary attempt is the one
committed, else the one of the lowest half; only its halves are ever committed, checked back or
parked. Every half, of every attempt, gets an OP record once the transaction is COMMITTED or
ROLLED_BACK: a duplicate is rolled back, never committed twice, never left without an OP record.

Thread-safe: ``lock`` guards every map and every Txn's fields, and the waits for OP records (a thread's
or an event loop's, :meth:`TxnTable.op_written_async`, woken by the thread that marks them written). A
Txn's own ``guard`` (a separate lock) serialises the decisions about one transaction (Prepare's end,
Commit, Rollback, check answers, parking, ForceResolve): take ``guard`` first, then ``lock`` for short
reads and writes, never the other way round.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import structlog

from mqstore import waits
from mqstore.errors import ResourceExhausted, invariant

log = structlog.get_logger("mqstore.txn.table")

PREPARING, OPEN, COMMITTED, ROLLED_BACK, PARKED = "PREPARING", "OPEN", "COMMITTED", "ROLLED_BACK", "PARKED"
STATES = (PREPARING, OPEN, COMMITTED, ROLLED_BACK, PARKED)
LIVE_STATES = (PREPARING, OPEN, PARKED)  # counted against max_open_transactions
OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"      # what views show while Txn.unknown is set
PREPARE, COMMIT, PARK = "PREPARE", "COMMIT", "PARK"  # appends whose outcome can be unknown
BY_LOG = "recovery"  # resolved_by of a state learnt from the log (a restart, or the follower ahead of a caller)


@dataclass(slots=True)
class Half:
    physical_offset: int
    queue_offset: int            # in the half topic, queue 0: what OP bodies name
    store_timestamp_ms: int
    uniq_key: str = ""
    real_queue_id: int = 0
    attempt: str = ""            # the Prepare call that appended it ("" in logs of older versions)
    immunity_ms: int = 0         # CHECK_IMMUNITY_TIME_IN_SECONDS of the message, in ms (0 = none)
    op_written: bool = False
    committed: bool = False      # a COMMIT record names it
    op_queued: bool = False      # in memory only: its OP entry is with the OP batcher


@dataclass(eq=False)
class Txn:
    txn_id: str
    group: str
    topic: str
    halves: list[Half] = field(default_factory=list)
    state: str = OPEN
    digest: str = ""             # of the Prepare request (coordinator.request_digest): identical retries
    unknown: str = ""            # PREPARE, COMMIT or PARK: that append's outcome is unknown
    deciding: str = ""           # in memory only: a check answer (COMMIT/ROLLBACK) is being applied
    checks_sent: int = 0
    last_answer: str = ""
    last_check_ms: int = 0
    resolved_by: str = ""
    durability: str = ""         # of the halves' append, when this process made it
    guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def op_written(self) -> bool:
        return all(h.op_written for h in self.halves)

    @property
    def first_store_ms(self) -> int:
        return min(h.store_timestamp_ms for h in self.halves) if self.halves else 0

    @property
    def view_state(self) -> str:
        return OUTCOME_UNKNOWN if self.unknown else self.state

    def primary(self) -> list[Half]:
        """The halves of the primary attempt (the committed one, else the lowest), by physical offset."""
        if not self.halves:
            return []
        committed = [h for h in self.halves if h.committed]
        attempt = (committed[0] if committed else min(self.halves, key=lambda h: h.physical_offset)).attempt
        return sorted((h for h in self.halves if h.attempt == attempt), key=lambda h: h.physical_offset)

    def first_check_after_ms(self, transaction_timeout_ms: int) -> int:
        """Age (store time) before the first check: the largest CHECK_IMMUNITY_TIME_IN_SECONDS of its
        messages, else transaction_timeout_ms (RocketMQ's rule for the check path)."""
        immunity = max((h.immunity_ms for h in self.primary()), default=0)
        return immunity or transaction_timeout_ms


class TxnTable:
    def __init__(self, resolved_keep: int, max_live: int = 1 << 62,
                 on_needs_op: Callable[[Txn, list[Half]], None] = lambda txn, halves: None):
        self.lock = threading.RLock()
        self.resolved_keep, self.max_live = resolved_keep, max_live
        self.on_needs_op = on_needs_op          # called with ``lock`` held
        self.on_ready: list[Callable[[], None]] = []
        self.on_applied: list[Callable[[], None]] = []
        self.by_id: dict[str, Txn] = {}
        self.by_phys: dict[int, Txn] = {}
        self.by_queue_offset: dict[int, tuple[Txn, Half]] = {}
        self._live: set[str] = set()           # ids in LIVE_STATES
        self._resolved: collections.OrderedDict[str, None] = collections.OrderedDict()  # in the order resolved
        self._op_pending: set[str] = set()     # resolved, an OP record still to write (may hold stale ids)
        self._dirty: set[str] = set()          # changed since the last checkpoint (persist.py)
        self._op_waiters: list[tuple[Txn, object]] = []  # op_written_async's (txn, waits.waiter())
        self.applied: int | None = None       # every record below it is applied
        self.target: int | None = None        # the log end seen first after start
        self.standby = ""                      # non-empty: a standby (mqstore.txn.election), never ready; why
        self._ready = threading.Event()

    # ---- reading ---------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def get(self, txn_id: str) -> Txn | None:
        with self.lock:
            return self.by_id.get(txn_id)

    def transactions(self) -> list[Txn]:
        with self.lock:
            return list(self.by_id.values())

    def live(self) -> list[Txn]:
        """PREPARING, OPEN and PARKED transactions."""
        with self.lock:
            return [self.by_id[i] for i in self._live]

    def counts(self) -> dict[str, int]:
        with self.lock:
            out = dict.fromkeys((*STATES, OUTCOME_UNKNOWN), 0)
            for txn in self.by_id.values():
                out[txn.state] += 1
                out[OUTCOME_UNKNOWN] += bool(txn.unknown)
            return out

    # ---- Prepare's reservation -------------------------------------------------------------------------
    def reserve(self, txn_id: str, group: str, topic: str, digest: str) -> tuple[Txn, bool]:
        """The id's transaction and whether this call created it (PREPARING, for the caller to append).
        ResourceExhausted when max_live transactions are live already."""
        with self.lock:
            txn = self.by_id.get(txn_id)
            if txn is not None:
                return txn, False
            if len(self._live) >= self.max_live:
                raise ResourceExhausted(
                    f"{len(self._live)} transactions are open, being prepared or parked: the limit "
                    f"max_open_transactions is {self.max_live}; commit or roll back open ones, resolve parked "
                    f"ones (mqstore txn list / resolve), or raise the limit")
            txn = self.by_id[txn_id] = Txn(txn_id, group, topic, state=PREPARING, digest=digest)
            self._live.add(txn_id)
            self._touch(txn)
            return txn, True

    def prepared(self, txn: Txn, halves: Iterable[Half], durability: str) -> None:
        """PREPARING -> OPEN with the halves this process appended."""
        with self.lock:
            for half in halves:
                self._add_half(txn, half)
            txn.durability = durability
            if txn.state == PREPARING:
                txn.state = OPEN
            self._touch(txn)

    def release(self, txn: Txn) -> None:
        """A Prepare whose halves are not known to be written: the id is free again, unless the follower
        has found halves of it meanwhile (then it is OPEN, as the log says)."""
        with self.lock:
            if txn.state != PREPARING:
                return  # the Prepare got past its append (or the log decided meanwhile): nothing to free
            self._touch(txn)
            if txn.halves:
                txn.state = OPEN
            elif self.by_id.get(txn.txn_id) is txn:
                del self.by_id[txn.txn_id]
                self._live.discard(txn.txn_id)

    # ---- decisions ---------------------------------------------------------------------------------------
    def resolve(self, txn: Txn, state: str, by: str) -> None:
        """OPEN or PARKED -> ``state`` (a resolved state is final; the caller checked)."""
        with self.lock:
            invariant(txn.state in (OPEN, PARKED, PREPARING) or txn.state == state,
                      f"transaction {txn.txn_id} is {txn.state}, cannot become {state}")
            self._touch(txn)
            if txn.state == state:
                if txn.resolved_by == BY_LOG:  # the follower saw our own record first: name who decided
                    txn.resolved_by = by
                return
            txn.state, txn.resolved_by = state, by
            if state != PARKED:
                self._live.discard(txn.txn_id)
                self._resolved[txn.txn_id] = None
                self._op_pending.add(txn.txn_id)
                self._forget_old()

    def committed(self, txn: Txn, halves: Sequence[Half], by: str) -> None:
        """The COMMIT records of ``halves`` (the primary attempt) are appended."""
        with self.lock:
            for half in halves:
                half.committed = True
            self.resolve(txn, COMMITTED, by)

    def mark_unknown(self, txn: Txn, action: str) -> None:
        with self.lock:
            txn.unknown = action
            self._touch(txn)
        log.warning("txn.outcome_unknown", transaction_id=txn.txn_id, action=action,
                    why="the append failed in a way that does not prove nothing was written; no new decision "
                        "until the log has been read past its end")

    def settle_unknown(self, txn: Txn, action: str) -> None:
        """The follower has read the log past the end seen after the failed ``action``: what it found
        decided already (landed); what is still unknown did not land."""
        with self.lock:
            if txn.unknown != action:
                return
            txn.unknown = ""
            self._touch(txn)
            if action == PREPARE and txn.state == PREPARING:
                self.release(txn)
            state = txn.state
        log.info("txn.outcome_settled", transaction_id=txn.txn_id, action=action, state=state,
                 why="the log has been read past the end it had after the failure: what it holds decided")

    def note_check(self, txn: Txn, now_ms: int) -> bool:
        """Count a check sent, if the transaction is still a check candidate (under ``lock``)."""
        with self.lock:
            if txn.state != OPEN or txn.unknown or txn.deciding:
                return False
            txn.checks_sent += 1
            txn.last_check_ms = now_ms
            self._touch(txn)
            return True

    def note_answer(self, txn: Txn, decision: str, deciding: bool) -> None:
        """A check answer arrived: recorded; COMMIT/ROLLBACK stop further checks at once (``deciding``)."""
        with self.lock:
            txn.last_answer = decision
            if deciding:
                txn.deciding = decision
            self._touch(txn)

    def done_deciding(self, txn: Txn) -> None:
        with self.lock:
            txn.deciding = ""

    # ---- OP records --------------------------------------------------------------------------------------
    def halves_needing_op(self, txn: Txn) -> list[Half]:
        """Halves of a COMMITTED or ROLLED_BACK transaction without an OP record or a queued one; marked
        queued (under ``lock``)."""
        with self.lock:
            if txn.state not in (COMMITTED, ROLLED_BACK):
                return []
            halves = [h for h in txn.halves if not h.op_written and not h.op_queued]
            for half in halves:
                half.op_queued = True
            return halves

    def mark_op_written(self, half_queue_offsets: Sequence[int]) -> None:
        woken: list[tuple[Txn, object]] = []
        with self.lock:
            for offset in half_queue_offsets:
                found = self.by_queue_offset.get(offset)
                if found is not None and not found[1].op_written:
                    found[1].op_written = True
                    self._touch(found[0])
                    if found[0].op_written:
                        self._op_pending.discard(found[0].txn_id)
            self._forget_old()
            if self._op_waiters:
                woken = [w for w in self._op_waiters if w[0].op_written]
                if woken:
                    self._op_waiters = [w for w in self._op_waiters if not w[0].op_written]
        if woken:
            waits.wake([waiter for _, waiter in woken])

    def requeue_op(self, half_queue_offsets: Sequence[int]) -> list[int]:
        """Of OP entries whose append's outcome was unknown, those the log does not hold (the follower
        has read past the failure): marked not queued, returned for the OP batcher to add again."""
        with self.lock:
            out = []
            for offset in half_queue_offsets:
                found = self.by_queue_offset.get(offset)
                if found is not None and not found[1].op_written:
                    found[1].op_queued = False
                    out.append(offset)
            return out

    async def op_written_async(self, txn: Txn, timeout_s: float) -> bool:
        """Until every half of ``txn`` has its OP record (True), or ``timeout_s`` has passed (False). Run on a
        thread (mqstore.waits.blocking) the thread waits, under ``waiting()``; on an event loop the coroutine
        suspends; either way :meth:`mark_op_written` (the OP writer's thread, or the follower's) wakes it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                if txn.op_written:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                waiter = waits.waiter()
                self._op_waiters.append((txn, waiter))
            try:
                await waiter.wait(left)
            finally:
                with self.lock:
                    self._op_waiters = [w for w in self._op_waiters if w[1] is not waiter]

    # ---- the checkpoint's view -------------------------------------------------------------------------
    def undone(self) -> list[Txn]:
        """Every transaction not fully done: live, or resolved with an OP record still to write (under
        ``lock``). Costs what it returns, not what the table remembers (resolved_keep)."""
        with self.lock:
            out = [self.by_id[i] for i in self._live]
            for txn_id in self._op_pending:
                txn = self.by_id.get(txn_id)
                if txn is not None and txn.state in (COMMITTED, ROLLED_BACK) and not txn.op_written:
                    out.append(txn)
            return out

    def newest_done(self, count: int) -> list[Txn]:
        """The ``count`` most recently resolved transactions whose OP records are all written, newest first
        (under ``lock``)."""
        with self.lock:
            out: list[Txn] = []
            for txn_id in reversed(self._resolved):
                if len(out) >= count:
                    break
                txn = self.by_id.get(txn_id)
                if txn is not None and txn.state in (COMMITTED, ROLLED_BACK) and txn.op_written:
                    out.append(txn)
            return out

    def take_dirty(self) -> list[Txn]:
        """The transactions changed since the last call (under ``lock``); clears the set."""
        with self.lock:
            out = [self.by_id[i] for i in self._dirty if i in self.by_id]
            self._dirty.clear()
            return out

    def restore(self, txn: Txn) -> None:
        """Put a transaction read from the checkpoint (empty table, before the follower starts)."""
        with self.lock:
            old = self.by_id.get(txn.txn_id)
            if old is not None:
                self._drop(old)
            self.by_id[txn.txn_id] = txn
            for half in txn.halves:
                self.by_phys[half.physical_offset] = txn
                self.by_queue_offset[half.queue_offset] = (txn, half)
            if txn.state in LIVE_STATES:
                self._live.add(txn.txn_id)
            else:
                self._resolved[txn.txn_id] = None
                if not txn.op_written:
                    self._op_pending.add(txn.txn_id)

    # ---- the projection's primitives (projection.py, under ``lock``) --------------------------------------
    def learn_half(self, txn_id: str, group: str, topic: str, digest: str, half: Half) -> Txn:
        """A half record from the log; idempotent by physical offset."""
        with self.lock:
            known = self.by_phys.get(half.physical_offset)
            if known is not None:
                return known
            txn = self.by_id.get(txn_id)
            if txn is None:
                txn = self.by_id[txn_id] = Txn(txn_id, group, topic, digest=digest)
                self._live.add(txn_id)
            txn.digest = txn.digest or digest
            self._add_half(txn, half)
            if txn.state == PREPARING and txn.unknown == PREPARE:
                txn.state, txn.unknown = OPEN, ""  # the in-doubt Prepare landed
            if txn.state in (COMMITTED, ROLLED_BACK) and self.ready:
                self.need_op(txn)  # a duplicate attempt of a decided transaction: rolled back by its OP
            self._touch(txn)
            return txn

    def need_op(self, txn: Txn) -> None:
        halves = self.halves_needing_op(txn)
        if halves:
            self.on_needs_op(txn, halves)

    def set_applied(self, next_physical_offset: int, log_end: int) -> None:
        with self.lock:
            if self.target is None:
                self.target = log_end
            self.applied = next_physical_offset
            self._forget_old()  # those the follower has just passed may go now
            became_ready = self._become_ready_locked()
        if became_ready:
            self._ready_now()
        for listener in self.on_applied:
            listener()

    def _become_ready_locked(self) -> bool:
        became_ready = (not self._ready.is_set() and not self.standby and self.applied is not None
                        and self.target is not None and self.applied >= self.target)
        if became_ready:
            for txn in list(self.by_id.values()):  # caught up: every missing OP record now
                self.need_op(txn)
            self._ready.set()
        return became_ready

    def _ready_now(self) -> None:
        log.info("txn.recovered", applied_physical_offset=self.applied, transactions=len(self.by_id))
        for listener in self.on_ready:
            listener()

    def activate(self, log_end: int) -> None:
        """A standby won the election (mqstore.txn.election): ready once the follower has applied the log up to
        ``log_end`` (everything the old active acknowledged), as after a start."""
        with self.lock:
            self.standby = ""
            self.target = max(self.target or 0, log_end)
            became_ready = self._become_ready_locked()
        if became_ready:
            self._ready_now()
        else:
            for listener in self.on_ready:  # health: "recovering" until caught up
                listener()

    def deactivate(self, why: str) -> None:
        """Back to standby (lost the election): not ready, ``why`` is the refusal's text."""
        with self.lock:
            self.standby = why
            self._ready.clear()
        for listener in self.on_ready:
            listener()

    def _add_half(self, txn: Txn, half: Half) -> None:
        if half.physical_offset in self.by_phys:
            return
        txn.halves.append(half)
        self.by_phys[half.physical_offset] = txn
        self.by_queue_offset[half.queue_offset] = (txn, half)
        if txn.state in (COMMITTED, ROLLED_BACK) and not half.op_written:  # a duplicate attempt's half
            self._op_pending.add(txn.txn_id)

    def _touch(self, txn: Txn) -> None:
        self._dirty.add(txn.txn_id)

    def _drop(self, txn: Txn) -> None:
        del self.by_id[txn.txn_id]
        self._live.discard(txn.txn_id)
        self._op_pending.discard(txn.txn_id)
        for half in txn.halves:
            self.by_phys.pop(half.physical_offset, None)
            self.by_queue_offset.pop(half.queue_offset, None)

    def _forget_old(self) -> None:
        """Drop the eldest resolved transactions beyond ``resolved_keep`` once their OP records are written
        and the follower has passed their records (else it would bring them back as OPEN)."""
        while len(self._resolved) > self.resolved_keep:
            txn_id = next(iter(self._resolved))
            txn = self.by_id.get(txn_id)
            if txn is not None and txn.state in (COMMITTED, ROLLED_BACK):
                newest = max((h.physical_offset for h in txn.halves), default=-1)
                if not txn.op_written or self.applied is None or newest >= self.applied:
                    return
                self._drop(txn)
            self._resolved.popitem(last=False)
