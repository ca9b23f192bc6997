"""Transaction gRPC servicer: a thin adapter from mqstore.v1 requests to the coordinator, the check-back
streams and the operator tools. It never catches mqstore errors (mqstore_rpc.errors maps them).

Authorization (with auth on) follows the transaction, never a name the caller gives in its place: Commit
and Rollback (and their frames) look the transaction up and require PUB on the topic and producer group it
was prepared with (:meth:`TransactionServicer._may_end`); one the caller may not end is answered as an
unknown id (NOT_FOUND, the same message: no existence oracle, txn.proto), the denial still logged and
counted. A CheckBack stream carries only checks of topics its user may PUB.

CheckBack: the hello is checked here; the stream's answers are converted into domain objects (a message
that is not an answer raises INVALID_ARGUMENT inside the domain's reader, which ends the stream; the
producer cancelling ends the iteration) and handed to mqstore.txn.checkback.CheckBack, whose session
gives the checks to send.

On the event loop (:class:`LoopTransactionServicer`, the grpc.aio Transaction port of both modes:
mqstore_rpc.aio): a Prepare, Commit or Transact frame is handled on the loop, the coordinator's steps
awaiting their appends there (Cluster mode: the loop's own group commit over the CommitLog client's
grpc.aio Append; Local mode: the store's append, which does not wait); what may wait (a Rollback waits for
its OP record; a Commit refused for a rollback not yet durable waits for that; in Local mode anything while
the store's appends wait for a flush or for replicas) runs in the server's handler pool, and a stream takes
its next frame once this one is answered, so frames stay in order.

Thread-safe: holds no state beyond thread-safe domain objects.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from concurrent.futures import Executor
from typing import AsyncIterator, Awaitable, Callable, Iterator, Sequence, TypeVar

import grpc
from mqstore import topics as topic_rules
from mqstore.auth.model import PUB, group, topic
from mqstore.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from mqstore.meta.txn_audit import AuditEntry
from mqstore.model import AppendResult, MessageIn
from mqstore_rpc import auth, convert
from mqstore_rpc.errors import FrameStatus, frame_outcome, frame_outcome_async
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc

from mqstore.txn.checkback import Answer, Check, CheckBack
from mqstore.txn.coordinator import Coordinator, Ended, Prepared
from mqstore.txn.operations import Operations, TxnView
from mqstore.txn.table import OUTCOME_UNKNOWN, ROLLED_BACK, STATES
from mqstore.txn.transact import COMMIT, ROLLBACK, TransactStreams

T = TypeVar("T")
SERVICE_NAME = txn_pb2.DESCRIPTOR.services_by_name["Transaction"].full_name
TRANSACT_METHOD = f"/{SERVICE_NAME}/Transact"
_ONE_WAY = {"commit": COMMIT, "rollback": ROLLBACK}
MAX_CARRIED_ENDS = 1000
_STATE_TO_PB = {s: txn_pb2.TransactionState.Value(f"TRANSACTION_STATE_{s}") for s in (*STATES, OUTCOME_UNKNOWN)}
_DECISION_TO_PB = {"": txn_pb2.DECISION_UNSPECIFIED, "COMMIT": txn_pb2.DECISION_COMMIT,
                   "ROLLBACK": txn_pb2.DECISION_ROLLBACK, "UNKNOWN": txn_pb2.DECISION_UNKNOWN}
_DECISION_FROM_PB = {v: k for k, v in _DECISION_TO_PB.items() if k}


def decision_in(value: int) -> str:
    try:
        return _DECISION_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(f"decision {value} is not COMMIT (1), ROLLBACK (2) or UNKNOWN (3)") from None


def _prepared(p: Prepared) -> txn_pb2.PrepareResponse:
    response = txn_pb2.PrepareResponse(transaction_id=p.transaction_id, already=p.already,
                                       durability=convert._DURABILITY_TO_PB[p.durability])
    for h in p.halves:
        response.halves.add(uniq_key=h.uniq_key, physical_offset=h.physical_offset,
                            half_queue_offset=h.half_queue_offset, real_queue_id=h.real_queue_id)
    return response


def _ended(e: Ended) -> txn_pb2.EndResponse:
    response = txn_pb2.EndResponse(state=_STATE_TO_PB[e.state], already=e.already)
    for r in e.results:
        response.results.add(msg_id=r.msg_id, uniq_key=r.uniq_key, queue_id=r.queue_id, queue_offset=r.queue_offset,
                             physical_offset=r.physical_offset, size_bytes=r.size_bytes,
                             store_timestamp_ms=r.store_timestamp_ms)
    if e.results:
        response.durability = convert._DURABILITY_TO_PB[e.results[0].durability]
    return response


def _info(v: TxnView) -> txn_pb2.TransactionInfo:
    return txn_pb2.TransactionInfo(
        transaction_id=v.txn_id, producer_group=v.group, topic=v.topic, state=_STATE_TO_PB[v.state],
        message_count=v.message_count, store_timestamp_ms=v.store_timestamp_ms, age_ms=v.age_ms,
        checks_sent=v.checks_sent, last_answer=_DECISION_TO_PB.get(v.last_answer, 0), last_check_ms=v.last_check_ms,
        resolved_by=v.resolved_by, half_physical_offsets=v.half_physical_offsets)


def _audit(e: AuditEntry) -> txn_pb2.AuditEntry:
    return txn_pb2.AuditEntry(id=e.id, transaction_id=e.transaction_id, decision=_DECISION_TO_PB.get(e.decision, 0),
                              previous_state=_STATE_TO_PB.get(e.previous_state, 0), reason=e.reason,
                              operator=e.operator, at_ms=e.at_ms, outcome=e.outcome)


def _check(c: Check) -> txn_pb2.CheckRequest:
    return txn_pb2.CheckRequest(check_id=c.check_id, transaction_id=c.txn_id, topic=c.topic, check_times=c.check_times,
                                age_ms=c.age_ms, halves=[convert.stored_message(m) for m in c.halves])


def _frame_response(request_id: int, outcome: Prepared | Ended | FrameStatus) -> txn_pb2.TransactResponse:
    if isinstance(outcome, FrameStatus):
        return txn_pb2.TransactResponse(request_id=request_id, error=txn_pb2.FrameError(
            code=outcome.code.value[0], message=outcome.message, retriable=outcome.retriable))
    if isinstance(outcome, Prepared):
        return txn_pb2.TransactResponse(request_id=request_id, prepared=_prepared(outcome))
    return txn_pb2.TransactResponse(request_id=request_id, ended=_ended(outcome))


def _carried_decisions(ends) -> list[str]:
    """Each carried end's decision, all checked (InvalidArgument: none of the frame is applied)."""
    if len(ends) > MAX_CARRIED_ENDS:
        raise InvalidArgument(f"ends: carry at most {MAX_CARRIED_ENDS} ends in one frame, not {len(ends)}")
    decisions = []
    for index, carried in enumerate(ends):
        decision = _DECISION_FROM_PB.get(carried.decision)
        if decision not in (COMMIT, ROLLBACK):
            raise InvalidArgument(f"ends[{index}].decision: a carried end is DECISION_COMMIT (1) or "
                                  f"DECISION_ROLLBACK (2), not {carried.decision}")
        decisions.append(decision)
    return decisions


def _expected(end: txn_pb2.EndRequest) -> tuple[str, str]:
    """The topic and producer group an EndRequest says its transaction was prepared with ("": any)."""
    return end.topic, end.producer_group


def _may_prepare(p: txn_pb2.PrepareRequest) -> None:
    """A Prepare frame's permission, as its unary call's (mqstore_rpc.permissions): PUB on the topic and on
    the producer group."""
    auth.require(PUB, topic(p.topic))
    auth.require(PUB, group(p.producer_group))


def _may_publish() -> Callable[[str], bool]:
    """For a CheckBack stream (called in its handler): whether its user may PUB a topic, the test that
    picks the checks it carries (mqstore.txn.checkback); every topic with authentication off. The user's
    rules as of the stream's opening; a False is no denial (nothing logged): that check goes to another
    stream of the group, or waits for one."""
    caller = auth.current_caller()
    if caller is None:
        return lambda name: True
    return lambda name: caller.allowed(PUB, topic(name))


def _answers(request_iterator) -> Iterator[Answer]:
    """The producer's answers as domain objects; ends when the producer closes or cancels its side."""
    try:
        for message in request_iterator:
            if message.WhichOneof("kind") != "answer":
                raise InvalidArgument("CheckBack: after the hello, send only answers")
            yield Answer(message.answer.check_id, decision_in(message.answer.decision))
    except grpc.RpcError:
        return  # the stream was cancelled: the producer went away


class TransactionServicer(txn_pb2_grpc.TransactionServicer):
    def __init__(self, coordinator: Coordinator, checkback: CheckBack, operations: Operations,
                 streams: TransactStreams):
        self._coordinator, self._checkback, self._ops, self._streams = coordinator, checkback, operations, streams

    def Prepare(self, request, context):
        return _prepared(self._prepare(request, context.peer()))

    def Commit(self, request, context):
        return _ended(self._commit(request.transaction_id, expected=_expected(request)))

    def Rollback(self, request, context):
        return _ended(self._rollback(request.transaction_id, expected=_expected(request)))

    def _prepare(self, p, peer: str) -> Prepared:
        return self._coordinator.prepare(p.topic, convert.messages_in(p.messages, peer), p.producer_group,
                                         p.transaction_id)

    def _commit(self, txn_id: str, wait_durable: bool = True, expected: tuple[str, str] = ("", "")) -> Ended:
        self._may_end(txn_id, expected)
        return self._coordinator.commit(txn_id, wait_durable=wait_durable)

    def _rollback(self, txn_id: str, expected: tuple[str, str] = ("", "")) -> Ended:
        self._may_end(txn_id, expected)
        return self._coordinator.rollback(txn_id)

    def _may_end(self, txn_id: str, expected: tuple[str, str] = ("", "")) -> None:
        """Commit and Rollback name a transaction, not its topic: PUB on the topic and the producer group it
        was prepared with (with auth on; mqstore_rpc.permissions, deferred), and, when the request says
        them (``expected``: EndRequest.topic, producer_group; the gateway's), those must be its own. A
        transaction failing either is refused as an unknown id: NotFound, the same message (no oracle)."""
        txn = self._coordinator.txn(txn_id)
        want_topic, want_group = expected
        if (want_topic and want_topic != txn.topic) or (want_group and want_group != txn.group):
            raise self._coordinator.unknown(txn_id)
        try:
            auth.require(PUB, topic(txn.topic))
            auth.require(PUB, group(txn.group))
        except PermissionDenied:  # logged and counted as a denial; the caller sees an unknown id
            raise self._coordinator.unknown(txn_id) from None

    def Transact(self, request_iterator, context):
        peer = context.peer()
        with self._streams.opened():
            for request in request_iterator:
                response = self._handle(request, peer)
                if response is not None:
                    yield response

    def _handle(self, request, peer: str, wait_durable: bool = True) -> txn_pb2.TransactResponse | None:
        """One Transact frame: its answer, or None for a frame that is not answered (one-way, ends only).
        ``wait_durable`` False: a Commit of a rolled-back transaction is refused before that is durable."""
        kind = request.WhichOneof("kind")
        if request.ends:
            refused = frame_outcome(TRANSACT_METHOD, self._carried, request.ends)
            if refused is not None:
                return _frame_response(request.request_id, refused)
            if kind is None:
                return None  # ends only: not answered
        if request.one_way and kind in _ONE_WAY:
            end = getattr(request, kind)
            self._streams.submit_one_way(end.transaction_id, _ONE_WAY[kind],
                                         guard=functools.partial(self._may_end, end.transaction_id, _expected(end)))
            return None
        return _frame_response(request.request_id,
                               frame_outcome(TRANSACT_METHOD, self._frame, kind, request, peer, wait_durable))

    def _carried(self, ends) -> None:
        """A frame's carried ends (Transact): all checked first (a malformed one refuses the frame, none of
        it applied), then each submitted as its one-way frame would be, in order."""
        for carried, decision in zip(ends, _carried_decisions(ends), strict=True):
            txn_id = carried.transaction_id
            self._streams.submit_one_way(txn_id, decision, guard=functools.partial(self._may_end, txn_id))

    def _frame(self, kind: str | None, request, peer: str, wait_durable: bool = True) -> Prepared | Ended:
        """One two-way frame, as its unary call (the permission its call needs included: PUB on the topic,
        checked here with auth on; mqstore_rpc.permissions, deferred)."""
        if kind == "prepare":
            if request.one_way:
                raise InvalidArgument("one_way: only a Commit or Rollback frame may be one-way, not a Prepare")
            _may_prepare(request.prepare)
            return self._prepare(request.prepare, peer)
        if kind == "commit":
            return self._commit(request.commit.transaction_id, wait_durable, _expected(request.commit))
        if kind == "rollback":
            return self._rollback(request.rollback.transaction_id, _expected(request.rollback))
        raise InvalidArgument("TransactRequest: set one of prepare, commit or rollback, or carry ends")

    def ListOpen(self, request, context):
        views = self._ops.list_open(request.older_than_ms, request.producer_group, request.limit)
        return txn_pb2.ListOpenResponse(transactions=[_info(v) for v in views])

    def Show(self, request, context):
        return _info(self._ops.show(request.transaction_id))

    def ForceResolve(self, request, context):
        return _ended(self._ops.force_resolve(request.transaction_id, decision_in(request.decision), request.reason,
                                              request.operator))

    def ListAudit(self, request, context):
        page = self._ops.list_audit(request.transaction_id, request.limit, request.page_token)
        return txn_pb2.ListAuditResponse(entries=[_audit(e) for e in page.entries],
                                         next_page_token=page.next_page_token)

    def Stats(self, request, context):
        return txn_pb2.TxnStats(**self._ops.stats())

    def CheckBack(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            raise InvalidArgument("CheckBack: the first message must be a hello naming the producer group")
        topic_rules.validate_group_name(first.hello.producer_group)
        self._coordinator.check_ready()
        session = self._checkback.open(first.hello.producer_group, _answers(request_iterator), _may_publish())
        try:
            for check in session.checks(context.is_active):
                yield _check(check)
        finally:
            self._checkback.close(session)


class PortIo:
    """The coordinator's LoopIo (mqstore.txn.coordinator) on a grpc.aio port: ``append`` is awaited on the
    loop (Cluster mode: LoopAppendBatcher.append over the CommitLog client's grpc.aio call; Local mode: the
    in-process appender, called on the loop); reads of the log and calls whose guard a thread holds run
    in ``pool`` with the caller's context (the caller of a deferred permission check: mqstore_rpc.auth).
    ``overlaps``: an append is a round trip, so a stream's one-way and carried ends are worth overlapping
    with its next frame (Cluster mode); without, they are applied before it (Local mode, as inline)."""

    def __init__(self, append: Callable[[str, Sequence[MessageIn]], Awaitable[list[AppendResult]]], pool: Executor,
                 overlaps: bool):
        self.append, self._pool, self.overlaps = append, pool, overlaps

    async def read(self, call: Callable[[], T]) -> T:
        return await self.in_pool(call)

    def acquire(self, lock: threading.Lock) -> bool:
        return lock.acquire(blocking=False)

    async def in_pool(self, call: Callable[[], T]) -> T:
        run = functools.partial(contextvars.copy_context().run, call)
        return await asyncio.get_running_loop().run_in_executor(self._pool, run)


def inline_append(append: Callable[[str, Sequence[MessageIn]], list[AppendResult]]):
    """A synchronous in-process ``append`` as PortIo's coroutine (Local mode: it does not wait while the
    store's appends do not)."""
    async def call(topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        return append(topic, messages)
    return call


class LoopTransactionServicer(TransactionServicer):
    """The Transaction service with Prepare, Commit, Rollback and Transact answered on a grpc.aio server's
    loop (the module docstring); every other call as :class:`TransactionServicer`'s, in the handler pool.

    On the loop the coordinator's steps run with ``io`` (:class:`PortIo`). ``loop_blocks()``: whether an
    append would hold the loop's thread now (Local mode while the store's appends wait for a SYNC flush or
    SYNC replication): then the call or frame runs in the pool, as on a synchronous server. A Commit is
    tried on the loop without waiting: only if the transaction turns out rolled back and that is not
    durable yet is it taken again in the pool, where the refusal waits for the rollback's OP record as the
    synchronous call's does. A coordinator call started on the loop runs to its end even if its RPC is
    cancelled meanwhile (as a thread would): its append may have landed.

    A stream's one-way and carried ends: applied before its next frame is read (Local mode), or (``io.
    overlaps``, Cluster mode) started at once and waited for before the stream's next answer, so that a
    carried Commit's append and the next Prepare's travel together; at most MAX_CARRIED_ENDS of them are
    outstanding. Either way as TransactStreams applies them (counted, never answered, a failure logged)."""

    def __init__(self, coordinator: Coordinator, checkback: CheckBack, operations: Operations,
                 streams: TransactStreams, loop_blocks: Callable[[], bool], io: PortIo):
        super().__init__(coordinator, checkback, operations, streams)
        self._loop_blocks, self._io = loop_blocks, io

    async def Prepare(self, request, context):
        if self._loop_blocks():
            return _prepared(await self._io.in_pool(functools.partial(self._prepare, request, context.peer())))
        return _prepared(await self._to_end(self._prepare_async(request, context.peer())))

    async def Commit(self, request, context):
        txn_id, expected = request.transaction_id, _expected(request)
        if not self._loop_blocks():
            try:
                return _ended(await self._to_end(self._commit_async(txn_id, expected)))
            except FailedPrecondition:
                if not self._rollback_pending(txn_id):
                    raise
        return _ended(await self._io.in_pool(functools.partial(self._commit, txn_id, expected=expected)))

    async def Rollback(self, request, context):
        return _ended(await self._io.in_pool(functools.partial(self._rollback, request.transaction_id,
                                                               _expected(request))))

    async def Transact(self, request_iterator, context) -> AsyncIterator[txn_pb2.TransactResponse]:
        peer = context.peer()
        # the stream's ends started and not yet waited for (io.overlaps); a stream that ends early leaves
        # them to finish on their own
        ends: list[asyncio.Task] = []
        with self._streams.opened():
            async for request in request_iterator:
                if self._loop_blocks() or (request.WhichOneof("kind") == "rollback" and not request.one_way):
                    await _all_done(ends)
                    response = await self._io.in_pool(functools.partial(self._handle, request, peer))
                else:
                    response = await self._handle_on_loop(request, peer, ends)
                    if self._refused_until_durable(request, response):  # its ends are applied: only the Commit
                        response = await self._io.in_pool(functools.partial(self._commit_frame, request, peer))
                if response is not None or len(ends) >= MAX_CARRIED_ENDS:
                    await _all_done(ends)
                if response is not None:
                    yield response
            await _all_done(ends)

    async def _handle_on_loop(self, request, peer: str, ends: list[asyncio.Task]) -> txn_pb2.TransactResponse | None:
        """:meth:`_handle` on the loop: one-way and carried ends go to :meth:`_end`."""
        kind = request.WhichOneof("kind")
        if request.ends:
            checked = frame_outcome(TRANSACT_METHOD, _carried_decisions, request.ends)
            if isinstance(checked, FrameStatus):
                return _frame_response(request.request_id, checked)
            for carried, decision in zip(request.ends, checked, strict=True):
                await self._end(carried.transaction_id, decision, ends)
            if kind is None:
                return None  # ends only: not answered
        if request.one_way and kind in _ONE_WAY:
            end = getattr(request, kind)
            await self._end(end.transaction_id, _ONE_WAY[kind], ends, _expected(end))
            return None
        return _frame_response(request.request_id,
                               await frame_outcome_async(TRANSACT_METHOD, self._frame_async, kind, request, peer))

    async def _end(self, txn_id: str, decision: str, ends: list[asyncio.Task],
                   expected: tuple[str, str] = ("", "")) -> None:
        guard = functools.partial(self._may_end, txn_id, expected)
        end = self._streams.end_one_way_async(self._io, txn_id, decision, guard=guard)
        if self._io.overlaps:
            ends.append(asyncio.ensure_future(end))
        else:
            await end

    async def _frame_async(self, kind: str | None, request, peer: str) -> Prepared | Ended:
        """:meth:`_frame` on the loop (a Rollback frame never comes here: it waits, so it runs in the pool)."""
        if kind == "prepare":
            if request.one_way:
                raise InvalidArgument("one_way: only a Commit or Rollback frame may be one-way, not a Prepare")
            _may_prepare(request.prepare)
            return await self._to_end(self._prepare_async(request.prepare, peer))
        if kind == "commit":
            return await self._to_end(self._commit_async(request.commit.transaction_id, _expected(request.commit)))
        return self._frame(kind, request, peer)  # refuses what is not a frame

    async def _prepare_async(self, p, peer: str) -> Prepared:
        return await self._coordinator.prepare_async(self._io, p.topic, convert.messages_in(p.messages, peer),
                                                     p.producer_group, p.transaction_id)

    async def _commit_async(self, txn_id: str, expected: tuple[str, str] = ("", "")) -> Ended:
        self._may_end(txn_id, expected)
        return await self._coordinator.end_async(self._io, COMMIT, txn_id)

    async def _to_end(self, work: Awaitable[T]) -> T:
        """``work``'s result; if the caller is cancelled meanwhile, ``work`` still runs to its end (its append
        may land: the table must learn of it as a thread's call would). Without ``io.overlaps`` (Local mode)
        an append never suspends the coroutine, so nothing can cut one short and no task is needed."""
        if not self._io.overlaps:
            return await work
        return await asyncio.shield(asyncio.ensure_future(work))

    def _refused_until_durable(self, request, response: txn_pb2.TransactResponse | None) -> bool:
        """A two-way Commit frame refused on the loop because its transaction is rolled back, not durably yet."""
        return (response is not None and response.HasField("error") and request.WhichOneof("kind") == "commit"
                and self._rollback_pending(request.commit.transaction_id))

    def _commit_frame(self, request, peer: str) -> txn_pb2.TransactResponse:
        return _frame_response(request.request_id, frame_outcome(TRANSACT_METHOD, self._frame, "commit", request, peer))

    def _rollback_pending(self, txn_id: str) -> bool:
        """The transaction is rolled back and its OP records are not all written yet."""
        txn = self._coordinator.table.get(txn_id)
        return txn is not None and txn.state == ROLLED_BACK and not txn.op_written


async def _all_done(ends: list[asyncio.Task]) -> None:
    """Wait for the stream's outstanding ends (their failures are counted, never raised)."""
    while ends:
        await ends.pop(0)


def add_to_server(servicer: TransactionServicer, server: grpc.Server) -> None:
    txn_pb2_grpc.add_TransactionServicer_to_server(servicer, server)
