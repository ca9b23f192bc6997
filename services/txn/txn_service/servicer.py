"""Transaction gRPC servicer: a thin adapter from mqstore.v1 requests to the coordinator, the check-back
streams and the operator tools. It never catches mqstore errors (mqstore_rpc.errors maps them).

Authorization (with auth on) follows the transaction, never a name the caller gives in its place: Commit
and Rollback (and their frames) require PUB on the topic and producer group it was prepared with
(:func:`_may_end`, given to mqstore.txn.coordinator.Coordinator.check_end, which looks the transaction up);
one the caller may not end is answered as an unknown id (NOT_FOUND, the same message: no existence oracle,
txn.proto), the denial still logged and counted. A CheckBack stream carries only checks of topics its user may PUB.

CheckBack: the hello is checked here; the stream's answers are converted into domain objects (a message
that is not an answer raises INVALID_ARGUMENT inside the domain's reader, which ends the stream; the
producer cancelling ends the iteration) and handed to mqstore.txn.checkback.CheckBack, whose session
gives the checks to send.

On the event loop (:class:`LoopTransactionServicer`, the grpc.aio Transaction port of both modes:
mqstore_rpc.aio): what runs on the loop and what in the server's handler pool, the retry of a refused
Commit and a stream's ends are mqstore.txn.onloop's (LoopCalls): the servicer converts and calls it once
per call or frame.

Thread-safe: holds no state beyond thread-safe domain objects.
"""

from __future__ import annotations

import functools
from typing import AsyncIterator, Callable, Iterator

import grpc
from mqstore.access import PUB, group, topic
from mqstore.errors import InvalidArgument
from mqstore.meta.txn_audit import AuditEntry
from mqstore_rpc import auth, convert
from mqstore_rpc.errors import FrameStatus, frame_outcome, frame_outcome_async
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc

from mqstore.txn.checkback import Answer, Check, CheckBack
from mqstore.txn.coordinator import Coordinator, Ended, Prepared
from mqstore.txn.onloop import MAX_CARRIED_ENDS, LoopCalls, StreamEnds
from mqstore.txn.operations import Operations, TxnView
from mqstore.txn.table import OUTCOME_UNKNOWN, STATES
from mqstore.txn.transact import COMMIT, ROLLBACK, TransactStreams

SERVICE_NAME = txn_pb2.DESCRIPTOR.services_by_name["Transaction"].full_name
TRANSACT_METHOD = f"/{SERVICE_NAME}/Transact"
_ONE_WAY = {"commit": COMMIT, "rollback": ROLLBACK}
_STATE_TO_PB = {s: txn_pb2.TransactionState.Value(f"TRANSACTION_STATE_{s}") for s in (*STATES, OUTCOME_UNKNOWN)}
_DECISION_TO_PB = {"": txn_pb2.DECISION_UNSPECIFIED, "COMMIT": txn_pb2.DECISION_COMMIT,
                   "ROLLBACK": txn_pb2.DECISION_ROLLBACK, "UNKNOWN": txn_pb2.DECISION_UNKNOWN}
_DECISION_FROM_PB = {v: k for k, v in _DECISION_TO_PB.items() if k}


def decision_in(value: int) -> str:
    try:
        return _DECISION_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(f"decision {value} is not COMMIT (1), ROLLBACK (2) or UNKNOWN (3)") from None


def _prepared(p: Prepared, response: txn_pb2.PrepareResponse | None = None) -> txn_pb2.PrepareResponse:
    """The PrepareResponse of ``p``, filled into ``response`` if given (a frame's, in place: a message built
    apart is copied into the one that holds it)."""
    if response is None:
        response = txn_pb2.PrepareResponse()
    response.SetInParent()
    response.transaction_id = p.transaction_id
    response.already = p.already
    response.durability = convert._DURABILITY_TO_PB[p.durability]
    add = response.halves.add
    for h in p.halves:
        add(uniq_key=h.uniq_key, physical_offset=h.physical_offset, half_queue_offset=h.half_queue_offset,
            real_queue_id=h.real_queue_id)
    return response


def _ended(e: Ended, response: txn_pb2.EndResponse | None = None) -> txn_pb2.EndResponse:
    """The EndResponse of ``e``, filled into ``response`` if given (as :func:`_prepared`)."""
    if response is None:
        response = txn_pb2.EndResponse()
    response.SetInParent()
    response.state = _STATE_TO_PB[e.state]
    response.already = e.already
    add = response.results.add
    for r in e.results:
        add(msg_id=r.msg_id, uniq_key=r.uniq_key, queue_id=r.queue_id, queue_offset=r.queue_offset,
            physical_offset=r.physical_offset, size_bytes=r.size_bytes, store_timestamp_ms=r.store_timestamp_ms)
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
    response = txn_pb2.TransactResponse(request_id=request_id)
    if isinstance(outcome, Prepared):
        _prepared(outcome, response.prepared)
    else:
        _ended(outcome, response.ended)
    return response


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


def _may_end(topic_name: str, group_name: str) -> None:
    """The permission to end a transaction prepared on ``topic_name`` by ``group_name`` (with auth on;
    mqstore_rpc.permissions, deferred): PUB on both. Coordinator.check_end turns a refusal into an unknown id."""
    auth.require(PUB, topic(topic_name))
    auth.require(PUB, group(group_name))


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
        # (role, active address) for Stats: an election (txn_service.main) replaces it; alone: "single"
        self.role: Callable[[], tuple[str, str]] = lambda: ("single", "")

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
        self._coordinator.check_end(txn_id, expected, _may_end)
        return self._coordinator.commit(txn_id, wait_durable=wait_durable)

    def _rollback(self, txn_id: str, expected: tuple[str, str] = ("", "")) -> Ended:
        self._coordinator.check_end(txn_id, expected, _may_end)
        return self._coordinator.rollback(txn_id)

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
            self._streams.submit_one_way(end.transaction_id, _ONE_WAY[kind], guard=functools.partial(
                self._coordinator.check_end, end.transaction_id, _expected(end), _may_end))
            return None
        return _frame_response(request.request_id,
                               frame_outcome(TRANSACT_METHOD, self._frame, kind, request, peer, wait_durable))

    def _carried(self, ends) -> None:
        """A frame's carried ends (Transact): all checked first (a malformed one refuses the frame, none of
        it applied), then each submitted as its one-way frame would be, in order."""
        for carried, decision in zip(ends, _carried_decisions(ends), strict=True):
            txn_id = carried.transaction_id
            self._streams.submit_one_way(txn_id, decision, guard=functools.partial(
                self._coordinator.check_end, txn_id, ("", ""), _may_end))

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
        role, active_address = self.role()
        return txn_pb2.TxnStats(**self._ops.stats(), role=role, active_address=active_address)

    def CheckBack(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            raise InvalidArgument("CheckBack: the first message must be a hello naming the producer group")
        session = self._checkback.open(first.hello.producer_group, _answers(request_iterator), _may_publish())
        try:
            for check in session.checks(context.is_active):
                yield _check(check)
        finally:
            self._checkback.close(session)


class LoopTransactionServicer(TransactionServicer):
    """The Transaction service with Prepare, Commit, Rollback and Transact answered through ``calls``
    (mqstore.txn.onloop.LoopCalls: which run on a grpc.aio server's loop and which in its handler pool, a
    refused Commit taken again there, a stream's ends); every other call as :class:`TransactionServicer`'s,
    in the handler pool."""

    def __init__(self, coordinator: Coordinator, checkback: CheckBack, operations: Operations,
                 streams: TransactStreams, calls: LoopCalls):
        super().__init__(coordinator, checkback, operations, streams)
        self._calls = calls

    async def Prepare(self, request, context):
        return _prepared(await self._calls.prepare(request.topic, convert.messages_in(request.messages, context.peer()),
                                                   request.producer_group, request.transaction_id))

    async def Commit(self, request, context):
        return _ended(await self._calls.commit(request.transaction_id, _expected(request), _may_end))

    async def Rollback(self, request, context):
        return _ended(await self._calls.rollback(request.transaction_id, _expected(request), _may_end))

    async def Transact(self, request_iterator, context) -> AsyncIterator[txn_pb2.TransactResponse]:
        peer, calls = context.peer(), self._calls
        ends = calls.ends()
        with self._streams.opened():
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if calls.frame_on_loop(kind, request.one_way):
                    response = await self._handle_on_loop(kind, request, peer, ends)
                else:
                    await ends.settle()
                    response = await calls.in_pool(functools.partial(self._handle, request, peer))
                if response is not None or ends.full():
                    await ends.settle()
                if response is not None:
                    yield response
            await ends.settle()

    async def _handle_on_loop(self, kind: str | None, request, peer: str,
                              ends: StreamEnds) -> txn_pb2.TransactResponse | None:
        """:meth:`_handle` on the loop: one-way and carried ends go to ``ends``."""
        if request.ends:
            checked = frame_outcome(TRANSACT_METHOD, _carried_decisions, request.ends)
            if isinstance(checked, FrameStatus):
                return _frame_response(request.request_id, checked)
            check_end = self._coordinator.check_end
            for carried, decision in zip(request.ends, checked, strict=True):
                await ends.end(carried.transaction_id, decision,
                               functools.partial(check_end, carried.transaction_id, ("", ""), _may_end))
            if kind is None:
                return None  # ends only: not answered
        if request.one_way and kind in _ONE_WAY:
            end = getattr(request, kind)
            await ends.end(end.transaction_id, _ONE_WAY[kind],
                           functools.partial(self._coordinator.check_end, end.transaction_id, _expected(end), _may_end))
            return None
        return _frame_response(request.request_id,
                               await frame_outcome_async(TRANSACT_METHOD, self._frame_async, kind, request, peer))

    async def _frame_async(self, kind: str | None, request, peer: str) -> Prepared | Ended:
        """:meth:`_frame` on the loop."""
        if kind == "prepare":
            if request.one_way:
                raise InvalidArgument("one_way: only a Commit or Rollback frame may be one-way, not a Prepare")
            p = request.prepare
            _may_prepare(p)
            return await self._calls.prepare(p.topic, convert.messages_in(p.messages, peer), p.producer_group,
                                             p.transaction_id, on_loop=True)
        if kind == "commit":
            return await self._calls.commit(request.commit.transaction_id, _expected(request.commit), _may_end,
                                            on_loop=True)
        if kind == "rollback" and not request.one_way:
            return await self._calls.rollback(request.rollback.transaction_id, _expected(request.rollback), _may_end)
        return self._frame(kind, request, peer)  # refuses what is not a frame


def add_to_server(servicer: TransactionServicer, server: grpc.Server) -> None:
    txn_pb2_grpc.add_TransactionServicer_to_server(servicer, server)
