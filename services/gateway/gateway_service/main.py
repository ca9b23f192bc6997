"""Composition root of the RocketMQ 5 gateway: ``python -m gateway_service.main --port 8081``.

It serves ``apache.rocketmq.v2.MessagingService`` (port 8081 by default, RocketMQ's proxy port), so the
official RocketMQ 5 clients work unchanged, as a client of the other services: sends are
CommitLog(Internal).Append, transactional sends Transaction.Prepare/Commit/Rollback, the Transaction service's
check-back reaches producers over their Telemetry streams, and receives/acks are the Consumer service's
pop. It keeps nothing on disk: its state (the clients, their Telemetry streams, the checks in flight)
is in memory and rebuilt from the clients' own calls after a restart (see services/gateway/README.md).

Configuration: flags, then ``MQSTORE_*`` environment variables, then defaults (flags win). Every
service's flags (``--host``, ``--port`` 8081, ``--max-workers`` 256 here: each client's Telemetry stream
and each long poll holds a handler thread, ...; ``--data-dir`` is accepted and unused; ``--internal-token``,
env MQSTORE_INTERNAL_TOKEN, the commit log's: with it sends store the producer's address as born host); its own:
``--commitlog`` (env MQSTORE_COMMITLOG, default 127.0.0.1:50051), ``--txn`` (env MQSTORE_TXN, default
127.0.0.1:50053), ``--rpc-timeout-ms``, ``--stream-deadline-ms``, and one flag per field of
GatewayConfig (``--max-clients``, ``--client-ttl-ms``, ``--max-body-bytes``, ``--max-delivery-attempts``,
``--long-poll-max-ms``, ...). With ``--auth`` it also takes the RocketMQ SDKs' signed requests
(ServiceDef.signed_requests; their secret keys opened with ``--auth-kek-file``, services/gateway/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Mapping, Sequence

import structlog

from mqstore import defaults
from mqstore.clock import Clock, SystemClock
from mqstore.errors import InvalidArgument
from mqstore.gateway.config import GatewayConfig
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.server import ManagedServer, ServerConfig

from gateway_service.composition import compose_gateway, transaction_client
from gateway_service.remote_log import RemoteLog
from gateway_service.servicer import SERVICE_NAME

log = structlog.get_logger("gateway_service.main")

DEFAULT_PORT = defaults.GATEWAY_PORT
DEFAULT_MAX_WORKERS = 256
DEFAULT_COMMITLOG = defaults.COMMITLOG_ADDRESS
DEFAULT_TXN = defaults.TXN_ADDRESS


@dataclasses.dataclass(frozen=True)
class GatewayServiceConfig:
    gateway: GatewayConfig = GatewayConfig()
    server: ServerConfig = ServerConfig(port=DEFAULT_PORT, max_workers=DEFAULT_MAX_WORKERS)
    commitlog_address: str = DEFAULT_COMMITLOG
    txn_address: str = DEFAULT_TXN
    rpc_timeout_ms: int = 10_000
    stream_deadline_ms: int = 600_000   # a CheckBack stream is re-opened this often
    # CommitLogInternal's shared secret: with it, sends are appended as writer "gateway" and store the
    # producer's address as born host; without it, through the public Append (born host: the gateway's)
    internal_token: str = ""
    log_level: str = "info"
    failpoints: str = ""
    clock: Clock | None = None          # tests inject a FakeClock; main() leaves the system clock

    def __post_init__(self) -> None:
        if not self.commitlog_address or not self.txn_address:
            raise InvalidArgument("the commit log and Transaction service addresses (--commitlog, --txn) must not be "
                                  "empty")
        if self.rpc_timeout_ms <= 0 or self.stream_deadline_ms <= 0:
            raise InvalidArgument("rpc_timeout_ms and stream_deadline_ms must be positive")
        envelope = 64 * 1024  # a message's system properties and user properties around its body
        if self.server.max_message_bytes < self.gateway.max_body_bytes + envelope:
            raise InvalidArgument(f"the server's max_message_bytes ({self.server.max_message_bytes}) must exceed "
                                  f"max_body_bytes ({self.gateway.max_body_bytes}) by {envelope}: a body at the "
                                  f"advertised limit must fit in a request")


def compose(config: GatewayServiceConfig, parts: service.Composition) -> None:
    """Cluster mode: the gateway on the CommitLog service's gRPC API (mqstore.gateway.log). Closers run in
    reverse: the registry's streams end, the check relay stops, then the clients close."""
    # Sends are requests of one AppendBatchesStream (remote_log), on the latency path of every producer: no
    # retry machinery (a send that meets a broken connection fails as PROXY_TIMEOUT, and the client's own
    # backoff sends it again).
    log_client = CommitLogClient(config.commitlog_address, rpc_timeout_s=config.rpc_timeout_ms / 1000,
                                 peers=parts.peers, transparent_retries=False)
    parts.on_close(log_client.close)
    txn = transaction_client(config.txn_address, config.rpc_timeout_ms, config.stream_deadline_ms, parts.peers, parts)
    compose_gateway(config.gateway, RemoteLog(log_client, config.internal_token), txn,
                    config.clock or SystemClock(), parts, parts.add_servicer, parts.add_health_problem)


# ---- configuration ------------------------------------------------------------------------------------

_OWN_FLAGS = {
    "commitlog": f"CommitLog service host:port (default {DEFAULT_COMMITLOG})",
    "txn": f"Transaction service host:port, or host:port,host:port for an active/standby pair (a call the "
           f"standby refuses goes to the next) (default {DEFAULT_TXN})",
    "rpc_timeout_ms": "timeout of each call to the other services (default 10000)",
    "stream_deadline_ms": "a CheckBack stream to the Transaction service is re-opened this often (default 600000)",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway_service", description="mqstore's RocketMQ 5 gateway "
                                     "(apache.rocketmq.v2.MessagingService)")
    S.add_service_flags(parser, DEFAULT_PORT, "accepted and unused: the gateway keeps nothing on disk")
    for name, text in _OWN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    S.add_flags(parser, GatewayConfig)
    return parser


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> GatewayServiceConfig:
    args = build_arg_parser().parse_args(argv)
    server = S.server_config(args, env, DEFAULT_PORT)
    if S.setting(args, env, "max_workers") is None:
        server = dataclasses.replace(server, max_workers=DEFAULT_MAX_WORKERS,
                                     max_concurrent_rpcs=max(server.max_concurrent_rpcs, DEFAULT_MAX_WORKERS))
    return GatewayServiceConfig(
        gateway=GatewayConfig(**S.values_for(args, env, GatewayConfig)), server=server,
        commitlog_address=S.typed(args, env, "commitlog", str, DEFAULT_COMMITLOG),
        txn_address=S.typed(args, env, "txn", str, DEFAULT_TXN),
        rpc_timeout_ms=S.typed(args, env, "rpc_timeout_ms", S.parse_int, 10_000),
        stream_deadline_ms=S.typed(args, env, "stream_deadline_ms", S.parse_int, 600_000),
        internal_token=S.internal_token(args, env),
        log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env))


def describe(config: GatewayServiceConfig, port: int) -> dict:
    return {"gateway": dataclasses.asdict(config.gateway), "server": dataclasses.asdict(config.server),
            "commitlog_address": config.commitlog_address, "txn_address": config.txn_address,
            "born_host": "producer" if config.internal_token else "gateway"}  # never the token itself


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe, signed_requests=True)


def build_server(config: GatewayServiceConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: GatewayServiceConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
