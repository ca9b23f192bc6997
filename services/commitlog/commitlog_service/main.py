"""Composition root of the CommitLog service: ``python -m commitlog_service.main --data-dir ./data``.

Configuration comes from flags, then ``MQSTORE_*`` environment variables, then defaults (flags win).
Every :class:`mqstore.config.StoreConfig` field has a flag and a variable named after it
(``segment_size_bytes`` -> ``--segment-size-bytes`` / ``MQSTORE_SEGMENT_SIZE_BYTES``; sizes accept
KiB/MiB/GiB suffixes). Every service's flags (mqstore_rpc.settings) are here too: ``--host``
(127.0.0.1; 0.0.0.0 only inside containers), ``--port`` (50051), ``--max-workers``,
``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``; ``--retention-hours`` is a shorthand for
``--retention-ms``; ``--store-port`` is the port written into message ids (default: the bound port);
``--append-on-loop auto|true|false`` makes the port a grpc.aio server whose Append is answered on its event
loop (auto, the default: under ``--flush-mode SYNC`` or ``--default-replication SYNC``; :func:`on_loop`);
``--internal-token`` / ``MQSTORE_INTERNAL_TOKEN`` is the shared secret of the CommitLogInternal service
(the Transaction service's way into its system topics; commitlog.proto). Pop consumption (the
``mqstore.v1.Consumer`` service on the same port, mqstore.pop) has the flags of
:class:`mqstore.pop.config.PopConfig` (``--pop-max-in-flight`` / ``MQSTORE_POP_MAX_IN_FLIGHT``, ...).
Replication (core/mqstore/replication/README.md): every :class:`ReplicationConfig` field has a flag and a
variable too: ``--node-id`` turns it on, ``--replica-of HOST:PORT`` makes a static replica of that leader,
``--etcd-endpoints`` elects the leader through etcd, ``--min-insync-replicas``, ``--default-replication
ASYNC|SYNC`` and the lag and timeout settings.
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
``--txn-cache-max-entries``, ...; one-way ends are applied on their stream's thread, so ``--txn-one-way-workers``
is unused). Its port is in ``server.started`` (``ports.txn``) and in the event
``txn.local``. A Local-mode gateway of the same process uses it unless ``--gateway-txn`` names another.
``MQSTORE_FAILPOINTS`` arms crash points (tests only).

The process runs as every service does (mqstore_rpc.service): JSON log lines on stderr, the first
after start ``server.started`` with the bound port; exit status 0 after SIGTERM/SIGINT, 1 when the
store cannot start (for example corruption that needs ``mqstore repair``), 2 for invalid configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import sys
from typing import Mapping, Sequence

from mqstore.auth.admin import AccessAdmin
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.config import FLUSH_SYNC, StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.gateway.config import GatewayConfig
from mqstore.meta.auth import AuthStore
from mqstore.pop.config import PopConfig
from mqstore.pop.leadership import PopLeadership
from mqstore.replication.config import SYNC, ReplicationConfig
from mqstore.replication.controller import Controller
from mqstore.replication.isr import IsrKeeper
from mqstore.replication.node import ReplicationNode
from mqstore.replication.replica import ReplicaFollower
from mqstore.store import MessageStore
from mqstore import system_writers  # noqa: F401  (registers every system writer's rules: mqstore.writers)
from mqstore.txn.config import TxnConfig
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.executor import RUNNING
from mqstore_rpc.gateway.composition import DEFAULT_MAX_WORKERS as GATEWAY_MAX_WORKERS
from mqstore_rpc.gateway.composition import DEFAULT_TXN, LocalGatewayConfig, compose_local
from mqstore_rpc.settings import default_auth_url
from mqstore_rpc.server import ManagedServer, ServerConfig
from mqstore_rpc.txn.composition import LocalTxnConfig
from mqstore_rpc.txn.composition import compose_local as compose_local_txn

from commitlog_service import access, consumer, internal, replication
from commitlog_service.etcd_client import EtcdCoordination
from commitlog_service.servicer import SERVICE_NAME, CommitLogServicer, LoopCommitLogServicer, add_to_server

DEFAULT_PORT = 50051
# StoreConfig fields that do not get a generic flag: set from other flags, or not user settings.
_NOT_FLAGS = {"data_dir", "store_port", "extra"}


@dataclasses.dataclass(frozen=True)
class CommitLogConfig:
    store: StoreConfig
    server: ServerConfig = ServerConfig()
    pop: PopConfig = PopConfig()  # pop consumption, the Consumer service (consumer.proto)
    advertised_port: int = 0      # port written into message ids; 0 = the bound port
    log_level: str = "info"
    failpoints: str = ""          # MQSTORE_FAILPOINTS spec, e.g. "log.after_write=exit"
    internal_token: str = ""      # shared secret of CommitLogInternal; "" = that service refuses every call
    replication: ReplicationConfig = ReplicationConfig()  # node_id "" = a single node (no replication)
    gateway: LocalGatewayConfig | None = None  # the RocketMQ 5 gateway in this process (Local mode); None = off
    txn: LocalTxnConfig | None = None  # the Transaction service in this process (Local mode); None = off
    append_on_loop: bool | None = None  # a grpc.aio port answering Append on its loop; None = when appends wait


def on_loop(config: CommitLogConfig) -> bool:
    """Whether the port is a grpc.aio server whose Append is answered on its event loop (servicer.py,
    LoopCommitLogServicer). By default only where appends wait (SYNC flush, or SYNC replication by default):
    there it measured ~10% more batched SYNC appends; under ASYNC the synchronous server answers single
    messages ~7-10% faster and batches alike (bench/README.md, *Append on the event loop*)."""
    if config.append_on_loop is not None:
        return config.append_on_loop
    return config.store.flush_mode == FLUSH_SYNC or (config.replication.enabled
                                                      and config.replication.default_replication == SYNC)


def compose(config: CommitLogConfig, parts: service.Composition) -> None:
    """Recover the store, rebuild pop consumption's in-flight set from it, and serve both; on stop the
    revive duty ends, pop offsets are stored, then the store stops."""
    store = MessageStore(dataclasses.replace(config.store, store_port=config.advertised_port or parts.port),
                         metrics=parts.metrics)
    store.start()
    parts.on_close(store.stop)
    node = _compose_replication(config, store, parts) if config.replication.enabled else None
    pop = PopLeadership(store, config.pop, leading_epoch=node.leading_epoch if node else lambda: 0,
                        ready=store.promoted_visible)
    parts.on_close(pop.close)
    if node is None:  # one node: pop consumption is rebuilt before the server serves
        parts.add_duty(pop.start_now().reviver)
    else:  # only the leader runs it, rebuilt at each leadership (mqstore.pop.leadership)
        parts.add_duty(pop)
    servicer = (LoopCommitLogServicer if on_loop(config) else CommitLogServicer)(store, auth=config.server.auth.enabled)
    parts.add_servicer(SERVICE_NAME, lambda server: add_to_server(servicer, server))
    parts.add_servicer(internal.INTERNAL_SERVICE_NAME, lambda server: internal.add_to_server(
        internal.CommitLogInternalServicer(store, config.internal_token), server))
    parts.add_servicer(consumer.CONSUMER_SERVICE_NAME, lambda server: consumer.add_to_server(
        consumer.ConsumerServicer(pop.current), server))
    parts.add_health_problem(store.health_problem)
    compose_access(config, parts)
    txn_port = None
    if config.txn is not None:  # before the gateway: its closers run after the gateway's
        txn_port = compose_local_txn(config.txn, config.server, store, store.clock, parts)
    if config.gateway is not None:  # its Transaction service: --gateway-txn, else the one above, if any
        compose_local(config.gateway, config.server, store, pop.current, store.clock, parts, txn_port)


def compose_access(config: CommitLogConfig, parts: service.Composition) -> None:
    """The Access service (users, rules, SDK keys) over the auth database every service shares; a change
    drops this server's caches at once. SDK secret keys are sealed under the kek file (made on first use;
    ``<data-dir>/auth.kek`` unless --auth-kek-file names another)."""
    auth_store = AuthStore(str(config.server.auth.url.reveal()) or default_auth_url(config.store.data_dir),
                           SystemClock())
    parts.on_close(auth_store.close)
    changed = parts.authority.invalidate if parts.authority is not None else (lambda: None)
    kek = Kek(pathlib.Path(config.server.auth.kek_file or config.store.data_dir / "auth.kek"), create=True)
    parts.add_servicer(access.SERVICE_NAME, lambda server: access.add_to_server(
        access.AccessServicer(AccessAdmin(auth_store, changed, kek)), server))


def _compose_replication(config: CommitLogConfig, store: MessageStore,
                         parts: service.Composition) -> ReplicationNode:
    """The node's replication role (core/mqstore/replication/README.md): a static group's replica copies
    ``replica_of``; otherwise this node leads a new epoch."""
    rc = config.replication
    if not rc.advertised_address:
        rc = dataclasses.replace(rc, advertised_address=f"{config.server.host}:{parts.port}")
    node = ReplicationNode(rc, store.clock, config.store.data_dir / "epochs", log_end=store.log_end,
                           flush_sync=config.store.flush_mode == "SYNC")
    node.on_promote = store.promote
    node.in_sync.on_committed = store.advance_visible
    store.gate = node
    kind = replication.LoopReplicationServicer if on_loop(config) else replication.ReplicationServicer
    servicer = kind(store, node)
    parts.add_servicer(replication.SERVICE_NAME, lambda server: replication.add_to_server(servicer, server))
    parts.add_duty(IsrKeeper(node.in_sync, lambda: node.is_leader))
    store.topics.reload_on_miss = True  # a replica, or a leader that was one, may miss topics created elsewhere
    if not rc.replica_of and not rc.etcd_endpoints:
        node.become_leader(node.history.last_epoch + 1, frozenset())  # a static group's leader: a new epoch
        return node
    link = replication.GrpcLeaderLink(rc.replication_heartbeat_ms, parts.peers)
    parts.on_close(link.close)
    follower = parts.add_duty(ReplicaFollower(store, node, link))
    if rc.replica_of:
        node.become_replica("", rc.replica_of, node.history.last_epoch)
        return node
    coordination = EtcdCoordination(rc.etcd_endpoints)
    parts.on_close(coordination.close)
    controller = Controller(node, coordination, on_leader_change=follower.leader_changed)
    node.in_sync.publish = controller.publish_isr
    servicer.controller = controller
    parts.add_duty(controller)
    return node


# ---- configuration ------------------------------------------------------------------------------------

def _store_fields() -> list[dataclasses.Field]:
    return S.config_fields(StoreConfig, skip=_NOT_FLAGS)


def _replication_fields() -> list[dataclasses.Field]:
    return S.config_fields(ReplicationConfig)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commitlog_service", description="mqstore CommitLog gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory")
    parser.add_argument("--store-port", help="port written into message ids (default: the bound port)")
    parser.add_argument("--retention-hours", help="shorthand for --retention-ms")
    parser.add_argument("--append-on-loop", help="auto (default: yes under --flush-mode SYNC or --default-replication "
                        "SYNC), true or false: serve the port on grpc.aio and answer Append on its event loop; env "
                        "MQSTORE_APPEND_ON_LOOP")
    S.add_flags(parser, PopConfig)
    for name, text in _GATEWAY_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    for f in S.config_fields(GatewayConfig):
        name = f"gateway_{f.name}"
        parser.add_argument(S.flag(name), dest=name, help=f"Local-mode gateway: {f.name} (services/gateway/README.md); "
                            f"env {S.env_name(name)}, default {f.default}")
    for name, text in _TXN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    for f in S.config_fields(TxnConfig, skip={"data_dir"}):
        name = f"txn_{f.name}"
        parser.add_argument(S.flag(name), dest=name, help=f"Local-mode Transaction service: {f.name} (README); "
                            f"env {S.env_name(name)}, default {f.default}")
    for f in [*_store_fields(), *_replication_fields()]:
        # A boolean flag alone means true (`--check-all`); `--check-all false` works too.
        switch = dict(nargs="?", const="true") if isinstance(f.default, bool) else {}
        parser.add_argument(S.flag(f.name), dest=f.name, help=f"env {S.env_name(f.name)}, default {f.default}",
                            **switch)
    return parser


_GATEWAY_FLAGS = {
    "gateway_port": "serve the RocketMQ 5 gateway (apache.rocketmq.v2.MessagingService) from this process on this "
                    "port (Local mode; 0 = any free port); unset = no gateway here",
    "gateway_txn": f"Local-mode gateway: the Transaction service's host:port (default: this process's own with "
                   f"--txn-port, else {DEFAULT_TXN})",
    "gateway_rpc_timeout_ms": "Local-mode gateway: timeout of each call to the Transaction service (default 10000)",
    "gateway_stream_deadline_ms": "Local-mode gateway: a CheckBack stream is re-opened this often (default 600000)",
    "gateway_max_workers": f"Local-mode gateway: handler threads of its port (default {GATEWAY_MAX_WORKERS})",
}


def _gateway_config(args: argparse.Namespace, env: Mapping[str, str], store: StoreConfig) -> LocalGatewayConfig | None:
    port = S.typed(args, env, "gateway_port", S.parse_int, None)
    if port is None:
        return None
    values = {f.name: S.typed(args, env, f"gateway_{f.name}", S.parser_for(f.default), f.default)
              for f in S.config_fields(GatewayConfig) if S.setting(args, env, f"gateway_{f.name}") is not None}
    values.setdefault("max_body_bytes", store.max_body_bytes)  # the gateway advertises what the store takes
    return LocalGatewayConfig(
        port=port, txn_address=S.typed(args, env, "gateway_txn", str, ""), gateway=GatewayConfig(**values),
        rpc_timeout_ms=S.typed(args, env, "gateway_rpc_timeout_ms", S.parse_int, 10_000),
        stream_deadline_ms=S.typed(args, env, "gateway_stream_deadline_ms", S.parse_int, 600_000),
        max_workers=S.typed(args, env, "gateway_max_workers", S.parse_int, GATEWAY_MAX_WORKERS))


_TXN_FLAGS = {
    "txn_port": "serve the Transaction service (mqstore.v1.Transaction) from this process on this port (Local mode; "
                "0 = any free port); unset = no Transaction service here",
    "txn_data_dir": "Local-mode Transaction service: its state directory (default <data-dir>/txn)",
    "txn_rpc_timeout_ms": "Local-mode Transaction service: how long a call waits for its append (default 10000)",
    "txn_max_workers": "Local-mode Transaction service: handler threads of its port (default 64 plus one per "
                       "stream it admits)",
}


def _txn_config(args: argparse.Namespace, env: Mapping[str, str], store: StoreConfig) -> LocalTxnConfig | None:
    port = S.typed(args, env, "txn_port", S.parse_int, None)
    if port is None:
        return None
    values = {f.name: S.typed(args, env, f"txn_{f.name}", S.parser_for(f.default), f.default)
              for f in S.config_fields(TxnConfig, skip={"data_dir"})
              if S.setting(args, env, f"txn_{f.name}") is not None}
    data_dir = S.typed(args, env, "txn_data_dir", pathlib.Path, store.data_dir / "txn")
    try:
        txn = TxnConfig(data_dir=data_dir, **values)
    except InvalidArgument as exc:  # the domain names its field: say which flag sets it
        raise InvalidArgument(f"Local-mode Transaction service (--txn-<field> / MQSTORE_TXN_<FIELD>): {exc}") from None
    return LocalTxnConfig(port=port, txn=txn,
                          rpc_timeout_ms=S.typed(args, env, "txn_rpc_timeout_ms", S.parse_int, 10_000),
                          max_workers=S.typed(args, env, "txn_max_workers", S.parse_int, None))


def _store_config(args: argparse.Namespace, env: Mapping[str, str]) -> StoreConfig:
    values = S.values_for(args, env, StoreConfig, _NOT_FLAGS)
    hours = S.typed(args, env, "retention_hours", float, None)
    if hours is not None:
        if "retention_ms" in values:
            raise InvalidArgument("retention: give retention_hours or retention_ms, not both")
        values["retention_ms"] = int(hours * 3600 * 1000)
    return StoreConfig(data_dir=S.data_dir(args, env), **values)


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> CommitLogConfig:
    args = build_arg_parser().parse_args(argv)
    store = _store_config(args, env)
    return CommitLogConfig(store=store, server=S.server_config(args, env, DEFAULT_PORT, default_running=RUNNING),
                           pop=PopConfig(**S.values_for(args, env, PopConfig)),
                           advertised_port=S.typed(args, env, "store_port", S.parse_int, 0),
                           log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env),
                           internal_token=S.internal_token(args, env),
                           replication=ReplicationConfig(**S.values_for(args, env, ReplicationConfig)),
                           gateway=_gateway_config(args, env, store), txn=_txn_config(args, env, store),
                           append_on_loop=S.typed(args, env, "append_on_loop", _auto_or_bool, None))


def _auto_or_bool(text: str) -> bool | None:
    return None if text.strip().lower() == "auto" else S.parse_bool(text)


def describe(config: CommitLogConfig, port: int) -> dict:
    store = {f.name: getattr(config.store, f.name) for f in dataclasses.fields(config.store)}
    store["store_port"] = config.advertised_port or port  # what compose gave the store
    return {"store": store, "server": dataclasses.asdict(config.server), "pop": dataclasses.asdict(config.pop),
            "replication": dataclasses.asdict(config.replication),
            "gateway": dataclasses.asdict(config.gateway) if config.gateway is not None else None,
            "txn": _describe_txn(config.txn), "append_on_loop": on_loop(config)}


def _describe_txn(local: LocalTxnConfig | None) -> dict | None:
    if local is None:
        return None
    described = dataclasses.asdict(dataclasses.replace(local, clock=None))
    described["txn"]["metadata_url"] = "<set>" if local.txn.metadata_url else ""  # it may hold a password
    return described


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe, aio=on_loop,
                             data_dir=lambda config: config.store.data_dir)


def build_server(config: CommitLogConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: CommitLogConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
