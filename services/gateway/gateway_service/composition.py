"""The gateway built on a LogPort, the same for both deployments (mqstore.gateway.log): gateway_service's
compose (Cluster mode, RemoteLog) and :func:`compose_local` (Local mode, LocalLog on the store of the commit
log's process, composed there by mqstore_launcher.node) call :func:`compose_gateway`.

Closers run in reverse: the registry's streams end, the check relay stops, then the Transaction client
closes (the caller registers the closers of what it made before calling: the clients, the store).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import grpc
import structlog
from mqstore import defaults
from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.gateway.checkback import CheckRelay
from mqstore.gateway.clients import ClientRegistry
from mqstore.gateway.config import GatewayConfig
from mqstore.gateway.consuming import Consuming
from mqstore.errors import InvalidArgument
from mqstore.gateway.log import LocalLog, LogPort, StoreLike
from mqstore.gateway.publishing import Publisher, TopicCache
from mqstore.gateway.renewal import Renewals
from mqstore.pop.service import PopService

from mqstore_rpc import service
from mqstore_rpc.peers import Peers
from mqstore_rpc.server import ServerConfig

from .servicer import SERVICE_NAME, MessagingServicer, add_to_server
from .txn_client import TxnClient

log = structlog.get_logger("gateway_service.composition")

DEFAULT_TXN = defaults.TXN_ADDRESS
DEFAULT_MAX_WORKERS = 256  # each client's Telemetry stream and each long poll holds a handler thread
HOUSEKEEPING_INTERVAL_S = 1.0
RENEWAL_INTERVAL_MAX_S = 1.0


class Housekeeping(Duty):
    """Duty "gateway-housekeeping": forgets silent clients and keeps one CheckBack stream per published topic
    (the registry's listener does that at once; this catches a stream whose duty is gone)."""

    def __init__(self, registry: ClientRegistry, relay: CheckRelay):
        super().__init__("gateway-housekeeping", interval_s=HOUSEKEEPING_INTERVAL_S)
        self.registry, self.relay = registry, relay

    def step(self) -> None:
        self.registry.expire()
        self.relay.sync()


class Renewal(Duty):
    """Duty "gateway-renewal": renews the invisible time of push consumers' messages (auto_renew) ahead of
    its end; it looks four times per auto_renew_ahead_ms (at most every second), so that a renewal is
    never later than the ahead time allows."""

    def __init__(self, renewals: Renewals, ahead_ms: int):
        super().__init__("gateway-renewal", interval_s=min(RENEWAL_INTERVAL_MAX_S, ahead_ms / 4000))
        self.renewals = renewals

    def step(self) -> None:
        self.renewals.renew_due()


@dataclasses.dataclass(frozen=True)
class LocalGatewayConfig:
    """Local mode: the gateway served by the commit log process on its own port (mqstore-commitlog
    ``--gateway-port``; ``--gateway-*`` flags, env ``MQSTORE_GATEWAY_*``)."""

    port: int                               # the MessagingService port; 0 = any free port (tests)
    txn_address: str = ""                   # the Transaction service (transactional sends, check-back); "" =
                                            # this process's own (--txn-port) if it serves one, else DEFAULT_TXN
    gateway: GatewayConfig = GatewayConfig()
    rpc_timeout_ms: int = 10_000            # each call to the Transaction service
    stream_deadline_ms: int = 600_000       # a CheckBack stream is re-opened this often
    max_workers: int = DEFAULT_MAX_WORKERS

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"gateway_port must be in 0..65535, not {self.port}")
        if self.rpc_timeout_ms <= 0 or self.stream_deadline_ms <= 0 or self.max_workers <= 0:
            raise InvalidArgument("gateway_rpc_timeout_ms, gateway_stream_deadline_ms and gateway_max_workers must "
                                  "be positive")


def compose_local(local: LocalGatewayConfig, server: ServerConfig, store: StoreLike,
                  pop_current: Callable[[], PopService], clock: Clock, parts: service.Composition,
                  local_txn_port: int | None = None, append: Callable | None = None,
                  recall: Callable[[str, str], int] | None = None) -> int:
    """Local mode: the gateway on this process's store and pop consumption (mqstore.gateway.log.LocalLog),
    served on a second port with this server's TLS, authentication and metrics. ``local_txn_port``: this
    process's Transaction port, if it serves one (the default Transaction service then); ``append``: the commit
    log's append that routes DELAY sends to its timer and ``recall`` its timer's recall (LocalLog). Returns the bound
    port."""
    config = dataclasses.replace(server, port=local.port, max_workers=local.max_workers,
                                 max_concurrent_rpcs=max(server.max_concurrent_rpcs, local.max_workers),
                                 metrics_port=None, max_running_handlers=0)  # uncapped, as gateway_service
    envelope = 64 * 1024  # as gateway_service's config checks: a body at the limit must fit in a request
    if config.max_message_bytes < local.gateway.max_body_bytes + envelope:
        raise InvalidArgument(f"the server's max_message_bytes ({config.max_message_bytes}) must exceed the "
                              f"gateway's max_body_bytes ({local.gateway.max_body_bytes}) by {envelope}")
    gateway_server, add_problem = parts.add_server("gateway", config, signed_requests=True)
    txn_address = local.txn_address or (DEFAULT_TXN if local_txn_port is None
                                        else f"{_reachable(server.host)}:{local_txn_port}")
    txn = transaction_client(txn_address, local.rpc_timeout_ms, local.stream_deadline_ms, parts.peers, parts)

    def serve(name: str, register: Callable[[grpc.Server], None]) -> None:
        register(gateway_server.grpc_server)
        gateway_server.add_service_names([name])

    compose_gateway(local.gateway, LocalLog(store, pop_current, append, recall), txn, clock, parts, serve, add_problem)
    log.info("gateway.local", port=gateway_server.port, txn_address=txn_address)
    return gateway_server.port


def _reachable(host: str) -> str:
    """How this process reaches its own port bound on ``host`` (a wildcard: the loopback address)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def transaction_client(address: str, rpc_timeout_ms: int, stream_deadline_ms: int, peers: Peers,
                       parts: service.Composition) -> TxnClient:
    """The Transaction service's client (closed with the composition). Its channel connects lazily: in
    Local mode the commit log starts before the Transaction service, which reads the log."""
    txn = TxnClient(address, rpc_timeout_s=rpc_timeout_ms / 1000, stream_deadline_s=stream_deadline_ms / 1000,
                    max_reconnect_backoff_ms=2_000, peers=peers)
    parts.on_close(txn.close)
    return txn


def compose_gateway(cfg: GatewayConfig, log: LogPort, txn: TxnClient, clock: Clock, parts: service.Composition,
                    serve: Callable[[str, Callable[[grpc.Server], None]], None],
                    add_health_problem: Callable[[Callable[[], str]], None]) -> MessagingServicer:
    """Build the gateway on ``log`` and ``txn``; its duties are ``parts``' and its closers too;
    ``serve(name, register)`` registers the servicer on the server that serves it; ``add_health_problem``
    makes that server NOT_SERVING while the check relay has a problem."""
    registry = ClientRegistry(clock, max_clients=cfg.max_clients, ttl_ms=cfg.client_ttl_ms,
                              outbox_limit=cfg.telemetry_outbox_limit, max_clients_per_user=cfg.max_clients_per_user,
                              max_streams_per_user=cfg.max_streams_per_user,
                              max_receives_per_user=cfg.max_receives_per_user)
    relay = CheckRelay(registry, txn.open_checks, txn, max_topics=cfg.max_checkback_topics,
                       pending_max=cfg.pending_checks_max, retry_max_ms=cfg.checkback_retry_max_ms)
    parts.on_close(relay.close)
    registry.on_change(relay.sync)
    parts.on_close(registry.close_all)
    add_health_problem(relay.problem)
    parts.add_duty(Housekeeping(registry, relay))
    topics = TopicCache(log.topic, clock, cfg.topic_cache_ms)
    publisher = Publisher(topics, cfg.max_body_bytes, log.append, txn.prepare, log.recall, clock)
    parts.metrics.counter_fn("mqstore_gateway_sends_sent_again_total", "appends the gateway sent again after the "
                             "commit log refused them unwritten (an election: --send-leader-wait-ms)",
                             lambda: publisher.sent_again)
    renewals = Renewals(log.pop, clock, invisible_ms=cfg.auto_renew_invisible_ms, ahead_ms=cfg.auto_renew_ahead_ms,
                        max_ms=cfg.auto_renew_max_ms, max_entries=cfg.auto_renew_max_messages,
                        alive=lambda client_id: registry.get(client_id) is not None)
    parts.add_duty(Renewal(renewals, cfg.auto_renew_ahead_ms))
    servicer = MessagingServicer(cfg, registry, topics, publisher, relay, Consuming(cfg, topics, log.pop, renewals),
                                 log.appends_at_once)
    serve(SERVICE_NAME, lambda server: add_to_server(servicer, server))
    return servicer
