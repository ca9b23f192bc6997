"""One client's Telemetry stream: the settings exchange, and the server's commands to the client.

The client writes its settings first (and again every 300 s, the Python client; on each reconnect, the
Node client); each write is answered with the settings the client must use (:func:`settings_reply`).
Between writes the stream carries the server's commands: here RecoverOrphanedTransactionCommand, the
check-back of a transaction (mqstore.gateway.checkback).

Two loops per stream: the handler's generator writes what the client's :class:`Outbox` holds, and a
reader thread (``gateway-telemetry-reader``) takes the client's writes, answering settings through the
same outbox. When the client's stream ends (or the server stops) the reader detaches the outbox from
the registry, which closes it, so the generator ends too.

Settings the clients depend on (rocketmq-v2-gateway.md §2; the Java proxy's GrpcClientSettingsManager):
a non-zero ``publishing.max_body_size`` (both clients copy it blindly, 0 breaks every later send), an
*exponential* backoff policy (Node asserts it), ``metric.on = false``; for consumers the long-polling
timeout clamped to [long_poll_min_ms, long_poll_max_ms], ``receive_batch_size`` and the delivery
attempts before the DLQ as ``backoff_policy.max_attempts``.
"""

from __future__ import annotations

import threading
from typing import Iterator

import grpc
import structlog
from mqstore.gateway.checkback import RecoverTransaction
from mqstore.gateway.clients import ClientRegistry, Outbox
from mqstore.gateway.config import GatewayConfig

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s

from . import convert
from .status import ok

log = structlog.get_logger("mqstore_rpc.gateway.telemetry")
POLL_S = 0.2   # how often the writer looks whether the call is still active


def settings_reply(settings: d.Settings, config: GatewayConfig) -> d.Settings:
    """The client's settings with the server's parts filled in (the proxy's merge)."""
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
        sub.fifo = False
        out.backoff_policy.CopyFrom(d.RetryPolicy(
            max_attempts=config.max_delivery_attempts, exponential_backoff=d.ExponentialBackoff(
                initial=convert.duration(1000), max=convert.duration(60_000), multiplier=2.0)))
    return out


def clamp_long_poll(asked_ms: int, config: GatewayConfig) -> int:
    return min(max(asked_ms, config.long_poll_min_ms), config.long_poll_max_ms)


def client_type_name(value: int) -> str:
    return d.ClientType.Name(value) if value in d.ClientType.values() else f"client type {value}"


def register_settings(registry: ClientRegistry, client_id: str, settings: d.Settings) -> None:
    topics = [r.name for r in settings.publishing.topics] if settings.HasField("publishing") else []
    group = settings.subscription.group.name if settings.HasField("subscription") else ""
    registry.apply_settings(client_id, client_type_name(settings.client_type), topics, group)


class TelemetryStream:
    """One open Telemetry call of ``client_id``; ``commands()`` is the response stream."""

    def __init__(self, registry: ClientRegistry, config: GatewayConfig, client_id: str):
        self.registry, self.config, self.client_id = registry, config, client_id
        self.outbox: Outbox = registry.attach(client_id)

    def commands(self, request_iterator, context: grpc.ServicerContext) -> Iterator[s.TelemetryCommand]:
        reader = threading.Thread(target=self._read, args=(request_iterator,), name="gateway-telemetry-reader",
                                  daemon=True)
        reader.start()
        try:
            while context.is_active():
                item = self.outbox.take(POLL_S)
                if item is None:
                    if self.outbox.closed:
                        return
                    continue
                yield self._command(item)
        finally:
            self.registry.detach(self.client_id, self.outbox)

    def _read(self, request_iterator) -> None:
        try:
            for command in request_iterator:
                self._handle(command)
        except grpc.RpcError:
            pass  # the client's stream broke: the client went away; the detach below says so
        finally:
            self.registry.detach(self.client_id, self.outbox)
            log.info("gateway.telemetry_closed", client_id=self.client_id)

    def _handle(self, command: s.TelemetryCommand) -> None:
        kind = command.WhichOneof("command")
        if kind == "settings":
            register_settings(self.registry, self.client_id, command.settings)
            self.outbox.put(s.TelemetryCommand(status=ok(), settings=settings_reply(command.settings, self.config)))
        else:  # thread stack traces, verify results: answers to commands the gateway never sends
            log.info("gateway.telemetry_ignored", client_id=self.client_id, command=kind or "none")

    @staticmethod
    def _command(item: object) -> s.TelemetryCommand:
        if isinstance(item, RecoverTransaction):
            command = s.RecoverOrphanedTransactionCommand(
                transaction_id=item.transaction_id, message=convert.message_out(item.message, topic=item.topic))
            return s.TelemetryCommand(status=ok(), recover_orphaned_transaction_command=command)
        return item  # a settings reply, built by _handle
