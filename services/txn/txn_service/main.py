"""Composition root of the Transaction service: ``python -m txn_service.main --data-dir ./data/txn``.

Configuration: flags, then ``MQSTORE_*`` environment variables, then defaults (flags win). Every
service's flags (``--data-dir``, ``--host``, ``--port`` 50053, ...); its own: ``--commitlog`` (env
MQSTORE_COMMITLOG, default 127.0.0.1:50051), ``--internal-token`` (env MQSTORE_INTERNAL_TOKEN: the
commit log's shared secret for CommitLogInternal; prefer the variable), ``--rpc-timeout-ms``,
``--tail-stream-deadline-ms``, and one flag per field of TxnConfig (``--op-batch-max-bytes``,
``--op-batch-interval-ms``, ``--cache-max-entries``, ``--cache-max-bytes``, ``--transaction-timeout-ms``,
``--check-max``, ``--check-interval-ms``, ``--max-open-transactions``, ``--in-doubt-settle-ms``,
``--max-check-streams``, ``--max-transact-streams``, ``--check-answer-workers``, ``--metadata-url``, ...)
and FollowConfig. Every open CheckBack stream holds a handler thread (a Transact stream is served on the event
loop of the server, a grpc.aio one, and holds none); unless ``--max-workers`` is given the server gets the usual
64 threads plus one per stream it admits.
``MQSTORE_FAILPOINTS`` arms crash points (tests only).

High availability: ``--etcd-endpoints`` (with ``--etcd-prefix``, ``--lease-ttl-s``, ``--advertised-address``)
makes it one of an active and standby group (mqstore.txn.election): the standby follows the log, answers
Prepare/Commit/Rollback/CheckBack UNAVAILABLE naming the active one (its health is SERVING: it is up and
warm), and takes over when the active one's lease lapses, once it has read the log to its end.

Runs as every service does (mqstore_rpc.service). Until its follower has read the log up to the end it
saw at start, Prepare/Commit/Rollback/CheckBack answer UNAVAILABLE "recovering" (txn.proto), and its
health is NOT_SERVING. The follower holds the commit log's retention below its position (as "txn") and
stops at a gap rather than skip records it never applied (GapPolicy.STOP: health NOT_SERVING, Stats and
the log event ``follower.gap`` say why): the table cannot be rebuilt without them.

This is Cluster mode: the service in its own process, on the commit log over gRPC (RemoteTxnLog). The same
service (txn_service.composition) runs inside the commit log process in Local mode
(``mqstore-commitlog --txn-port``, composed by mqstore_launcher.node; README, *The Transaction service*).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Mapping, Sequence

from mqstore import defaults, fs
from mqstore.clock import Clock, SystemClock
from mqstore.errors import InvalidArgument
from mqstore.follow import FollowConfig
from mqstore.replication.config import ReplicationConfig
from mqstore.txn.config import TxnConfig
from mqstore.txn.election import TxnElection
from mqstore.txn.log import HOLD_NAME, instance_hold
from mqstore.txn.projection import txn_follower
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.server import ManagedServer, ServerConfig

# the commit log's etcd client (the one its controller uses; tests/test_layering.py allows this import)
from mqstore_rpc.etcd_client import EtcdCoordination
from txn_service.composition import compose_txn, server_threads
from txn_service.remote_log import RemoteTxnLog
from txn_service.servicer import SERVICE_NAME

INSTANCE_ID_FILE = "instance.id"  # this instance's id when it is one of a group: its retention hold txn-<id>

__all__ = ["HOLD_NAME", "RemoteTxnLog", "txn_follower"]  # the follower's parts, for tests

DEFAULT_PORT = defaults.TXN_PORT
DEFAULT_COMMITLOG = defaults.COMMITLOG_ADDRESS
DEFAULT_ETCD_PREFIX = "/mqstore/txn"


@dataclasses.dataclass(frozen=True)
class TxnServiceConfig:
    txn: TxnConfig
    server: ServerConfig = ServerConfig()
    commitlog_address: str = DEFAULT_COMMITLOG
    internal_token: str = ""
    follow: FollowConfig = FollowConfig()
    rpc_timeout_ms: int = 10_000
    tail_stream_deadline_ms: int = 60_000
    log_level: str = "info"
    failpoints: str = ""
    clock: Clock | None = None    # tests inject a FakeClock; main() leaves the system clock
    etcd_endpoints: str = ""      # "" = runs alone; else active/standby through an etcd lease (mqstore.txn.election)
    etcd_prefix: str = DEFAULT_ETCD_PREFIX
    lease_ttl_s: int = ReplicationConfig.lease_ttl_s
    advertised_address: str = ""  # the address the standby names; "" = <host>:<bound port>

    def __post_init__(self) -> None:
        if not self.commitlog_address:
            raise InvalidArgument("commitlog address (--commitlog / MQSTORE_COMMITLOG) must not be empty")
        if self.rpc_timeout_ms <= 0 or self.tail_stream_deadline_ms <= 0:
            raise InvalidArgument("rpc_timeout_ms and tail_stream_deadline_ms must be positive")
        if self.lease_ttl_s < 2:
            raise InvalidArgument(f"lease_ttl_s must be at least 2 (the active one fences itself a second before its "
                                  f"lease can lapse), not {self.lease_ttl_s}")


def compose(config: TxnServiceConfig, parts: service.Composition) -> None:
    """Cluster mode: the Transaction service (txn_service.composition) on the commit log over gRPC
    (RemoteTxnLog); the client closes after everything built on it."""
    client = CommitLogClient(config.commitlog_address, rpc_timeout_s=config.rpc_timeout_ms / 1000,
                             stream_deadline_s=config.tail_stream_deadline_ms / 1000,
                             max_reconnect_backoff_ms=config.follow.backoff_max_ms, peers=parts.peers)
    parts.on_close(client.close)
    parts.server.add_loop_closer(client.close_async)
    # one of a group holds the log's retention under a name of its own (kept in its data dir across restarts)
    hold = instance_hold(fs.kept_id(config.txn.data_dir / INSTANCE_ID_FILE)) if config.etcd_endpoints else HOLD_NAME
    txn_log = RemoteTxnLog(client, config.internal_token, config.txn.follow_linger_ms, hold_name=hold)
    clock = config.clock or SystemClock()
    standby = "standby: waiting for the etcd election" if config.etcd_endpoints else ""
    servicer = compose_txn(config.txn, config.follow, config.rpc_timeout_ms, txn_log, clock, parts,
                           parts.add_servicer, parts.add_health_problem, parts.health_changed,
                           loop_pool=parts.server.pool, standby=standby)
    if config.etcd_endpoints:
        coordination = EtcdCoordination(config.etcd_endpoints)
        parts.on_close(coordination.close)
        host = config.server.host if config.server.host not in ("", "0.0.0.0", "::", "[::]") else "127.0.0.1"
        election = TxnElection(coordination, config.etcd_prefix, config.advertised_address or f"{host}:{parts.port}",
                               servicer.table, txn_log.max_physical_offset, clock,
                               ttl_s=config.lease_ttl_s)
        txn_log.gate = election.check_active
        servicer.role = lambda: ("active" if election.active else "standby", election.active_address)
        parts.add_duty(election)


# ---- configuration ------------------------------------------------------------------------------------

_OWN_FLAGS = {
    "commitlog": f"CommitLog service host:port (default {DEFAULT_COMMITLOG})",
    "rpc_timeout_ms": "timeout of each call to the commit log (default 10000)",
    "tail_stream_deadline_ms": "a Tail stream is re-opened this often (default 60000)",
    "etcd_endpoints": "etcd host:port[,host:port]: run as the active or the standby of a group of Transaction "
                      "services sharing --etcd-prefix (the lease's holder serves; the others answer UNAVAILABLE "
                      "naming it and follow the log); unset = runs alone",
    "etcd_prefix": f"the group's etcd key prefix (default {DEFAULT_ETCD_PREFIX}: <prefix>/active)",
    "lease_ttl_s": f"the active one's etcd lease in seconds, at least 2 (default {ReplicationConfig.lease_ttl_s}, "
                   f"the commit log's); it stops writing a second or more before the lease can lapse",
    "advertised_address": "host:port the standby names to clients (default <host>:<bound port>)",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txn_service", description="mqstore Transaction gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory (checkpoint, audit database)")
    for name, text in _OWN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    S.add_flags(parser, TxnConfig, skip={"data_dir"})
    S.add_flags(parser, FollowConfig)
    return parser


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> TxnServiceConfig:
    args = build_arg_parser().parse_args(argv)
    txn = TxnConfig(data_dir=S.data_dir(args, env), **S.values_for(args, env, TxnConfig, {"data_dir"}))
    server = S.server_config(args, env, DEFAULT_PORT)
    if S.setting(args, env, "max_workers") is None:  # every open stream holds a handler thread: room for them too
        server = dataclasses.replace(server, max_workers=server_threads(txn))
    return TxnServiceConfig(
        txn=txn,
        server=server,
        commitlog_address=S.typed(args, env, "commitlog", str, DEFAULT_COMMITLOG),
        internal_token=S.internal_token(args, env),
        follow=FollowConfig(**S.values_for(args, env, FollowConfig)),
        rpc_timeout_ms=S.typed(args, env, "rpc_timeout_ms", S.parse_int, 10_000),
        tail_stream_deadline_ms=S.typed(args, env, "tail_stream_deadline_ms", S.parse_int, 60_000),
        etcd_endpoints=S.typed(args, env, "etcd_endpoints", str, ""),
        etcd_prefix=S.typed(args, env, "etcd_prefix", str, DEFAULT_ETCD_PREFIX),
        lease_ttl_s=S.typed(args, env, "lease_ttl_s", S.parse_int, ReplicationConfig.lease_ttl_s),
        advertised_address=S.typed(args, env, "advertised_address", str, ""),
        log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env))


def describe(config: TxnServiceConfig, port: int) -> dict:
    # The metadata URL may hold a password: only whether it is set.
    txn = dataclasses.asdict(config.txn) | {"metadata_url": "<set>" if config.txn.metadata_url else ""}
    return {"txn": txn, "server": dataclasses.asdict(config.server),
            "follow": dataclasses.asdict(config.follow), "commitlog_address": config.commitlog_address,
            "etcd_endpoints": config.etcd_endpoints, "etcd_prefix": config.etcd_prefix,
            "lease_ttl_s": config.lease_ttl_s}


# grpc.aio: Prepare, Commit and Transact's frames are answered on the server's event loop, their appends
# awaited there (txn_service.servicer.TransactionServicer, through mqstore.txn.onloop.LoopCalls)
SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe,
                             data_dir=lambda config: config.txn.data_dir)


def build_server(config: TxnServiceConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: TxnServiceConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
