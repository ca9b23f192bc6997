"""Composition root of the Compactor service: ``python -m compactor_service.main --data-dir ./data/compactor``.

Configuration: flags, then ``MQSTORE_*`` environment variables, then defaults (mqstore_rpc.settings).
Every service's flags (``--data-dir``: the compaction logs go to ``<data-dir>/logs``, the follower's
checkpoint to ``<data-dir>/follower.checkpoint``; ``--host``, ``--port`` 50054, ...). Its own:
``--commitlog`` (env MQSTORE_COMMITLOG, default 127.0.0.1:50051), ``--rpc-timeout-ms``,
``--tail-stream-deadline-ms``, ``--checkpoint-interval-ms``, ``--spark-threshold-bytes``, and one
flag per field of CompactionConfig (``--segment-size-bytes``, ``--offset-map-memory-bytes``,
``--min-cleanable-dirty-ratio``, ``--min-compaction-lag-ms``, ``--max-compaction-lag-ms``,
``--delete-retention-ms``, ...) and FollowConfig (``--heartbeat-ms``, ``--backoff-max-ms``, ...).

``--spark-tier-url`` (file:///DIR or s3://BUCKET[/PREFIX]; S3 settings from the AWS_* variables): Spark rounds
go through that object storage, no directory is shared with the executors (compactor_service.spark_runner).

The object storage tier of compaction log segments (mqstore.compaction.tier_config.CompactionTierConfig):
``--tier-url`` (file:///DIR or s3://BUCKET[/PREFIX]; S3 settings from the AWS_* variables, ``--tier-endpoint``,
``--tier-region``), ``--tier-upload-interval-ms``, ``--tier-call-timeout-ms``, ``--tier-read-timeout-ms``,
``--local-retention-ms/-bytes``, ``--tier-read-ahead-bytes``, ``--tier-cache-bytes``: the active compactor
uploads sealed segments under ``compaction/<instance id>/`` (the instance id as with etcd) and deletes their
local copies; every instance reads its own tiered segments. The tier's manifest is read at start; a start
while the tier does not answer goes on (local segments served, tiered ones UNAVAILABLE naming the tier, their
rounds waiting) and the tier's duty reads it once the tier answers (mqstore.compaction.tier).

``--etcd-endpoints`` (with ``--etcd-prefix``, ``--lease-ttl-s``, ``--instance-id``): one of several
compactors, each following the commit log and answering reads, the lease holder running rounds
(compactor_service.lease); its retention hold is then ``compactor-<instance id>``.

The process runs as every service does (mqstore_rpc.service). It starts even when the commit log is
not reachable yet: reads answer from the compaction logs it holds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import pathlib
import sys
from typing import Mapping, Sequence

from mqstore import defaults, fs, retention_holds
from mqstore.clock import SystemClock
from mqstore.compaction.api import CompactorApi, RoundDuty, ServiceStats
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.projection import HOLD_NAME, CompactionProjection, compactor_follower
from mqstore.compaction.store import CompactionStore
from mqstore.compaction.tier import TierDuty, open_tier
from mqstore.compaction.tier_config import CompactionTierConfig
from mqstore.errors import InvalidArgument
from mqstore.follow import FollowConfig
from mqstore.tier.config import TierConfig
from mqstore.tier.urls import open_store
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.server import ManagedServer, ServerConfig

from mqstore_rpc.etcd_client import EtcdCoordination

from .lease import RoundLease
from .replica import ReplicaDuty
from .tail import HoldingSource
from .servicer import SERVICE_NAME, CompactorServicer, add_to_server
from . import spark_runner

DEFAULT_PORT = defaults.COMPACTOR_PORT
DEFAULT_COMMITLOG = defaults.COMMITLOG_ADDRESS
# Measured (bench/compactor.py, bench/results/compactor.md, 2 cores, two runs): a local round does 34-130 MB/s;
# the Spark job on local[*] took 22-73 s for 24 MiB, 31-82 s for 72 MiB and 65-129 s for 264 MiB (20-70 s
# fixed, then 4-6 MiB/s): no crossover up to 264 MiB, and none to expect on one machine. Spark pays off only
# on a cluster whose workers together out-scan one machine, so auto sends a round there only when it is far
# past what a local round does in minutes: 64 GiB (10-30 minutes locally).
DEFAULT_SPARK_THRESHOLD_BYTES = 64 << 30
DEFAULT_ETCD_PREFIX = "/mqstore/compactor"
INSTANCE_ID_FILE = "instance.id"


def instance_id(config: "CompactorServiceConfig") -> str:
    """``--instance-id``, else the one kept in ``<data-dir>/instance.id`` (made at the first start), so that a
    restarted instance holds the log's retention under the same name."""
    if config.instance_id:
        return config.instance_id
    return fs.kept_id(pathlib.Path(config.data_dir) / INSTANCE_ID_FILE)


@dataclasses.dataclass(frozen=True)
class CompactorServiceConfig:
    data_dir: object
    server: ServerConfig = ServerConfig()
    commitlog_address: str = DEFAULT_COMMITLOG
    compaction: CompactionConfig = CompactionConfig()
    follow: FollowConfig = FollowConfig()
    rpc_timeout_ms: int = 10_000
    tail_stream_deadline_ms: int = 60_000
    checkpoint_interval_ms: int = 1_000
    spark_threshold_bytes: int = DEFAULT_SPARK_THRESHOLD_BYTES
    replica_of: str = ""                     # a primary compactor's host:port: copy its logs, follow no log
    replica_interval_ms: int = 500
    spark_master: str = "local[*]"           # "" = no Spark engine; spark://host:7077 for a cluster
    spark_timeout_ms: int = 1_800_000
    # Spark rounds through the object storage tier (file:// or s3://; "" = the executors share the data dir)
    spark_tier: TierConfig = dataclasses.field(default_factory=TierConfig)
    # the object storage tier of sealed compaction log segments (mqstore.compaction.tier; tier_url "" = none)
    tier: CompactionTierConfig = dataclasses.field(default_factory=CompactionTierConfig)
    etcd_endpoints: str = ""                 # host:port[,...]: active/standby through an etcd lease (lease.py)
    etcd_prefix: str = DEFAULT_ETCD_PREFIX
    lease_ttl_s: int = 2
    instance_id: str = ""                    # "" = kept in <data-dir>/instance.id (made at the first start)
    log_level: str = "info"
    failpoints: str = ""

    def __post_init__(self) -> None:
        if not self.commitlog_address:
            raise InvalidArgument("commitlog address (--commitlog / MQSTORE_COMMITLOG) must not be empty")
        for name in ("rpc_timeout_ms", "tail_stream_deadline_ms", "checkpoint_interval_ms", "spark_threshold_bytes",
                     "spark_timeout_ms", "replica_interval_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.etcd_endpoints and self.replica_of:
            raise InvalidArgument("give etcd_endpoints (active and standby, each following the commit log) or "
                                  "replica_of (a copy of one primary), not both")
        if self.lease_ttl_s < 2:
            raise InvalidArgument(f"lease_ttl_s must be at least 2 (the active renews it and stops starting rounds a "
                                  f"second before it lapses), not {self.lease_ttl_s}")


def compose(config: CompactorServiceConfig, parts: service.Composition) -> None:
    """Open the compaction logs, follow the commit log, run rounds, serve. On stop: the threads stop,
    then the last checkpoint (after an fsync of the logs), then the logs close, then the channel."""
    client = CommitLogClient(config.commitlog_address, rpc_timeout_s=config.rpc_timeout_ms / 1000,
                             stream_deadline_s=config.tail_stream_deadline_ms / 1000,
                             max_reconnect_backoff_ms=config.follow.backoff_max_ms, peers=parts.peers)
    parts.on_close(client.close)
    clock = SystemClock()
    tier = None
    if config.spark_tier.enabled:
        tier = open_store(config.spark_tier.tier_url, timeout_ms=config.spark_tier.tier_call_timeout_ms,
                          endpoint=config.spark_tier.tier_endpoint, region=config.spark_tier.tier_region,
                          credentials=config.spark_tier.credentials)
        parts.on_close(tier.close)
    spark_runner.clean_leftovers(config.data_dir / "logs", tier)  # before the logs open: a job left running writes
    segments_tier = open_tier(config.tier, instance_id(config), clock)  # before the logs: they map tiered segments
    if segments_tier is not None:
        parts.on_close(segments_tier.close)  # after the store's close (closers run in reverse)
    store = CompactionStore(config.data_dir / "logs", config.compaction, clock, remote=segments_tier)
    parts.on_close(store.close)
    hold_name, lease = HOLD_NAME, None
    if config.etcd_endpoints:
        me = instance_id(config)
        hold_name = retention_holds.instance_hold(me)  # two compactors' holds must not be one
        coordination = EtcdCoordination(config.etcd_endpoints)
        parts.on_close(coordination.close)
        lease = parts.add_duty(RoundLease(coordination, config.etcd_prefix, me, config.lease_ttl_s))
    if config.replica_of:
        replica = ReplicaDuty(store, config.replica_of, interval_ms=config.replica_interval_ms,
                              rpc_timeout_s=config.rpc_timeout_ms / 1000, peers=parts.peers)
        parts.on_close(replica.close)  # after the duty has stopped (closers run in reverse)
        parts.add_duty(replica)

        def stats() -> ServiceStats:
            return ServiceStats(replica.connected, 0, None, replica.problem(), len(store.slots()), replica.applied,
                                config.replica_of, role="replica")
    else:
        projection = CompactionProjection(store, client.user_topics, config.data_dir / "follower.checkpoint", clock,
                                          config.checkpoint_interval_ms)
        parts.on_close(projection.checkpoint)
        follower = parts.add_duty(compactor_follower(projection, HoldingSource(client, hold_name), config.follow))
        follower.register_metrics(parts.metrics)

        def stats() -> ServiceStats:
            state, (durable, applied) = follower.state(), projection.stats()
            return ServiceStats(state.connected, durable or 0, state.log_end_physical_offset,
                                follower.problem(), len(store.slots()), applied, "",
                                role=("active" if lease.active() else "standby") if lease else "single",
                                active_instance=lease.holder() if lease else "")
    store.register_metrics(parts.metrics)
    parts.add_duty(RoundDuty(store, active=lease.active if lease else None))
    if segments_tier is not None:  # the active uploads (a standby's tiered segments stay readable)
        parts.add_duty(TierDuty(segments_tier, store, active=lease.active if lease else None))
        segments_tier.register_metrics(parts.metrics)
    spark_round = None
    if config.spark_master and importlib.util.find_spec("pyspark") is not None:  # the spark extra is installed
        runner = spark_runner.SparkRunner(config.compaction, config.spark_master, config.spark_timeout_ms / 1000,
                                          tier=tier, tier_config=config.spark_tier)
        spark_round = lambda slot: store.compact(slot, engine="spark", runner=runner)  # noqa: E731
    api = CompactorApi(store, spark_threshold_bytes=config.spark_threshold_bytes, stats=stats,
                       spark_round=spark_round, refuse_rounds=(lambda: None if lease.active() else lease.not_active())
                       if lease else None)
    parts.add_servicer(SERVICE_NAME, lambda server: add_to_server(CompactorServicer(api), server))


# ---- configuration ------------------------------------------------------------------------------------

_OWN_FLAGS = {
    "commitlog": f"CommitLog service host:port (default {DEFAULT_COMMITLOG})",
    "rpc_timeout_ms": "timeout of each call to the commit log (default 10000)",
    "tail_stream_deadline_ms": "a Tail stream is re-opened this often (default 60000)",
    "checkpoint_interval_ms": "the logs are fsynced and the follower checkpointed this often (default 1000)",
    "replica_of": "a primary Compactor's host:port: copy its compaction logs from offset 0 and keep up, instead "
                  "of following the commit log (default: none)",
    "replica_interval_ms": "a replica asks the primary for new records this often (default 500)",
    "spark_master": "Spark master of heavy rounds (default local[*]; empty: no Spark engine)",
    "spark_timeout_ms": "a Spark round is stopped after this long (default 1800000)",
    "spark_tier_url": "object storage the Spark rounds go through, file:///DIR or s3://BUCKET[/PREFIX]: each round's "
                      "sealed segments are put there under spark-rounds/<id>/, its executors read them and write "
                      "their parts and output there, no directory is shared with them; the prefix is deleted when "
                      "the round ends (s3://: endpoint, region and credentials from AWS_ENDPOINT_URL, AWS_REGION, "
                      "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, which the executors need too; default: none, "
                      "the executors read the data dir at the same path)",
    "etcd_endpoints": "etcd host:port[,host:port...]: run as one of several compactors, each following the commit "
                      "log and answering reads; the one holding the lease runs rounds, another takes over when it "
                      "goes (default: none, this one runs rounds)",
    "etcd_prefix": f"the compactors' keys in etcd (<prefix>/active; default {DEFAULT_ETCD_PREFIX})",
    "lease_ttl_s": "the active compactor's etcd lease, in seconds (default 2, at least 2)",
    "instance_id": "this compactor's name among several (its retention hold is compactor-<id>; default: made at "
                   "the first start and kept in <data-dir>/instance.id)",
    "spark_threshold_bytes": f"engine=auto sends a round to Spark above these dirty bytes (default "
                             f"{DEFAULT_SPARK_THRESHOLD_BYTES})",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactor_service", description="mqstore Compactor gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory; the compaction logs go to <data-dir>/logs")
    for name, text in _OWN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    S.add_flags(parser, CompactionConfig)
    S.add_flags(parser, CompactionTierConfig, skip={"credentials"})
    S.add_flags(parser, FollowConfig)
    return parser


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> CompactorServiceConfig:
    args = build_arg_parser().parse_args(argv)
    return CompactorServiceConfig(
        data_dir=S.data_dir(args, env), server=S.server_config(args, env, DEFAULT_PORT),
        commitlog_address=S.typed(args, env, "commitlog", str, DEFAULT_COMMITLOG),
        compaction=CompactionConfig(**S.values_for(args, env, CompactionConfig)),
        follow=FollowConfig(**S.values_for(args, env, FollowConfig)),
        rpc_timeout_ms=S.typed(args, env, "rpc_timeout_ms", S.parse_int, 10_000),
        tail_stream_deadline_ms=S.typed(args, env, "tail_stream_deadline_ms", S.parse_int, 60_000),
        checkpoint_interval_ms=S.typed(args, env, "checkpoint_interval_ms", S.parse_int, 1_000),
        spark_threshold_bytes=S.typed(args, env, "spark_threshold_bytes", S.parse_int, DEFAULT_SPARK_THRESHOLD_BYTES),
        replica_of=S.typed(args, env, "replica_of", str, ""),
        replica_interval_ms=S.typed(args, env, "replica_interval_ms", S.parse_int, 500),
        spark_master=S.typed(args, env, "spark_master", str, "local[*]"),
        spark_timeout_ms=S.typed(args, env, "spark_timeout_ms", S.parse_int, 1_800_000),
        spark_tier=TierConfig(tier_url=S.typed(args, env, "spark_tier_url", str, "")).with_env(env),
        tier=CompactionTierConfig(**S.values_for(args, env, CompactionTierConfig, {"credentials"})).with_env(env),
        etcd_endpoints=S.typed(args, env, "etcd_endpoints", str, ""),
        etcd_prefix=S.typed(args, env, "etcd_prefix", str, DEFAULT_ETCD_PREFIX),
        lease_ttl_s=S.typed(args, env, "lease_ttl_s", S.parse_int, 2),
        instance_id=S.typed(args, env, "instance_id", str, ""),
        log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env))


def describe(config: CompactorServiceConfig, port: int) -> dict:
    return {"compaction": dataclasses.asdict(config.compaction), "follow": dataclasses.asdict(config.follow),
            "server": dataclasses.asdict(config.server), "commitlog_address": config.commitlog_address,
            "data_dir": str(config.data_dir), "spark_threshold_bytes": config.spark_threshold_bytes,
            "spark_master": config.spark_master, "spark_tier_url": config.spark_tier.tier_url,
            "tier": config.tier.described(),
            "replica_of": config.replica_of,
            "etcd_endpoints": config.etcd_endpoints, "etcd_prefix": config.etcd_prefix}


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe,
                             data_dir=lambda config: config.data_dir)


def build_server(config: CompactorServiceConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: CompactorServiceConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
