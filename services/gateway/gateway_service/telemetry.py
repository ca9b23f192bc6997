"""One client's Telemetry stream: the settings exchange, and the server's commands to the client.

The client writes its settings first (and again every 300 s, the Python client; on each reconnect, the
Node client); each write is answered with the settings the client must use (:func:`settings_reply`).
Between writes the stream carries the server's commands: here RecoverOrphanedTransactionCommand, the
check-back of a transaction (mqstore.gateway.checkback).

Two loops per stream: the handler's generator writes what the client's :class:`Outbox` holds, and a
reader thread (``gateway-telemetry-reader-<n>``, one per stream) takes the client's writes, answering
settings through the same outbox. When the client's stream ends (or the server stops) the reader detaches
the outbox from the registry, which closes it, so the generator ends too. The reader is the stream's
helper, not background work: the gateway's port is synchronous, where reading the client's commands
blocks while the handler's thread waits on the outbox, so it needs a thread of its own. It lives exactly
as long as its call: grpc ends the request iterator (StopIteration or RpcError) once the call is over, and
the handler joins it (a bounded wait, READER_JOIN_S) when the call ended first; when the handler ends
first (the outbox closed: a takeover, a refused command) the reader ends as grpc closes the call, right
after. Their number is bounded by the port's concurrent calls and the users' Telemetry quotas.

Settings the clients depend on (rocketmq-v2-gateway.md §2; the Java proxy's GrpcClientSettingsManager):
a non-zero ``publishing.max_body_size`` (both clients copy it blindly, 0 breaks every later send), an
*exponential* backoff policy (Node asserts it), ``metric.on = false``; for consumers the long-polling
timeout clamped to [long_poll_min_ms, long_poll_max_ms], ``receive_batch_size`` and the delivery
attempts before the DLQ as ``backoff_policy.max_attempts``.

With authentication on, a stream belongs to its client's session and so to the session's user
(mqstore.gateway.clients): another user's stream with that client id is refused (PERMISSION_DENIED; the
session and its stream stay as they were) unless the caller is an ADMIN of the cluster, who takes the
session over. Every command is checked: settings by the interceptor (PUB on the publishing topics, SUB on
the group and the subscribed topics: the first command before the stream is attached, later ones as the
reader takes them), any command by the session's binding to the stream's user; a stream whose first
command is not settings only continues a session of this user whose settings came before (and the user
must still hold what they need), else it is refused: a client always writes its settings first. A later
command refused ends the stream with that refusal.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Iterator

import grpc
import structlog
from mqstore.access import ADMIN, CLUSTER_RESOURCE, PUB, SUB, group, topic
from mqstore.errors import MqStoreError, PermissionDenied
from mqstore.gateway.checkback import RecoverTransaction
from mqstore.gateway.clients import ClientRegistry, Outbox
from mqstore.gateway.config import GatewayConfig
from mqstore_rpc.auth import Caller, is_denial

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s

from . import convert
from .status import ok

log = structlog.get_logger("gateway_service.telemetry")
POLL_S = 0.2   # how often the writer looks whether the call is still active
READER_JOIN_S = 1.0  # the handler's wait for its reader once the call is over
_READERS = itertools.count(1)  # numbers the readers' thread names


def settings_reply(settings: d.Settings, config: GatewayConfig, fifo: bool = False) -> d.Settings:
    """The client's settings with the server's parts filled in (the proxy's merge); ``fifo``: the
    subscription's group is ordered (mqstore.pop.ordered; the proxy's consumeMessageOrderly)."""
    out = d.Settings()
    out.CopyFrom(settings)
    out.metric.CopyFrom(d.Metric(on=False))
    kind = settings.WhichOneof("pub_sub")
    if kind == "publishing" or settings.client_type == d.PRODUCER:
        out.publishing.max_body_size = config.max_body_bytes
        out.publishing.validate_message_type = True
        out.backoff_policy.CopyFrom(d.RetryPolicy(max_attempts=3, exponential_backoff=d.ExponentialBackoff(
            initial=convert.duration(10), max=convert.duration(1000), multiplier=2.0)))
    elif kind == "subscription":
        sub = out.subscription
        asked = convert.duration_ms(sub.long_polling_timeout) if sub.HasField("long_polling_timeout") else 0
        sub.long_polling_timeout.CopyFrom(convert.duration(clamp_long_poll(asked, config)))
        sub.receive_batch_size = config.receive_batch_max
        sub.fifo = fifo
        out.backoff_policy.CopyFrom(d.RetryPolicy(
            max_attempts=config.max_delivery_attempts, exponential_backoff=d.ExponentialBackoff(
                initial=convert.duration(1000), max=convert.duration(60_000), multiplier=2.0)))
    return out


def clamp_long_poll(asked_ms: int, config: GatewayConfig) -> int:
    return min(max(asked_ms, config.long_poll_min_ms), config.long_poll_max_ms)


def client_type_name(value: int) -> str:
    return d.ClientType.Name(value) if value in d.ClientType.values() else f"client type {value}"


def register_settings(registry: ClientRegistry, client_id: str, settings: d.Settings, user: str | None = None) -> None:
    topics = [r.name for r in settings.publishing.topics] if settings.HasField("publishing") else []
    group = settings.subscription.group.name if settings.HasField("subscription") else ""
    registry.apply_settings(client_id, client_type_name(settings.client_type), topics, group, user)


def as_caller(caller: Caller | None, action):
    """``action()``, a registry call for ``caller``: a PermissionDenied it raises (another user's client id)
    is the caller's denial (logged and counted as the interceptor's, answered PERMISSION_DENIED)."""
    try:
        return action()
    except PermissionDenied as exc:
        if caller is None or is_denial(exc):  # no users; or logged and counted already
            raise
        caller.refuse(exc)


def is_admin(caller: Caller) -> bool:
    """Whether ``caller`` holds ADMIN on the cluster (mqstore.gateway.clients: an admin may end or take
    over another user's session)."""
    return caller.allowed(ADMIN, CLUSTER_RESOURCE)


class TelemetryStream:
    """One open Telemetry call of ``client_id``; ``commands()`` is the response stream. ``caller``: the
    authenticated caller (None: authentication is off), ``first``: the first command, read and checked by
    the interceptor already (with authentication on)."""

    def __init__(self, registry: ClientRegistry, config: GatewayConfig, client_id: str, caller: Caller | None = None,
                 first: s.TelemetryCommand | None = None, ordered: Callable[[str], bool] | None = None):
        """``ordered(group)``: whether a consumer group is ordered (shown as subscription.fifo)."""
        self.registry, self.config, self.client_id, self.caller = registry, config, client_id, caller
        self.ordered = ordered
        self.user = caller.name if caller is not None else None
        self.admin = caller is not None and is_admin(caller)
        self.first = first
        self.failure: MqStoreError | None = None   # what ended the stream from the reader (before its close)
        if caller is not None and first is not None and first.WhichOneof("command") != "settings":
            as_caller(caller, self._continues)
        self.outbox: Outbox = as_caller(caller, self._attach)

    def _attach(self) -> Outbox:
        return self.registry.attach(self.client_id, self.user, admin=self.admin)

    def _continues(self) -> None:
        """A stream that does not begin with settings continues a session of this user with settings: the
        user must still hold what they need; PermissionDenied otherwise."""
        session = self.registry.continued(self.client_id, self.user, admin=self.admin)
        if session is None:
            return
        for name in sorted(session.topics):
            self.caller.require(PUB, topic(name))
        if session.group:
            self.caller.require(SUB, group(session.group))

    def commands(self, request_iterator, context: grpc.ServicerContext) -> Iterator[s.TelemetryCommand]:
        if self.first is not None:
            request_iterator = itertools.chain((self.first,), request_iterator)
        reader = threading.Thread(target=self._read, args=(request_iterator,), daemon=True,
                                  name=f"gateway-telemetry-reader-{next(_READERS)}")
        reader.start()
        try:
            while context.is_active():
                item = self.outbox.take(POLL_S)
                if item is None:
                    if self.outbox.closed:
                        if self.failure is not None:
                            raise self.failure
                        return
                    continue
                yield self._command(item)
        finally:
            self.registry.detach(self.client_id, self.outbox)
            if not context.is_active():  # the call is over, so its request iterator ends: the reader with it
                reader.join(READER_JOIN_S)

    def _read(self, request_iterator) -> None:
        try:
            for command in request_iterator:
                self._handle(command)
        except grpc.RpcError:
            pass  # the client's stream broke: the client went away; the detach below says so
        except MqStoreError as exc:  # a command refused (the interceptor's check, or the session's user)
            self.failure = exc
        finally:
            self.registry.detach(self.client_id, self.outbox)
            log.info("gateway.telemetry_closed", client_id=self.client_id, refused=self.failure is not None)

    def _handle(self, command: s.TelemetryCommand) -> None:
        kind = command.WhichOneof("command")
        if kind == "settings":
            as_caller(self.caller, lambda: register_settings(self.registry, self.client_id, command.settings,
                                                             self.user))
            group = command.settings.subscription.group.name if command.settings.HasField("subscription") else ""
            fifo = bool(group) and self.ordered is not None and self.ordered(group)
            self.outbox.put(s.TelemetryCommand(status=ok(), settings=settings_reply(command.settings, self.config,
                                                                                   fifo)))
        else:  # thread stack traces, verify results: answers to commands the gateway never sends
            if self.caller is not None:  # still this user's session (a sign of life)
                as_caller(self.caller, lambda: self.registry.touch(self.client_id, user=self.user))
            log.info("gateway.telemetry_ignored", client_id=self.client_id, command=kind or "none")

    @staticmethod
    def _command(item: object) -> s.TelemetryCommand:
        if isinstance(item, RecoverTransaction):
            command = s.RecoverOrphanedTransactionCommand(
                transaction_id=item.transaction_id, message=convert.message_out(item.message, topic=item.topic))
            return s.TelemetryCommand(status=ok(), recover_orphaned_transaction_command=command)
        return item  # a settings reply, built by _handle
