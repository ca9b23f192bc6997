"""Transaction gRPC servicer: a thin adapter from mqstore.v1 requests to the coordinator, the check-back
hub and the operator tools. It never catches mqstore errors (mqstore_rpc.errors maps them).

CheckBack runs two loops per stream: this handler's generator sends the session's checks, and a reader
thread (``txn-checkback-reader``) takes the producer's answers; an answer that names no check sent
on the stream (or a message that is not an answer) ends the stream with INVALID_ARGUMENT.

Thread-safe: holds no state beyond thread-safe domain objects.
"""

from __future__ import annotations

import threading

import grpc
import structlog
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore import topics as topic_rules
from mqstore.auth.model import PUB, topic
from mqstore_rpc import auth, convert
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc

from mqstore.txn.checkback import Check, CheckHub, CheckSession, Checker
from mqstore.txn.coordinator import Coordinator, Ended
from mqstore.txn.operations import Operations, TxnView, answer_check

log = structlog.get_logger("txn_service.servicer")
SERVICE_NAME = txn_pb2.DESCRIPTOR.services_by_name["Transaction"].full_name
_STATE_TO_PB = {s: txn_pb2.TransactionState.Value(f"TRANSACTION_STATE_{s}")
                for s in ("OPEN", "COMMITTED", "ROLLED_BACK", "PARKED")}
_DECISION_TO_PB = {"": txn_pb2.DECISION_UNSPECIFIED, "COMMIT": txn_pb2.DECISION_COMMIT,
                   "ROLLBACK": txn_pb2.DECISION_ROLLBACK, "UNKNOWN": txn_pb2.DECISION_UNKNOWN}
_DECISION_FROM_PB = {v: k for k, v in _DECISION_TO_PB.items() if k}
POLL_S = 0.2  # how often a CheckBack handler looks whether its stream is still active


def decision_in(value: int) -> str:
    try:
        return _DECISION_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(f"decision {value} is not COMMIT (1), ROLLBACK (2) or UNKNOWN (3)") from None


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


def _check(c: Check) -> txn_pb2.CheckRequest:
    return txn_pb2.CheckRequest(check_id=c.check_id, transaction_id=c.txn_id, topic=c.topic, check_times=c.check_times,
                                age_ms=c.age_ms, halves=[convert.stored_message(m) for m in c.halves])


class TransactionServicer(txn_pb2_grpc.TransactionServicer):
    def __init__(self, coordinator: Coordinator, hub: CheckHub, checker: Checker, operations: Operations):
        self._coordinator, self._hub, self._checker, self._ops = coordinator, hub, checker, operations

    def Prepare(self, request, context):
        prepared = self._coordinator.prepare(request.topic, convert.messages_in(request.messages, context.peer()),
                                             request.producer_group, request.transaction_id)
        response = txn_pb2.PrepareResponse(transaction_id=prepared.transaction_id)
        for r, qid in zip(prepared.results, prepared.real_queue_ids, strict=True):
            response.halves.add(uniq_key=r.uniq_key, physical_offset=r.physical_offset,
                                half_queue_offset=r.queue_offset, real_queue_id=qid)
        response.durability = convert._DURABILITY_TO_PB[prepared.results[0].durability]
        return response

    def Commit(self, request, context):
        self._may_end(request.transaction_id)
        return _ended(self._coordinator.commit(request.transaction_id))

    def Rollback(self, request, context):
        self._may_end(request.transaction_id)
        return _ended(self._coordinator.rollback(request.transaction_id))

    def _may_end(self, txn_id: str) -> None:
        """Commit and Rollback name a transaction, not its topic: PUB on that topic (with auth on;
        mqstore_rpc.permissions, deferred)."""
        auth.require(PUB, topic(self._coordinator.txn(txn_id).topic))

    def ListOpen(self, request, context):
        views = self._ops.list_open(request.older_than_ms, request.producer_group, request.limit)
        return txn_pb2.ListOpenResponse(transactions=[_info(v) for v in views])

    def Show(self, request, context):
        return _info(self._ops.show(request.transaction_id))

    def ForceResolve(self, request, context):
        return _ended(self._ops.force_resolve(request.transaction_id, decision_in(request.decision), request.reason,
                                              request.operator))

    def Stats(self, request, context):
        return txn_pb2.TxnStats(**self._ops.stats())

    def CheckBack(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            raise InvalidArgument("CheckBack: the first message must be a hello naming the producer group")
        topic_rules.validate_group_name(first.hello.producer_group)
        self._coordinator.check_ready()
        session = self._hub.open(first.hello.producer_group)
        failure: list[MqStoreError] = []
        reader = threading.Thread(target=self._read_answers, args=(request_iterator, session, failure),
                                  name="txn-checkback-reader", daemon=True)
        reader.start()
        try:
            while context.is_active() and not session.closed:
                check = session.next_check(POLL_S)
                if check is not None:
                    yield _check(check)
            if failure:
                raise failure[0]
        finally:
            self._hub.close(session)

    def _read_answers(self, request_iterator, session: CheckSession, failure: list) -> None:
        try:
            for message in request_iterator:
                if message.WhichOneof("kind") != "answer":
                    raise InvalidArgument("CheckBack: after the hello, send only answers")
                txn_id = session.answered(message.answer.check_id)
                answer_check(self._coordinator, self._checker, txn_id, decision_in(message.answer.decision))
        except MqStoreError as exc:
            failure.append(exc)
        except grpc.RpcError:
            pass  # the stream was cancelled: the producer went away
        finally:
            self._hub.close(session)


def add_to_server(servicer: TransactionServicer, server: grpc.Server) -> None:
    txn_pb2_grpc.add_TransactionServicer_to_server(servicer, server)
