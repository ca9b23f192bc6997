"""apache.rocketmq.v2.MessagingService: a thin adapter from the RocketMQ 5 protocol to the gateway domain
(mqstore.gateway) and, through it, to the CommitLog and Transaction services.

Every outcome travels in the response's ``status`` (gateway_service.status maps mqstore errors to the
protocol's codes); the gRPC status is OK unless the gateway has a bug. Every call must carry the
``x-mq-client-id`` header (CLIENT_ID_REQUIRED otherwise) and counts as a sign of life of that client.

RecallMessage cancels a DELAY message by the recall_handle of its send result (mqstore.gateway.publishing: the
commit log's RecallTimer). Unsupported calls answer with the protocol's own codes: PullMessage, UpdateOffset,
GetOffset and QueryOffset (the remoting-era pull model; neither official client of this protocol calls them)
and SyncLiteSubscription (lite topics) get NOT_IMPLEMENTED.

With authentication on, a client id belongs to the user who first presented it (mqstore.gateway.clients):
any call of another user with it is refused, PERMISSION_DENIED as the interceptor's refusals, and only
that user or an ADMIN of the cluster ends its session (NotifyClientTermination) or opens its Telemetry
stream (telemetry.py). A user over one of its quotas (clients, Telemetry streams, receives in flight) gets
TOO_MANY_REQUESTS; other users do not.

Thread-safe: holds no state beyond thread-safe domain objects.
"""

from __future__ import annotations

import time
from typing import Callable

import grpc
import structlog
from mqstore.errors import ClientIdRequired, IllegalAccessPoint, InvalidArgument, InvalidTransactionId, MqStoreError
from mqstore.gateway.checkback import COMMIT, ROLLBACK, UNKNOWN, CheckRelay
from mqstore.gateway.clients import ClientRegistry
from mqstore.gateway.config import GatewayConfig
from mqstore.gateway.consuming import Consuming
from mqstore.gateway.publishing import Publish, Publisher, TopicCache, accepted_types, send_wait_s, writable

from mqstore_rpc import aio, auth
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc

from . import convert
from .status import answers_with_status, ok, status_of, streams_with_status
from .telemetry import TelemetryStream, as_caller, client_type_name, is_admin

log = structlog.get_logger("gateway_service.servicer")
SERVICE_NAME = s.DESCRIPTOR.services_by_name["MessagingService"].full_name
CLIENT_ID_HEADER = "x-mq-client-id"
BROKER_NAME = "mqstore"
_RESOLUTIONS = {d.COMMIT: COMMIT, d.ROLLBACK: ROLLBACK, d.TRANSACTION_RESOLUTION_UNSPECIFIED: UNKNOWN}
_FILTER_TYPES = {d.FILTER_TYPE_UNSPECIFIED: "", d.TAG: "TAG", d.SQL: "SQL"}


def client_id(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER and value:
            return value[:256]
    raise ClientIdRequired(f"the {CLIENT_ID_HEADER} header is missing: every RocketMQ 5 client sends it")


def not_implemented(what: str) -> d.Status:
    return d.Status(code=d.NOT_IMPLEMENTED, message=f"{what} is not implemented by the mqstore gateway")


def overall(statuses: list[d.Status]) -> d.Status:
    """The top-level status of a call with one status per entry: the entries' code when they all share
    it (the Java proxy's rule: the clients read only the top-level status), else MULTIPLE_RESULTS."""
    codes = {st.code for st in statuses}
    if len(codes) == 1:
        return statuses[0]
    return d.Status(code=d.MULTIPLE_RESULTS, message="the entries have different results; see each entry's status")


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, config: GatewayConfig, registry: ClientRegistry, topics: TopicCache, publisher: Publisher,
                 relay: CheckRelay, consuming: Consuming, appends_at_once: Callable[[], bool] = lambda: False):
        """``appends_at_once``: the log's (LogPort.appends_at_once): sends may then be answered on the loop."""
        self.config, self.registry, self.topics, self.publisher, self.relay = config, registry, topics, publisher, relay
        self.consuming = consuming
        self._appends_at_once = appends_at_once

    def _client(self, context, client_type: str = "", group: str = "") -> str:
        """The caller's client id, kept alive: PERMISSION_DENIED when it is another user's."""
        cid = client_id(context)
        caller = auth.current_caller()
        as_caller(caller, lambda: self.registry.touch(cid, client_type, group, caller.name if caller else None))
        return cid

    # ---- routes and clients ----------------------------------------------------------------------------
    @answers_with_status(s.QueryRouteResponse)
    def QueryRoute(self, request, context):
        self._client(context)
        if not request.endpoints.addresses:
            raise IllegalAccessPoint("QueryRoute: endpoints is empty; send the access point the client uses")
        topic = self.topics.get(request.topic.name)
        return s.QueryRouteResponse(status=ok(), message_queues=convert.message_queues(
            topic, request.endpoints, accepted_types(topic), BROKER_NAME, writable(topic)))

    @answers_with_status(s.QueryAssignmentResponse)
    def QueryAssignment(self, request, context):
        self._client(context)
        if not request.endpoints.addresses:
            raise IllegalAccessPoint("QueryAssignment: endpoints is empty; send the access point the client uses")
        topic = self.topics.get(request.topic.name)
        # The proxy's "broker acting queue" (id -1): a receive pops every queue of the topic anyway.
        queue = convert.message_queues(topic, request.endpoints, accepted_types(topic), BROKER_NAME)[0]
        queue.id = -1
        return s.QueryAssignmentResponse(status=ok(), assignments=[d.Assignment(message_queue=queue)])

    @answers_with_status(s.HeartbeatResponse)
    def Heartbeat(self, request, context):
        group = request.group.name if request.HasField("group") else ""
        kind = client_type_name(request.client_type) if request.client_type else ""
        self._client(context, kind, group)
        return s.HeartbeatResponse(status=ok())

    @answers_with_status(s.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request, context):
        cid, caller = client_id(context), auth.current_caller()
        user, admin = (caller.name, is_admin(caller)) if caller is not None else (None, False)
        as_caller(caller, lambda: self.registry.remove(cid, "NotifyClientTermination", user, admin=admin))
        return s.NotifyClientTerminationResponse(status=ok())

    @streams_with_status(s.TelemetryCommand)
    def Telemetry(self, request_iterator, context):
        cid, caller = client_id(context), auth.current_caller()
        first = None
        if caller is not None:  # the interceptor read and checked the first command: it waits here
            first = next(request_iterator, None)
            if first is None:
                return  # the client closed its side without a command
        stream = TelemetryStream(self.registry, self.config, cid, caller, first, self.consuming.ordered)
        yield from stream.commands(request_iterator, context)

    # ---- producing -------------------------------------------------------------------------------------
    def _send_at_once(self, request) -> bool:
        return self._appends_at_once()

    @aio.at_once_when("_send_at_once")
    @answers_with_status(s.SendMessageResponse)
    def SendMessage(self, request, context):
        """Answered on the port's event loop when the log's appends do not wait (Local mode, one node, ASYNC
        flush: LogPort.appends_at_once) and no message needs another service or a lookup (Publisher.sends_at_once);
        else in the handler pool (again there, before anything is sent, when a message is found to need one)."""
        self._client(context)
        if not request.messages:
            raise InvalidArgument("SendMessage: messages is empty; send one message per request")
        peer = context.peer()
        publishes = [self._publish_in(message, peer) for message in request.messages]
        if aio.on_the_loop() and not all(isinstance(p, Publish) and self.publisher.sends_at_once(p)
                                         for p in publishes):
            raise aio.InPool  # nothing sent yet: all of them on a thread
        # on the loop no append waits (Local mode, one node): no election to wait out
        wait_s = 0.0 if aio.on_the_loop() else send_wait_s(self.config.send_leader_wait_ms, context.time_remaining())
        until_s = time.monotonic() + wait_s
        entries = [self._send_one(message, p, until_s)
                   for message, p in zip(request.messages, publishes, strict=True)]
        return s.SendMessageResponse(status=overall([e.status for e in entries]), entries=entries)

    @staticmethod
    def _publish_in(message: d.Message, peer: str) -> Publish | MqStoreError:
        try:
            return convert.publish_in(message, peer)
        except MqStoreError as exc:  # its entry's status
            return exc

    def _send_one(self, message: d.Message, p: Publish | MqStoreError, until_s: float) -> s.SendResultEntry:
        try:
            if isinstance(p, MqStoreError):
                raise p
            sent = self.publisher.send(p, max(0.0, until_s - time.monotonic()))
        except MqStoreError as exc:  # one message's refusal is its entry's status
            log.info("gateway.send_refused", topic=message.topic.name[:127], error=type(exc).__name__,
                     message=str(exc))
            return s.SendResultEntry(status=status_of(exc), message_id=message.system_properties.message_id)
        return s.SendResultEntry(status=ok(), message_id=sent.message_id, transaction_id=sent.transaction_id,
                                 offset=sent.queue_offset, recall_handle=sent.recall_handle)

    @answers_with_status(s.EndTransactionResponse)
    def EndTransaction(self, request, context):
        self._client(context)
        if not request.transaction_id:
            raise InvalidTransactionId("EndTransaction: transaction_id is empty; send the id SendMessage returned")
        from_check = request.source == d.SOURCE_SERVER_CHECK
        decision = _RESOLUTIONS.get(request.resolution)
        if decision is None or (decision == UNKNOWN and not from_check):
            raise InvalidArgument(f"EndTransaction: resolution must be COMMIT (1) or ROLLBACK (2), not "
                                  f"{request.resolution}")
        # The topic the interceptor checked PUB on: the transaction must be of it (mqstore.gateway.checkback)
        self.relay.resolve(request.transaction_id, decision, from_check, request.topic.name)
        return s.EndTransactionResponse(status=ok())

    # ---- consuming -------------------------------------------------------------------------------------
    @streams_with_status(s.ReceiveMessageResponse)
    def ReceiveMessage(self, request, context):
        """Exactly one status item (OK, or MESSAGE_NOT_FOUND when nothing came within the long poll), then
        the delivery time and the messages, then the end of the stream, inside the client's deadline."""
        cid = self._client(context)
        left_s = context.time_remaining()
        with self.registry.receiving(auth.caller_name()):
            result, invisible_ms = self._receive(request, cid, left_s)
        # Everything is converted before the first item: a failure after it would be a second status.
        messages = [convert.message_out(m.message, topic=m.topic, receipt_handle=m.receipt_handle,
                                        delivery_attempt=m.attempt, invisible_ms=invisible_ms)
                    for m in result.deliveries]
        if not messages:
            yield s.ReceiveMessageResponse(status=d.Status(code=d.MESSAGE_NOT_FOUND,
                                                           message="no new message within the long poll"))
            return
        yield s.ReceiveMessageResponse(status=ok())
        yield s.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(result.pop_time_ms))
        for message in messages:
            yield s.ReceiveMessageResponse(message=message)

    def _receive(self, request, cid: str, left_s: float | None):
        return self.consuming.receive(
            request.group.name, request.message_queue.topic.name,
            filter_type=_FILTER_TYPES.get(request.filter_expression.type, "unknown"),
            expression=request.filter_expression.expression, batch_size=request.batch_size,
            invisible_ms=convert.duration_ms(request.invisible_duration) if request.HasField("invisible_duration")
            else None, auto_renew=request.auto_renew,
            long_poll_ms=convert.duration_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout") else None,
            time_left_ms=None if left_s is None else int(left_s * 1000), client_id=cid)

    @answers_with_status(s.AckMessageResponse)
    def AckMessage(self, request, context):
        self._client(context)
        if not request.entries:
            raise InvalidArgument("AckMessage: entries is empty; send the receipt handles to acknowledge")
        outcomes = self.consuming.ack(request.group.name, request.topic.name,
                                      [e.receipt_handle for e in request.entries])
        entries = [s.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle,
                                           status=ok() if o.status == "ok" else d.Status(
                                               code=d.INVALID_RECEIPT_HANDLE, message=o.message or o.status))
                   for e, o in zip(request.entries, outcomes, strict=True)]
        return s.AckMessageResponse(status=overall([e.status for e in entries]), entries=entries)

    @answers_with_status(s.ChangeInvisibleDurationResponse, echo=lambda r: {"receipt_handle": r.receipt_handle})
    def ChangeInvisibleDuration(self, request, context):
        self._client(context)
        changed = self.consuming.change_invisible_duration(request.group.name, request.topic.name,
                                                           request.receipt_handle,
                                                           convert.duration_ms(request.invisible_duration))
        return s.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=changed.receipt_handle)

    @answers_with_status(s.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request, context):
        self._client(context)
        dlq = self.consuming.forward_to_dead_letter(request.group.name, request.topic.name, request.receipt_handle)
        return s.ForwardMessageToDeadLetterQueueResponse(status=ok(f"moved to {dlq}"))

    # ---- not served ------------------------------------------------------------------------------------
    def PullMessage(self, request, context):
        yield s.PullMessageResponse(status=not_implemented("PullMessage (use ReceiveMessage)"))

    def UpdateOffset(self, request, context):
        return s.UpdateOffsetResponse(status=not_implemented("UpdateOffset"))

    def GetOffset(self, request, context):
        return s.GetOffsetResponse(status=not_implemented("GetOffset"))

    def QueryOffset(self, request, context):
        return s.QueryOffsetResponse(status=not_implemented("QueryOffset"))

    @answers_with_status(s.RecallMessageResponse)
    def RecallMessage(self, request, context):
        self._client(context)
        message_id = self.publisher.recall(request.topic.name, request.recall_handle)
        log.info("gateway.recalled", topic=request.topic.name[:127], message_id=message_id[:128])
        return s.RecallMessageResponse(status=ok(), message_id=message_id)

    def SyncLiteSubscription(self, request, context):
        return s.SyncLiteSubscriptionResponse(status=not_implemented("SyncLiteSubscription (lite topics)"))


def add_to_server(servicer: MessagingServicer, server: grpc.Server) -> None:
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)
