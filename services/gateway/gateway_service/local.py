"""The Local-mode gateway's settings on the commit log's command line (``mqstore-commitlog``, composed by
mqstore_launcher.node): ``--gateway-port PORT`` (env ``MQSTORE_GATEWAY_PORT``) turns it on;
``--gateway-txn``, ``--gateway-rpc-timeout-ms``, ``--gateway-stream-deadline-ms``, ``--gateway-max-workers``
and ``--gateway-<field>`` for each field of GatewayConfig (``--gateway-max-body-bytes`` defaults to the
store's ``--max-body-bytes``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Mapping

from mqstore.config import StoreConfig
from mqstore.gateway.config import GatewayConfig

from mqstore_rpc import settings as S

from .composition import DEFAULT_MAX_WORKERS, DEFAULT_TXN, LocalGatewayConfig

FLAGS = {
    "gateway_port": "serve the RocketMQ 5 gateway (apache.rocketmq.v2.MessagingService) from this process on this "
                    "port (Local mode; 0 = any free port); unset = no gateway here",
    "gateway_txn": f"Local-mode gateway: the Transaction service's host:port (default: this process's own with "
                   f"--txn-port, else {DEFAULT_TXN})",
    "gateway_rpc_timeout_ms": "Local-mode gateway: timeout of each call to the Transaction service (default 10000)",
    "gateway_stream_deadline_ms": "Local-mode gateway: a CheckBack stream is re-opened this often (default 600000)",
    "gateway_max_workers": f"Local-mode gateway: handler threads of its port (default {DEFAULT_MAX_WORKERS})",
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    S.add_texts(parser, FLAGS)
    S.add_flags(parser, GatewayConfig, prefix="gateway_",
                about="Local-mode gateway: {field} (services/gateway/README.md)")


def parse(args: argparse.Namespace, env: Mapping[str, str], store: StoreConfig) -> LocalGatewayConfig | None:
    port = S.typed(args, env, "gateway_port", S.parse_int, None)
    if port is None:
        return None
    values = S.values_for(args, env, GatewayConfig, prefix="gateway_")
    values.setdefault("max_body_bytes", store.max_body_bytes)  # the gateway advertises what the store takes
    return LocalGatewayConfig(
        port=port, txn_address=S.typed(args, env, "gateway_txn", str, ""), gateway=GatewayConfig(**values),
        rpc_timeout_ms=S.typed(args, env, "gateway_rpc_timeout_ms", S.parse_int, 10_000),
        stream_deadline_ms=S.typed(args, env, "gateway_stream_deadline_ms", S.parse_int, 600_000),
        max_workers=S.typed(args, env, "gateway_max_workers", S.parse_int, DEFAULT_MAX_WORKERS))


def describe(local: LocalGatewayConfig | None) -> dict | None:
    return dataclasses.asdict(local) if local is not None else None
