"""The gateway's way into the Transaction service (txn.proto), in the gateway domain's terms.

``prepare``/``commit``/``rollback`` are the unary calls (an end names the topic its client named, which
the Transaction service requires to be the transaction's own: txn.proto's EndRequest);
``open_checks(group)`` opens a CheckBack stream (hello with the producer group, then the checks as
:class:`mqstore.gateway.checkback.Check`; answers are queued onto the request stream). Every gRPC error
becomes the mqstore exception it came from (mqstore_rpc.remote_errors), so the domain sees Unavailable
when the service cannot be reached and NotFound for an unknown transaction (or one of another topic),
which EndTransaction reports as INVALID_TRANSACTION_ID.

``address`` may list an active/standby pair (``host:port,host:port``, issue 34): a call the standby
refuses (UNAVAILABLE, naming the active one) or that finds an instance down goes on to the next
(mqstore_rpc.endpoints.Failover, UNAVAILABLE only: a DEADLINE_EXCEEDED may have committed); a CheckBack
stream that ends UNAVAILABLE is re-opened on the next one.

Thread-safe (a gRPC channel and stub are); a CheckStream is read by one thread and answered from others.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator

import grpc
from mqstore import defaults
from mqstore.errors import InvalidTransactionId, NotFound
from mqstore.gateway.checkback import COMMIT, ROLLBACK, UNKNOWN, Check
from mqstore.model import MessageIn

from mqstore_rpc import convert
from mqstore_rpc.endpoints import Failover
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc
from mqstore_rpc.remote_errors import from_rpc_error
from mqstore_rpc.peers import Peers

_DECISIONS = {COMMIT: txn_pb2.DECISION_COMMIT, ROLLBACK: txn_pb2.DECISION_ROLLBACK, UNKNOWN: txn_pb2.DECISION_UNKNOWN}
_END = object()


class CheckStream:
    """One CheckBack stream (mqstore.gateway.checkback.CheckStream)."""

    def __init__(self, instances: Failover, group: str, address: str, deadline_s: float):
        self._outbox: queue.Queue = queue.Queue()
        self._outbox.put(txn_pb2.CheckBackMessage(hello=txn_pb2.CheckBackHello(producer_group=group)))
        self._address = address
        self._lock = threading.Lock()
        self._closed = False
        self._instances = instances
        self._call, self._index = instances.open("CheckBack", iter(self._outbox.get, _END), timeout=deadline_s)

    def checks(self) -> Iterator[Check]:
        try:
            for request in self._call:
                yield Check(request.check_id, request.transaction_id, request.topic,
                            [convert.stored_message_out(m) for m in request.halves])
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:  # a standby, or down: re-opened on the next one
                self._instances.failed(self._index)
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # the planned re-open of a long stream
                raise from_rpc_error(exc, self._address) from None
        finally:
            self.cancel()

    def answer(self, check_id: int, decision: str) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._outbox.put(txn_pb2.CheckBackMessage(answer=txn_pb2.CheckAnswer(check_id=check_id,
                                                                                 decision=_DECISIONS[decision])))
            return True

    def cancel(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._outbox.put(_END)
        self._call.cancel()


class TxnClient:
    def __init__(self, address: str, *, rpc_timeout_s: float, stream_deadline_s: float, max_reconnect_backoff_ms: int,
                 peers: Peers | None = None):
        self.address, self.rpc_timeout_s, self.stream_deadline_s = address, rpc_timeout_s, stream_deadline_s
        options = [("grpc.max_send_message_length", defaults.MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", defaults.MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms)]
        peers = peers or Peers()
        self._instances = Failover(address, lambda one: peers.channel(one, options), txn_pb2_grpc.TransactionStub,
                                   retried=frozenset({grpc.StatusCode.UNAVAILABLE}))

    def close(self) -> None:
        self._instances.close()

    def prepare(self, topic: str, message: MessageIn, group: str) -> tuple[str, int]:
        """Transaction.Prepare of one message: (transaction id, the half's queue offset)."""
        request = txn_pb2.PrepareRequest(topic=topic, messages=[convert.message_input(message)], producer_group=group)
        response = self._call("Prepare", request)
        return response.transaction_id, response.halves[0].half_queue_offset

    def commit(self, transaction_id: str, topic: str) -> None:
        """Transaction.Commit of a transaction prepared on ``topic`` (the producer group is the topic, the
        gateway's rule): one prepared otherwise is refused as an unknown id."""
        self._end("Commit", transaction_id, topic)

    def rollback(self, transaction_id: str, topic: str) -> None:
        self._end("Rollback", transaction_id, topic)

    def open_checks(self, group: str) -> CheckStream:
        return CheckStream(self._instances, group, self.address, self.stream_deadline_s)

    def _end(self, method, transaction_id: str, topic: str) -> None:
        try:
            self._call(method, txn_pb2.EndRequest(transaction_id=transaction_id, topic=topic, producer_group=topic))
        except NotFound as exc:
            raise InvalidTransactionId(f"transaction {transaction_id[:128]!r} is not known to the Transaction "
                                       f"service: {exc}") from None

    def _call(self, method: str, request):
        try:
            return self._instances.call(method, request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
