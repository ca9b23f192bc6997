"""Prepare, Commit, Rollback and ForceResolve: the transaction state machine (txn.proto states when each
answer is durable and what a crash at each step means; table.py the states).

  Prepare   check -> reserve the id (PREPARING, atomic: a live id is refused, or an identical retry gets
            the first answer) -> choose the real queue (as the commit log would) -> append the halves
            (batched with other producers') -> [txn.prepare.after_half] -> OPEN, halves cached -> answer
  Commit    guard -> halves of the primary attempt from the cache, else the log -> [txn.commit.before_real]
            -> append the real messages, one Append -> [txn.commit.after_real] -> COMMITTED -> OP entries
            queued -> answer
  Rollback  guard -> ROLLED_BACK -> OP entries queued -> wait until every half's OP record is written
            -> answer

An append that fails with OutcomeUnknown (it may have landed) leaves the transaction OUTCOME_UNKNOWN
(Txn.unknown) and is handed to the in-doubt resolver; until it has settled, Prepare of that id,
Commit and Rollback answer UNAVAILABLE, and then a retry answers from what the log holds (``already``
for a commit that landed). An append that failed for sure changes nothing (a reserved id is released).

Thread-safe: a transaction's decisions are serialised by its ``guard`` (TxnTable); the table, the cache,
the appender and the OP batcher are thread-safe themselves.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import threading
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Protocol, Sequence, TypeVar

import structlog

from mqstore import failpoints, javahash, waits
from mqstore import topics as topic_rules
from mqstore.clock import Clock
from mqstore.errors import (AlreadyExists, DataLoss, FailedPrecondition, InvalidArgument, NotFound, NotWritten,
                            OutcomeUnknown, PermissionDenied, Unavailable, shown)
from mqstore.format import record
from mqstore.model import DURABILITY_WRITTEN, AppendResult, MessageIn, MessageLookup, StoredMessage, TopicRecord

from . import records as tx
from .cache import HalfCache
from .config import TxnConfig
from .table import COMMIT, COMMITTED, PARKED, PREPARE, PREPARING, ROLLED_BACK, Half, Txn, TxnTable

log = structlog.get_logger("mqstore.txn.coordinator")
_TXN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
TOPIC_INFO_TTL_S = 5.0      # queue counts may grow: topic facts are asked again after this
MAX_MESSAGES = 1000


class _Ids:
    """Unguessable, unique ids without a system call each: BLAKE2b keyed with 32 random bytes drawn once per
    process, over a counter. ``uuid.uuid4`` draws from the kernel for every id, and ``os.urandom`` lets go of
    the GIL around the call: in a server whose threads are all busy, each such call waits for a turn at
    the GIL (in the Transaction service it cost ~16 us of a Prepare's wall time, twice per Prepare, bench/
    txn.py). Keyed BLAKE2b is a PRF: without the key the ids are unpredictable as uuid4's, and a fresh key
    per process keeps them unique across restarts (a collision of 128-bit outputs is as unlikely as one of
    uuid4's 122 random bits). Thread-safe: ``next`` on an itertools.count is atomic under the GIL."""

    def __init__(self) -> None:
        self._rekey()
        os.register_at_fork(after_in_child=self._rekey)  # a forked child must not repeat its parent's ids

    def _rekey(self) -> None:
        self._key = os.urandom(32)
        self._counter = itertools.count()

    def next(self, size_bytes: int) -> str:
        """``2 * size_bytes`` hex digits."""
        return hashlib.blake2b(next(self._counter).to_bytes(8, "little"), key=self._key,
                               digest_size=size_bytes).hexdigest()


_IDS = _Ids()


# ---- steps: the coordinator's work as generators, run on a thread or on an event loop ------------------------
#
# Prepare, Commit and Rollback are written once, as generators that yield what they need from outside
# (an Append, a read of the log, a transaction's guard) and get its result back (or its error raised where
# they yielded). ``_run_on_loop`` gives them on an event loop (the grpc.aio Transaction port): an Append is
# awaited through ``LoopIo.append``, a read runs in ``LoopIo.read`` (a pool thread), and a guard held by a
# thread is not waited for: GuardBusy, and the caller runs the call on a thread. ``Coordinator._run`` runs
# the same driver on the calling thread with a LoopIo whose every call waits there (the appender, the log
# reader, a blocking acquire), so it never suspends.

@dataclass(frozen=True, slots=True)
class Append:
    topic: str
    messages: Sequence[MessageIn]


@dataclass(frozen=True, slots=True)
class Read:
    call: Callable[[], Any]      # a read of the log; may wait


@dataclass(frozen=True, slots=True)
class Guard:
    lock: threading.Lock         # acquired for the generator, which releases it


T = TypeVar("T")
Steps = Generator[Append | Read | Guard, Any, T]


class GuardBusy(Exception):
    """On the loop: a thread holds the transaction's guard. Nothing was changed; run it on a thread."""


class LoopIo(Protocol):
    """What the steps need on an event loop: ``append`` (awaited, e.g. mqstore.txn.appender.
    LoopAppendBatcher.append), ``read`` (a blocking read run off the loop), ``acquire`` (a guard without
    waiting: False if a thread holds it) and ``in_pool`` (a whole call on a thread, for a guard held by one)."""

    async def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]: ...

    async def read(self, call: Callable[[], T]) -> T: ...

    def acquire(self, lock: threading.Lock) -> bool: ...

    async def in_pool(self, call: Callable[[], T]) -> T: ...


class _ThreadIo:
    """LoopIo for steps run on a thread (Coordinator._run): everything waits, nothing suspends."""

    def __init__(self, appender: "Appender"):
        self._appender = appender

    async def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        return self._appender.append(topic, messages)

    async def read(self, call: Callable[[], T]) -> T:
        return call()

    def acquire(self, lock: threading.Lock) -> bool:
        return lock.acquire()

    async def in_pool(self, call: Callable[[], T]) -> T:
        return call()


def _advance(steps: Steps[T], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """(True, the result) once the steps have returned, else (False, the next step)."""
    try:
        return False, steps.send(value) if error is None else steps.throw(error)
    except StopIteration as done:
        return True, done.value


async def _run_on_loop(io: LoopIo, steps: Steps[T]) -> T:
    value: Any = None
    error: BaseException | None = None
    while True:
        done, step = _advance(steps, value, error)
        if done:
            return step
        value = error = None
        try:
            if type(step) is Append:
                value = await io.append(step.topic, step.messages)
            elif type(step) is Guard:
                if not io.acquire(step.lock):
                    error = GuardBusy()
            else:
                value = await io.read(step.call)
        except BaseException as exc:  # noqa: BLE001 (raised in the generator, where it yielded)
            error = exc


class LogReader(Protocol):
    def topic(self, name: str) -> TopicRecord: ...

    def get_messages_batch(self, physical_offsets: Sequence[int]) -> list[MessageLookup]: ...


class Appender(Protocol):
    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]: ...


class OpQueue(Protocol):
    def add(self, half_queue_offsets: Sequence[int]) -> None: ...

    def urge(self) -> None: ...


class InDoubtQueue(Protocol):
    def add(self, what: str, settle: Callable[[], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class PreparedHalf:
    uniq_key: str
    physical_offset: int
    half_queue_offset: int
    real_queue_id: int


@dataclass(frozen=True)
class Prepared:
    transaction_id: str
    halves: list[PreparedHalf]
    durability: str
    already: bool = False        # an identical retry: the first Prepare's answer


@dataclass(frozen=True)
class Ended:
    state: str
    already: bool
    results: list[AppendResult]


class Coordinator:
    def __init__(self, config: TxnConfig, table: TxnTable, log_reader: LogReader, appender: Appender,
                 ops: OpQueue, cache: HalfCache[MessageIn], clock: Clock, in_doubt: InDoubtQueue,
                 check_writable: Callable[[], None] = lambda: None):
        """``check_writable()`` raises (NotLeader, Unavailable) when the log takes no writes now: Prepare,
        Commit and Rollback are refused before they change anything (Local mode on a replica, whose table
        follows the leader's log and must not decide on its own)."""
        self.config, self.table, self.log_reader, self.appender = config, table, log_reader, appender
        self.check_writable = check_writable
        self.thread_io: LoopIo = _ThreadIo(appender)  # the steps' io on a thread: every call waits there
        self.ops, self.cache, self.clock, self.in_doubt = ops, cache, clock, in_doubt
        self._topics: dict[str, tuple[TopicRecord, float]] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._lock = threading.Lock()  # the two dicts above and the counter
        self.halves_written = 0
        table.on_needs_op = self._queue_halves

    def _run(self, steps: Steps[T]) -> T:
        """The steps on this thread (the module's *steps*): the loop's driver, whose awaits never suspend."""
        return waits.blocking(_run_on_loop(self.thread_io, steps))

    # ---- Prepare --------------------------------------------------------------------------------------
    def prepare(self, topic: str, messages: Sequence[MessageIn], group: str, txn_id: str = "") -> Prepared:
        return waits.blocking(self.prepare_async(self.thread_io, topic, messages, group, txn_id))

    async def prepare_async(self, io: "LoopIo", topic: str, messages: Sequence[MessageIn], group: str,
                            txn_id: str = "") -> Prepared:
        """The Prepare, its appends and reads through ``io`` (:class:`LoopIo`): awaited on an event loop;
        :meth:`prepare` runs it on a thread (mqstore.waits.blocking, ``thread_io``)."""
        return await _run_on_loop(io, self._prepare(topic, messages, group, txn_id))

    def _prepare(self, topic: str, messages: Sequence[MessageIn], group: str, txn_id: str) -> Steps[Prepared]:
        self.check_ready()
        self.check_writable()
        topic_rules.validate_topic_name(topic)
        topic_rules.validate_group_name(group)
        if not 1 <= len(messages) <= MAX_MESSAGES:
            raise InvalidArgument(f"messages: give 1 to {MAX_MESSAGES} messages, not {len(messages)}")
        for index, m in enumerate(messages):
            tx.check_message_properties(index, m.properties)
        txn_id = txn_id or _IDS.next(16)
        if not _TXN_ID.match(txn_id):
            raise InvalidArgument(f"transaction_id: use 1 to 128 of A-Z a-z 0-9 _ . : - (got {len(txn_id)} "
                                  f"characters that do not match)")
        digest = request_digest(topic, group, messages)
        txn, created = self.table.reserve(txn_id, group, topic, digest)
        if not created:
            return self._replay(txn, digest, topic, group)
        try:
            return (yield from self._append_halves(txn, topic, messages, group, digest))
        except OutcomeUnknown as exc:
            self._in_doubt(txn, PREPARE)
            raise OutcomeUnknown(f"transaction {txn_id}: the outcome of appending its halves is unknown ({exc}); "
                                 f"retry Prepare with transaction_id {txn_id}: it answers UNAVAILABLE until the "
                                 f"log has been read past the failure, then the first answer") from None
        except BaseException:
            self.table.release(txn)  # nothing was written: the id is free again
            raise

    def _append_halves(self, txn: Txn, topic: str, messages: Sequence[MessageIn], group: str,
                       digest: str) -> Steps[Prepared]:
        real = yield from self._topic(topic)
        tx.check_real_topic(real)
        qids = self._queues(real, messages)
        attempt = _IDS.next(8)
        halves = [_half_message(m, topic, qid, group, txn.txn_id, attempt, digest)
                  for m, qid in zip(messages, qids, strict=True)]
        results = yield Append(tx.HALF_TOPIC, halves)
        failpoints.hit("txn.prepare.after_half")
        self.table.prepared(txn, [Half(r.physical_offset, r.queue_offset, r.store_timestamp_ms, r.uniq_key, qid,
                                       attempt, tx.immunity_ms(m.properties.get(tx.PROPERTY_CHECK_IMMUNITY, "")))
                                  for m, qid, r in zip(messages, qids, results, strict=True)],
                            results[0].durability)
        for m, qid, r in zip(messages, qids, results, strict=True):
            self.cache.put(r.physical_offset, _real_from_input(m, qid, group, txn.txn_id, r), len(m.body))
        with self._lock:
            self.halves_written += len(results)
        return Prepared(txn.txn_id, [PreparedHalf(r.uniq_key, r.physical_offset, r.queue_offset, qid)
                                     for r, qid in zip(results, qids, strict=True)], results[0].durability)

    def _replay(self, txn: Txn, digest: str, topic: str, group: str) -> Prepared:
        """A Prepare of an id in use: an identical retry gets the first answer, anything else is refused."""
        with self.table.lock:
            state, unknown, same = txn.state, txn.unknown, bool(txn.digest) and txn.digest == digest
            halves = txn.primary()
        if not same:
            # The state only to a caller naming the same topic and group (the one that prepared it): no more
            # than that an id is in use to any other caller (txn.proto: no existence oracle)
            shown_state = f" ({state})" if (txn.topic, txn.group) == (topic, group) else ""
            raise AlreadyExists(f"transaction {txn.txn_id} exists already{shown_state} with other messages; give a "
                                f"new id or none (one is generated)")
        if state == PREPARING or unknown:
            raise Unavailable(f"transaction {txn.txn_id}: an identical Prepare is in progress or its outcome is "
                              f"unknown; retry shortly for its answer")
        return Prepared(txn.txn_id, [PreparedHalf(h.uniq_key, h.physical_offset, h.queue_offset, h.real_queue_id)
                                     for h in halves], txn.durability or DURABILITY_WRITTEN, already=True)

    def _topic(self, name: str) -> Steps[TopicRecord]:
        now = time.monotonic()
        with self._lock:
            cached = self._topics.get(name)
        if cached is not None and now - cached[1] < TOPIC_INFO_TTL_S:
            return cached[0]
        topic = yield Read(functools.partial(self.log_reader.topic, name))
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
    def decide(self, txn_id: str, decision: str) -> None:
        """A producer's check answer (mqstore.txn.checkback), applied as its Commit or Rollback would be (by
        "check-back"); a rollback does not wait for its OP record (nobody waits for the answer's outcome)."""
        if decision == "COMMIT":
            self.commit(txn_id, by="check-back")
        else:
            self.rollback(txn_id, by="check-back", wait_durable=False)

    def commit(self, txn_id: str, by: str = "producer", wait_durable: bool = True) -> Ended:
        """``wait_durable`` False: a Commit of a rolled-back transaction is refused at once, not once the
        rollback's OP record is written (a one-way end: nobody hears the refusal, and its thread may be
        serving other streams)."""
        return self._run(self._commit(txn_id, by, wait_durable))

    async def end_async(self, io: "LoopIo", decision: str, txn_id: str, by: str = "producer") -> Ended:
        """:meth:`commit` (``decision`` "COMMIT") or :meth:`rollback` ("ROLLBACK") on an event loop, with
        ``wait_durable`` False (the loop never waits for an OP record); run by ``io.in_pool`` if a thread
        holds the transaction's guard."""
        if decision != "COMMIT":
            return await self.rollback_async(io, txn_id, by, wait_durable=False)
        try:
            return await _run_on_loop(io, self._commit(txn_id, by, False))
        except GuardBusy:
            return await io.in_pool(functools.partial(self.commit, txn_id, by, False))

    def _commit(self, txn_id: str, by: str, wait_durable: bool) -> Steps[Ended]:
        self.check_ready()
        self.check_writable()
        txn = self.txn(txn_id)
        yield Guard(txn.guard)
        try:
            self._check_decidable(txn)
            if txn.state == COMMITTED:
                return Ended(COMMITTED, True, [])
            if txn.state == PARKED and not by.startswith("operator"):
                raise FailedPrecondition(f"transaction {txn_id} is PARKED: it cannot be committed (an operator "
                                         f"may, with ForceResolve)")
            rolled_back = txn.state == ROLLED_BACK
            if not rolled_back:
                results = yield from self._append_real(txn, by)
        finally:
            txn.guard.release()
        if rolled_back:  # only once the rollback is durable: it may still be undone by a crash before
            if wait_durable:
                self._wait_durable(txn, "rolled back")
            raise FailedPrecondition(f"transaction {txn_id} is ROLLED_BACK: it cannot be committed")
        log.debug("txn.committed", transaction_id=txn_id, messages=len(results), by=by)
        return Ended(COMMITTED, False, results)

    def _append_real(self, txn: Txn, by: str) -> Steps[list[AppendResult]]:
        """Under the guard: the real messages of the primary attempt, one Append; COMMITTED."""
        with self.table.lock:
            primary = txn.primary()
        messages = yield from self._real_messages(txn, primary)
        failpoints.hit("txn.commit.before_real")
        try:
            results = yield Append(txn.topic, messages)
        except OutcomeUnknown as exc:
            self._in_doubt(txn, COMMIT)
            raise OutcomeUnknown(f"transaction {txn.txn_id}: the outcome of appending its messages is unknown "
                                 f"({exc}); retry Commit: it answers UNAVAILABLE until the log has been read past "
                                 f"the failure, then COMMITTED (already, if they landed)") from None
        failpoints.hit("txn.commit.after_real")
        self.table.committed(txn, primary, by)
        self.table.need_op(txn)
        for half in txn.halves:  # another attempt's halves, if any, are never committed: not worth caching
            self.cache.discard(half.physical_offset)
        return results

    def rollback(self, txn_id: str, by: str = "producer", wait_durable: bool = True) -> Ended:
        """``wait_durable`` False: answer once decided, without waiting for the OP records (a check answer:
        nobody waits for its outcome, so its entries are not urged and share the next OP message)."""
        return waits.blocking(self.rollback_async(self.thread_io, txn_id, by, wait_durable))

    async def rollback_async(self, io: "LoopIo", txn_id: str, by: str = "producer",
                             wait_durable: bool = True) -> Ended:
        """Rollback through ``io``: decided by the steps (by ``io.in_pool`` if a thread holds the guard), then,
        ``wait_durable``, answered once its OP records are durable (:meth:`_wait_durable_async`). On an event
        loop no thread waits for the OP record: the thread that writes it (or the follower that reads it back)
        wakes the loop, one hand-off (issue 37); :meth:`rollback` runs it on a thread."""
        try:
            ended, txn = await _run_on_loop(io, self._rollback(txn_id, by))
        except GuardBusy:
            return await io.in_pool(functools.partial(self.rollback, txn_id, by, wait_durable))
        if wait_durable:
            await self._wait_durable_async(txn, "rolled back")
        return ended

    def _rollback(self, txn_id: str, by: str) -> Steps[tuple[Ended, Txn]]:
        self.check_ready()
        self.check_writable()
        txn = self.txn(txn_id)
        yield Guard(txn.guard)
        try:
            self._check_decidable(txn)
            if txn.state == COMMITTED:
                raise FailedPrecondition(f"transaction {txn_id} is COMMITTED: it cannot be rolled back")
            if txn.state == PARKED and not by.startswith("operator"):
                raise FailedPrecondition(f"transaction {txn_id} is PARKED: only an operator may resolve it "
                                         f"(ForceResolve)")
            already = txn.state == ROLLED_BACK
            if not already:
                for half in txn.halves:
                    self.cache.discard(half.physical_offset)
                self.table.resolve(txn, ROLLED_BACK, by)
                self.table.need_op(txn)
        finally:
            txn.guard.release()
        return Ended(ROLLED_BACK, already, []), txn

    async def wait_rollback_durable_async(self, txn_id: str) -> None:
        """For a Commit refused on an event loop because the transaction is rolled back: until that rollback
        is durable (at once if it is, or if it is not rolled back), as :meth:`commit` waits on a thread."""
        txn = self.table.get(txn_id)
        if txn is not None and txn.state == ROLLED_BACK:
            await self._wait_durable_async(txn, "rolled back")

    def _wait_durable(self, txn: Txn, what: str) -> None:
        return waits.blocking(self._wait_durable_async(txn, what))

    async def _wait_durable_async(self, txn: Txn, what: str) -> None:
        """Until the OP records of ``txn`` are durable: urged, they are written at once, or right after the
        OP write in flight (Nagle's rule, mqstore.txn.opbatch); the timeout only bounds a failing log. On a
        thread (mqstore.waits.blocking) the thread waits; on an event loop the coroutine suspends and the
        thread that marks the records written wakes it (TxnTable.op_written_async)."""
        self.ops.urge()
        timeout_s = self.config.op_batch_interval_ms / 1000 + 10
        if not await self.table.op_written_async(txn, timeout_s):
            raise Unavailable(f"transaction {txn.txn_id} is {what}, but its OP record was not written within "
                              f"{timeout_s:.1f} s (is the commit log reachable?); the decision is kept and its "
                              f"write retried: repeat the call to learn when it is durable")

    def _check_decidable(self, txn: Txn) -> None:
        """Under the guard: no decision while the Prepare is unfinished or an append's outcome unknown."""
        with self.table.lock:
            state, unknown = txn.state, txn.unknown
        if unknown:
            raise Unavailable(f"transaction {txn.txn_id}: the outcome of its last append ({unknown}) is unknown "
                              f"until the log has been read past the failure; retry shortly (the answer then "
                              f"says what the log holds)")
        if state == PREPARING:
            raise Unavailable(f"transaction {txn.txn_id} is still being prepared; retry once Prepare has answered")

    def _in_doubt(self, txn: Txn, action: str) -> None:
        self.table.mark_unknown(txn, action)
        self.in_doubt.add(f"{action.lower()} {txn.txn_id}", lambda: self.table.settle_unknown(txn, action))

    def _real_messages(self, txn: Txn, halves: Sequence[Half]) -> Steps[list[MessageIn]]:
        """One COMMIT message per half: from the cache (a hit removes it), the misses from the log."""
        found = {h.physical_offset: self.cache.take(h.physical_offset) for h in halves}
        missing = [offset for offset, m in found.items() if m is None]
        if missing:
            lookups = yield Read(functools.partial(self.log_reader.get_messages_batch, missing))
            for offset, lookup in zip(missing, lookups, strict=True):
                if lookup.message is None and lookup.beyond_end:
                    raise Unavailable(f"half message of transaction {txn.txn_id} at physical offset {offset} is not "
                                      f"readable yet on the commit log node asked ({lookup.missing}: a replica shows "
                                      f"it a moment after its leader, and a failover may be under way); nothing was "
                                      f"committed: retry shortly")
                if lookup.message is None:
                    raise DataLoss(f"half message of transaction {txn.txn_id} at physical offset {offset} cannot be "
                                   f"read: {lookup.missing}; nothing was committed")
                found[offset] = _real_from_half(lookup.message)
        return [found[h.physical_offset] for h in halves]

    def _queue_halves(self, txn: Txn, halves: list[Half]) -> None:
        """The table's on_needs_op (called with its lock held)."""
        self.ops.add([h.queue_offset for h in halves])

    def txn(self, txn_id: str) -> Txn:
        if not txn_id:
            raise InvalidArgument("transaction_id is empty")
        txn = self.table.get(txn_id)
        if txn is None:
            raise self.unknown(txn_id)
        return txn

    def check_end(self, txn_id: str, expected: tuple[str, str] = ("", ""),
                  permit: Callable[[str, str], None] = lambda topic, group: None) -> None:
        """Whether a caller may commit or roll back ``txn_id``: a transaction names no topic in its Commit and
        Rollback, so the one it was prepared with is checked: ``expected`` (the topic and producer group the
        request says it was prepared with, "": any; the gateway's EndTransaction) must be its own, and
        ``permit(topic, group)`` (the caller's permission; raises PermissionDenied) must pass. Either refusal
        is :meth:`unknown`: NotFound, the same message as for an id never prepared (txn.proto: no existence
        oracle). While not ready (recovering, a standby) it raises Unavailable: an id it does not know yet may be
        in the log."""
        self.check_ready()
        txn = self.txn(txn_id)
        want_topic, want_group = expected
        if (want_topic and want_topic != txn.topic) or (want_group and want_group != txn.group):
            raise self.unknown(txn_id)
        try:
            permit(txn.topic, txn.group)
        except PermissionDenied:  # logged and counted as a denial by whoever raised it; the caller sees an unknown id
            raise self.unknown(txn_id) from None

    def rollback_pending(self, txn_id: str) -> bool:
        """The transaction is rolled back and its OP records are not all written yet: a Commit refused without
        waiting (``wait_durable`` False) is refused by one that waits only once the rollback is durable."""
        txn = self.table.get(txn_id)
        return txn is not None and txn.state == ROLLED_BACK and not txn.op_written

    def unknown(self, txn_id: str) -> NotFound:
        """The refusal of an id that names no transaction the caller may see: the same for an unknown id and
        for one the caller may not touch (txn.proto: no existence oracle), so it names no topic."""
        return NotFound(f"transaction {shown(txn_id)} is unknown to you: never prepared here, resolved long ago (the "
                        f"service remembers the last {self.config.resolved_keep} resolved ones), or prepared on a "
                        f"topic or producer group you may not publish to (PUB on both is needed: an admin grants "
                        f"it); check the id against the one Prepare returned")

    def check_ready(self) -> None:
        """NotWritten (refused before doing anything) while the table is not ready: a standby, or recovering."""
        if not self.table.ready:
            if self.table.standby:
                raise NotWritten(self.table.standby)
            raise NotWritten("recovering: the Transaction service is reading the log up to the end it saw at "
                             "start (it cannot tell yet what was committed); retry shortly")


def request_digest(topic: str, group: str, messages: Sequence[MessageIn]) -> str:
    """What makes two Prepare requests the same: topic, group and each message's content and routing
    (not the born host: a retry may come from another connection). 32 hex digits (BLAKE2b-128)."""
    h = hashlib.blake2b(digest_size=16)
    for part in (topic, group):
        h.update(part.encode("utf-8") + b"\x00")
    for m in messages:
        h.update(len(m.body).to_bytes(8, "big") + m.body)
        fields = [m.tags, *m.keys, "\x01", *(f"{k}\x02{v}" for k, v in sorted(m.properties.items())),
                  str(m.flag), str(m.born_timestamp_ms), "" if m.queue_id is None else str(m.queue_id), m.sharding_key]
        h.update("\x00".join(fields).encode("utf-8") + b"\x03")
    return h.hexdigest()


def _half_message(m: MessageIn, topic: str, qid: int, group: str, txn_id: str, attempt: str,
                  digest: str) -> MessageIn:
    props = dict(m.properties)
    props.update({record.PROPERTY_REAL_TOPIC: topic, record.PROPERTY_REAL_QUEUE_ID: str(qid),
                  tx.PROPERTY_TRAN_MSG: "true", tx.PROPERTY_PRODUCER_GROUP: group, tx.PROPERTY_TRANSACTION_ID: txn_id,
                  tx.PROPERTY_ATTEMPT: attempt, tx.PROPERTY_DIGEST: digest})
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
    props = {k: v for k, v in r.properties.items() if k not in tx.HALF_ONLY_PROPERTIES}
    real_qid = r.properties.get(record.PROPERTY_REAL_QUEUE_ID, "")
    if not (real_qid.isascii() and real_qid.isdigit()):
        raise DataLoss(f"half message at physical offset {r.physical_offset} has no valid REAL_QID "
                       f"({len(real_qid)} characters)")
    return MessageIn(r.body, "", (), props, r.flag, r.born_timestamp_ms, int(real_qid), "", r.born_host, r.born_port,
                     record.SYSFLAG_TX_COMMIT, r.physical_offset)
