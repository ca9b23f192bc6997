"""A commit log node with what Local mode hosts on it: ``mqstore-commitlog`` (console script) or
``python -m mqstore_launcher.node --data-dir ./data``; every flag of the CommitLog service
(commitlog_service.main) plus Local mode's, composed here because only this package may import more than
one service (tests/test_layering.py). Without a Local-mode flag it is the CommitLog service alone.

Local mode of the RocketMQ 5 gateway (services/gateway/README.md, *Cluster mode and Local mode*):
``--gateway-port PORT`` (env ``MQSTORE_GATEWAY_PORT``) serves ``apache.rocketmq.v2.MessagingService`` on that
port from this process, sends going straight to the store; ``--gateway-txn HOST:PORT`` is the Transaction
service (default: this process's own with ``--txn-port``, else 127.0.0.1:50053), ``--gateway-rpc-timeout-ms``,
``--gateway-stream-deadline-ms``, ``--gateway-max-workers`` (256) and ``--gateway-<field>`` for each field of
GatewayConfig (``--gateway-max-clients``, ...; ``--gateway-max-body-bytes`` defaults to the store's
``--max-body-bytes``).
Local mode of the Transaction service (README, *Transaction service: Cluster mode and Local mode*):
``--txn-port PORT`` (env ``MQSTORE_TXN_PORT``; 0 = any free port) serves ``mqstore.v1.Transaction`` on that
port from this process, its half, OP and COMMIT records going straight to the store; its state (checkpoint
journal, audit database) is in ``--txn-data-dir`` (default ``<data-dir>/txn``), ``--txn-rpc-timeout-ms``
(10000: how long a call waits for its append), ``--txn-max-workers`` (default: 64 plus one per stream it
admits) and ``--txn-<field>`` for each field of TxnConfig (``--txn-op-batch-max-bytes``,
``--txn-cache-max-entries``, ...). Its port is in ``server.started`` (``ports.txn``) and in the event
``txn.local``. A Local-mode gateway of the same process uses it unless ``--gateway-txn`` names another.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Mapping, Sequence

from mqstore.config import StoreConfig
from mqstore_rpc import service
from mqstore_rpc.server import ManagedServer

from commitlog_service import main as commitlog
from commitlog_service.main import CommitLogConfig, Host, HostedFlags
from gateway_service import composition as gateway_composition
from gateway_service import local as gateway_local
from gateway_service.composition import LocalGatewayConfig
from txn_service import composition as txn_composition
from txn_service import local as txn_local
from txn_service.composition import LocalTxnConfig


@dataclasses.dataclass(frozen=True)
class LocalMode:
    """What Local mode hosts on a commit log (commitlog_service.main.Hosted): the gateway and the Transaction
    service, each on a port of its own, or neither (None). Immutable."""

    gateway: LocalGatewayConfig | None = None
    txn: LocalTxnConfig | None = None

    def compose(self, host: Host, parts: service.Composition) -> None:
        store, server = host.store, host.config.server
        txn_port = None
        if self.txn is not None:  # before the gateway: its closers run after the gateway's
            txn_port = txn_composition.compose_local(self.txn, server, store, store.clock, parts)
        if self.gateway is not None:  # its Transaction service: --gateway-txn, else the one above, if any
            scheduler = host.scheduler
            gateway_composition.compose_local(self.gateway, server, store, host.pop, store.clock, parts, txn_port,
                                              scheduler.append if scheduler is not None else None,
                                              scheduler.recall if scheduler is not None else None)

    def describe(self) -> dict:
        return {"gateway": gateway_local.describe(self.gateway), "txn": txn_local.describe(self.txn)}


def _add_flags(parser: argparse.ArgumentParser) -> None:
    gateway_local.add_flags(parser)
    txn_local.add_flags(parser)


def _parse(args: argparse.Namespace, env: Mapping[str, str], store: StoreConfig) -> LocalMode:
    return LocalMode(gateway=gateway_local.parse(args, env, store), txn=txn_local.parse(args, env, store))


LOCAL_MODE = HostedFlags(_add_flags, _parse)


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> CommitLogConfig:
    """The commit log's settings with Local mode's (``hosted`` holds one LocalMode, off unless a port is given)."""
    return commitlog.parse_config(argv, env, (LOCAL_MODE,))


def build_arg_parser() -> argparse.ArgumentParser:
    return commitlog.build_arg_parser((LOCAL_MODE,))


def local_mode(config: CommitLogConfig) -> LocalMode:
    """The LocalMode a config hosts (an empty one if none)."""
    return next((part for part in config.hosted if isinstance(part, LocalMode)), LocalMode())


def with_local_mode(config: CommitLogConfig, gateway: LocalGatewayConfig | None = None,
                    txn: LocalTxnConfig | None = None) -> CommitLogConfig:
    """``config`` hosting the gateway and/or the Transaction service (tests and benchmarks, in process)."""
    return dataclasses.replace(config, hosted=(LocalMode(gateway, txn),))


SERVICE = dataclasses.replace(commitlog.SERVICE, parse_config=parse_config)


def build_server(config: CommitLogConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: CommitLogConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
