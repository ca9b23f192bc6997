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

One servicer, the grpc.aio Transaction port of both modes (mqstore_rpc.aio): Prepare, Commit, Rollback and
Transact are coroutines answered through mqstore.txn.onloop.LoopCalls, which decides what runs on the loop
and what in the server's handler pool, a Commit refused while a rollback is not durable, a Transact frame's
place, its carried ends' checks and a stream's ends: the servicer converts and calls it once per call or
step of a frame. The operator calls (ListOpen, Show, ForceResolve, ListAudit, Stats) and CheckBack are
synchronous handlers, run in the handler pool (mqstore_rpc.aio.on_loop).

Thread-safe: holds no state beyond thread-safe domain objects.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable, Iterator

import grpc
from mqstore.access import PUB, group, topic
from mqstore.errors import InvalidArgument
from mqstore.meta.txn_audit import AuditEntry
from mqstore_rpc import auth, convert
from mqstore_rpc.errors import FrameStatus, frame_outcome
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc

from mqstore.txn.checkback import Answer, Check, CheckBack
from mqstore.txn.coordinator import Ended, Prepared
from mqstore.txn.onloop import LoopCalls, StreamEnds
from mqstore.txn.operations import Operations, TxnView
from mqstore.txn.table import OUTCOME_UNKNOWN, STATES
from mqstore.txn.transact import COMMIT, ROLLBACK

SERVICE_NAME = txn_pb2.DESCRIPTOR.services_by_name["Transaction"].full_name
TRANSACT_METHOD = f"/{SERVICE_NAME}/Transact"
_ONE_WAY = {"commit": COMMIT, "rollback": ROLLBACK}
_STATE_TO_PB = {s: txn_pb2.TransactionState.Value(f"TRANSACTION_STATE_{s}") for s in (*STATES, OUTCOME_UNKNOWN)}
_DECISION_TO_PB = {"": txn_pb2.DECISION_UNSPECIFIED, "COMMIT": txn_pb2.DECISION_COMMIT,
                   "ROLLBACK": txn_pb2.DECISION_ROLLBACK, "UNKNOWN": txn_pb2.DECISION_UNKNOWN}
_DECISION_FROM_PB = {v: k for k, v in _DECISION_TO_PB.items() if k}
_CARRIED = {txn_pb2.DECISION_COMMIT: COMMIT, txn_pb2.DECISION_ROLLBACK: ROLLBACK}  # any other number: refused


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
    """The Transaction service: Prepare, Commit, Rollback and Transact answered through ``calls``
    (mqstore.txn.onloop.LoopCalls); the operator calls through ``operations``, CheckBack through
    ``checkback``, in the handler pool."""

    def __init__(self, checkback: CheckBack, operations: Operations, calls: LoopCalls):
        self._checkback, self._ops, self._calls = checkback, operations, calls
        # (role, active address) for Stats: an election (txn_service.main) replaces it; alone: "single"
        self.role: Callable[[], tuple[str, str]] = lambda: ("single", "")

    async def Prepare(self, request, context):
        return _prepared(await self._calls.prepare(request.topic, convert.messages_in(request.messages, context.peer()),
                                                   request.producer_group, request.transaction_id))

    async def Commit(self, request, context):
        return _ended(await self._calls.commit(request.transaction_id, _expected(request), _may_end))

    async def Rollback(self, request, context):
        return _ended(await self._calls.rollback(request.transaction_id, _expected(request), _may_end))

    async def Transact(self, request_iterator, context) -> AsyncIterator[txn_pb2.TransactResponse]:
        peer = context.peer()
        async with self._calls.stream() as ends:
            async for request in request_iterator:
                response = await self._frame(request, peer, ends)
                await ends.answered(response is not None)
                if response is not None:
                    yield response

    async def _frame(self, request, peer: str, ends: StreamEnds) -> txn_pb2.TransactResponse | None:
        """One Transact frame: its answer, or None for a frame that is not answered (one-way, ends only)."""
        kind = request.WhichOneof("kind")
        on_loop = await ends.place(kind, request.one_way)
        if request.ends:
            carried = [(c.transaction_id, _CARRIED.get(c.decision, c.decision)) for c in request.ends]
            refused = await frame_outcome(TRANSACT_METHOD, ends.carried, carried, _may_end, on_loop)
            if refused is not None:
                return _frame_response(request.request_id, refused)
            if kind is None:
                return None  # ends only: not answered
        if request.one_way and kind in _ONE_WAY:
            end = getattr(request, kind)
            await ends.end(end.transaction_id, _ONE_WAY[kind], _expected(end), _may_end, on_loop)
            return None
        return _frame_response(request.request_id, await frame_outcome(
            TRANSACT_METHOD, self._two_way, kind, request, peer, on_loop))

    async def _two_way(self, kind: str | None, request, peer: str, on_loop: bool) -> Prepared | Ended:
        """One two-way frame, as its unary call (the permission its call needs included: PUB on the topic,
        checked here with auth on; mqstore_rpc.permissions, deferred)."""
        if kind == "prepare":
            if request.one_way:
                raise InvalidArgument("one_way: only a Commit or Rollback frame may be one-way, not a Prepare")
            p = request.prepare
            _may_prepare(p)
            return await self._calls.prepare(p.topic, convert.messages_in(p.messages, peer), p.producer_group,
                                             p.transaction_id, on_loop=on_loop)
        if kind == "commit":
            return await self._calls.commit(request.commit.transaction_id, _expected(request.commit), _may_end,
                                            on_loop=on_loop)
        if kind == "rollback":
            return await self._calls.rollback(request.rollback.transaction_id, _expected(request.rollback), _may_end)
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


def add_to_server(servicer: TransactionServicer, server: grpc.Server) -> None:
    txn_pb2_grpc.add_TransactionServicer_to_server(servicer, server)
