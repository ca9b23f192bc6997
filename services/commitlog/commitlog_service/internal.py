"""The CommitLogInternal servicer: the service-to-service way into the log (commitlog.proto says why).

A thin adapter like CommitLogServicer: it checks the caller's shared secret (metadata
``mqstore-internal-token``, compared in constant time), converts the request (AppendBatches' through the
codec in use, mqstore_rpc.append_wire) and calls
``MessageStore.append(..., system_writer=writer)``, whose rules (each writer's, registered in
mqstore.writers by mqstore.system_writers) decide what the writer may write. AppendBatches and
AppendBatchesStream do that per batch, each batch's refusal reported in its own result; both are answered
on the port's event loop (``MessageStore.append_async``, as CommitLog.Append): a request of the stream the
txn service and the gateway keep open is read, written and answered there, with no hand-off to a handler
thread and back (bench/README.md, *The log's stream on its loop*).

Thread-safe: holds the store (thread-safe) and the token (immutable).
"""

from __future__ import annotations

import hmac

import grpc
import structlog
from mqstore.errors import InvalidArgument, MqStoreError, NotLeader, PermissionDenied
from mqstore.model import AppendResults
from mqstore.relayed import WRITER_GATEWAY
from mqstore.store import MessageStore
from mqstore.timer.scheduling import Scheduler
from mqstore_rpc import append_wire, convert
from mqstore_rpc.errors import status_for, wire_codec
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc

INTERNAL_SERVICE_NAME = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogInternal"].full_name
TOKEN_METADATA = "mqstore-internal-token"
MAX_BATCHES = 100                # AppendBatches: batches per call
MAX_BATCHES_MESSAGES = 10_000    # AppendBatches: messages per call, all batches together

log = structlog.get_logger()


def check_token(metadata, expected: str) -> None:
    """PermissionDenied unless the call's metadata carries ``expected`` (and one is configured)."""
    if not expected:
        raise PermissionDenied("this commit log has no internal token configured (setting internal_token, env "
                               "MQSTORE_INTERNAL_TOKEN), so its internal service refuses every call")
    given = next((value for key, value in metadata or () if key == TOKEN_METADATA), None)
    if given is None:
        raise PermissionDenied(f"CommitLogInternal is for mqstore's own services: the call has no "
                               f"{TOKEN_METADATA} metadata (clients use CommitLog.Append)")
    if not hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8")):
        raise PermissionDenied(f"the {TOKEN_METADATA} metadata does not match this commit log's internal token "
                               f"(MQSTORE_INTERNAL_TOKEN must be the same for the commit log and its services)")


class CommitLogInternalServicer(commitlog_pb2_grpc.CommitLogInternalServicer):
    def __init__(self, store: MessageStore, token: str, scheduler: Scheduler | None = None):
        """``scheduler``: the gateway's relayed sends with a delivery time go to the timer through it."""
        self._store = store
        self._token = token
        self._scheduler = scheduler

    def Append(self, request, context):
        check_token(context.invocation_metadata(), self._token)
        if not request.writer:
            raise InvalidArgument("writer: name the service that writes (\"txn\")")
        messages = convert.internal_messages_in(request.messages, context.peer())
        if self._scheduler is not None and request.writer == WRITER_GATEWAY:  # a DELAY send of the gateway
            results = self._scheduler.append(request.topic, messages, writer=request.writer)
        else:
            results = self._store.append(request.topic, messages, system_writer=request.writer)
        return convert.append_response((results,))

    # AppendBatches and AppendBatchesStream take their requests through the codec in use
    # (mqstore_rpc.append_wire.parse_internal_batches) and answer serialized bytes.

    @wire_codec(append_wire.parse_internal_batches)
    async def AppendBatches(self, request, context):
        """Each batch one Append with its own outcome (commitlog.proto). NotLeader on the first batch is
        the call's (a replica wrote nothing; the client follows the leader); a later batch's refusal,
        NotLeader included (leadership lost between batches), is that batch's."""
        check_token(context.invocation_metadata(), self._token)
        return await self._append_batches(request, context.peer())

    @wire_codec(append_wire.parse_internal_batches)
    async def AppendBatchesStream(self, request_iterator, context):
        """AppendBatches for each request of the stream, answered in order (commitlog.proto)."""
        check_token(context.invocation_metadata(), self._token)
        peer = context.peer()
        async for request in request_iterator:
            yield await self._append_batches(request, peer)

    async def _append_batches(self, request, peer: str) -> bytes:
        if not request.writer:
            raise InvalidArgument("writer: name the service that writes (\"txn\")")
        batches = request.batches
        if not 1 <= len(batches) <= MAX_BATCHES:
            raise InvalidArgument(f"batches: {len(batches)} given; send 1..{MAX_BATCHES} per call")
        total = sum(len(batch.messages) for batch in batches)
        if total > MAX_BATCHES_MESSAGES:
            raise InvalidArgument(f"batches: {total} messages in all; send at most {MAX_BATCHES_MESSAGES} per "
                                  f"call (split them over several calls)")
        outcomes: list[AppendResults | commitlog_pb2.BatchError] = []
        for at, batch in enumerate(batches):
            try:
                messages = append_wire.internal_messages(batch, peer)
                if self._scheduler is not None and request.writer == WRITER_GATEWAY:  # as Append: a DELAY send
                    results = await self._scheduler.append_async(batch.topic, messages, writer=request.writer)
                else:
                    results = await self._store.append_async(batch.topic, messages, system_writer=request.writer)
            except NotLeader as exc:
                if at == 0:
                    raise
                outcomes.append(self._refused(batch.topic, exc))
            except MqStoreError as exc:
                outcomes.append(self._refused(batch.topic, exc))
            else:
                outcomes.append(results)
        return append_wire.batches_response(outcomes)

    @staticmethod
    def _refused(topic: str, exc: MqStoreError) -> commitlog_pb2.BatchError:
        code = status_for(exc)
        log.debug("rpc.batch_error", topic=topic, code=code.name, error=type(exc).__name__, message=str(exc))
        return commitlog_pb2.BatchError(code=code.value[0], message=str(exc), error=type(exc).__name__,
                                        retriable=exc.retriable)


def add_to_server(servicer: CommitLogInternalServicer, server: grpc.Server) -> None:
    commitlog_pb2_grpc.add_CommitLogInternalServicer_to_server(servicer, server)
