"""Composition root of the CommitLog service: ``python -m commitlog_service.main --data-dir ./data``.

Configuration comes from flags, then ``MQSTORE_*`` environment variables, then defaults (flags win).
Every :class:`mqstore.config.StoreConfig` field has a flag and a variable named after it
(``segment_size_bytes`` -> ``--segment-size-bytes`` / ``MQSTORE_SEGMENT_SIZE_BYTES``; sizes accept
KiB/MiB/GiB suffixes). Every service's flags (mqstore_rpc.settings) are here too: ``--host``
(127.0.0.1; 0.0.0.0 only inside containers), ``--port`` (50051), ``--max-workers``,
``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``; ``--retention-hours`` is a shorthand for
``--retention-ms``; ``--store-port`` is the port written into message ids (default: the bound port);
the port is a grpc.aio server whose Append and Replicate are answered on its event loop (mqstore_rpc.aio);
``--internal-token`` / ``MQSTORE_INTERNAL_TOKEN`` is the shared secret of the CommitLogInternal service
(the Transaction service's way into its system topics; commitlog.proto). Pop consumption (the
``mqstore.v1.Consumer`` service on the same port, mqstore.pop) has the flags of
:class:`mqstore.pop.config.PopConfig` (``--pop-max-in-flight`` / ``MQSTORE_POP_MAX_IN_FLIGHT``, ...).
Delayed delivery (mqstore.timer: the timer runs on the node that takes writes, its files in
``<data-dir>/timer``) has the flags of
:class:`mqstore.timer.config.TimerConfig` (``--timer-max-delay-ms``, ``--timer-precision-ms``,
``--timer-wheel-slots``, ``--timer-checkpoint-interval-ms``).
Replication (core/mqstore/replication/README.md): every :class:`ReplicationConfig` field has a flag and a
variable too: ``--node-id`` turns it on, ``--replica-of HOST:PORT`` makes a static replica of that leader,
``--etcd-endpoints`` elects the leader through etcd, ``--min-insync-replicas``, ``--default-replication
ASYNC|SYNC`` and the lag and timeout settings. A node of a group (``--etcd-endpoints`` or ``--replica-of``)
refuses SQLite topic metadata inside its data dir (the default) or in memory: :func:`refuse_unshared_metadata`.
Local mode (the RocketMQ 5 gateway and the Transaction service served from this process, each on a port
of its own: ``--gateway-port``, ``--txn-port`` and their flags) is composed above the services, by
mqstore_launcher.node (``mqstore-commitlog``): this module imports neither service; it takes what it hosts
as :class:`Hosted` parts (``CommitLogConfig.hosted``) and their flags as :class:`HostedFlags`.
The object storage tier (mqstore.tier; README, *Object storage tier*) has the flags of
:class:`mqstore.tier.config.TierConfig`: ``--tier-url`` (empty: off; file:///DIR or s3://BUCKET[/PREFIX]) turns
the leader's upload of sealed commit log segments on, ``--tier-upload-interval-ms``, ``--tier-call-timeout-ms``,
``--tier-endpoint``, ``--tier-region`` and ``--tier-multipart-bytes``; ``--local-retention-ms/-bytes`` delete
uploaded segments from the local disk (mqstore.tier.local_retention) and Pull / GetMessage(s) below the local log
read the tier (mqstore.tier.reads, ``--tier-read-ahead-bytes``, ``--tier-cache-bytes``); S3 credentials come from
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN only.
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
from typing import Callable, Mapping, Protocol, Sequence

import structlog

from mqstore import defaults, store_offsets
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.meta.catalog import is_etcd_url
from mqstore.meta.sql import sqlite_file
from mqstore.pop.config import PopConfig
from mqstore.pop.leadership import PopLeadership
from mqstore.pop.service import PopService
from mqstore.replication.config import ReplicationConfig
from mqstore.replication.controller import Controller
from mqstore.replication.isr import IsrKeeper
from mqstore.replication.node import ReplicationNode
from mqstore.replication.replica import ReplicaFollower
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from mqstore.timer.config import TimerConfig
from mqstore.timer.leadership import TimerDuty
from mqstore.timer.scheduling import Scheduler
from mqstore.tier.config import TierConfig
from mqstore.tier.quota import UploadQuota
from mqstore.tier.ledger import Ledger
from mqstore.tier.local_retention import LocalRetention
from mqstore.replication.tier_join import TierJoin
from mqstore.tier.status import TierStats, register_metrics
from mqstore.tier.reads import TierReader
from mqstore.tier.urls import open_store
from mqstore.tier.sealed import queue_min, sealed_queue_files, sealed_segments
from mqstore.tier.uploader import Uploader
from mqstore import system_writers  # noqa: F401  (registers every system writer's rules: mqstore.writers)
from mqstore_rpc import catalogs, etcd_meta, service
from mqstore_rpc import settings as S
from mqstore_rpc.executor import RUNNING
from mqstore_rpc.settings import default_auth_url
from mqstore_rpc.server import ManagedServer, ServerConfig

from commitlog_service import access, consumer, internal, replication
from commitlog_service.data_link import DataPort
from mqstore_rpc.etcd_client import EtcdCoordination, attempt_timeout_s, parse_endpoints
from commitlog_service.servicer import SERVICE_NAME, CommitLogServicer, add_to_server

log = structlog.get_logger()

DEFAULT_PORT = defaults.COMMITLOG_PORT
# StoreConfig fields that do not get a generic flag: set from other flags, or not user settings.
_NOT_FLAGS = {"data_dir", "store_port", "extra"}


@dataclasses.dataclass(frozen=True)
class CommitLogConfig:
    store: StoreConfig
    server: ServerConfig = ServerConfig()
    pop: PopConfig = PopConfig()  # pop consumption, the Consumer service (consumer.proto)
    timer: TimerConfig = TimerConfig()  # delayed delivery (mqstore.timer)
    advertised_port: int = 0      # port written into message ids; 0 = the bound port
    log_level: str = "info"
    failpoints: str = ""          # MQSTORE_FAILPOINTS spec, e.g. "log.after_write=exit"
    internal_token: str = ""      # shared secret of CommitLogInternal; "" = that service refuses every call
    replication: ReplicationConfig = ReplicationConfig()  # node_id "" = a single node (no replication)
    hosted: tuple[Hosted, ...] = ()  # other services' parts served from this process (Local mode: the gateway,
                                     # the Transaction service; mqstore_launcher.node), composed in this order
    tier: TierConfig = TierConfig()  # the object storage tier; tier_url "" = off (mqstore.tier)


class Hosted(Protocol):
    """A part of another service served from this process on a port of its own (Local mode: the RocketMQ 5
    gateway and the Transaction service, made by mqstore_launcher.node). Immutable."""

    def compose(self, host: Host, parts: service.Composition) -> None:
        """Build it on this process's store, once the commit log's own services are composed."""

    def describe(self) -> dict:
        """Its keys in the config of ``server.started``."""


@dataclasses.dataclass(frozen=True)
class Host:
    """What this process gives a hosted part: its config, its store, pop consumption (the current
    leadership's: PopLeadership.current) and the timer's scheduler."""

    config: CommitLogConfig
    store: MessageStore
    pop: Callable[[], PopService]
    scheduler: Scheduler | None = None  # the timer's way in (a gateway's DELAY sends go through it)


@dataclasses.dataclass(frozen=True)
class HostedFlags:
    """How a hosted part is set on this service's command line: ``add_flags`` adds its flags (after pop
    consumption's), ``parse`` makes the part from them and the store's settings."""

    add_flags: Callable[[argparse.ArgumentParser], None]
    parse: Callable[[argparse.Namespace, Mapping[str, str], StoreConfig], Hosted]


def compose(config: CommitLogConfig, parts: service.Composition) -> None:
    """Recover the store, rebuild pop consumption's in-flight set from it, and serve both; on stop the
    revive duty ends, pop offsets are stored, then the store stops."""
    warn_short_retention(config)
    store = build_store(dataclasses.replace(config.store, store_port=config.advertised_port or parts.port),
                         metrics=parts.metrics, open_catalog=catalogs.open_topic_catalog)
    store.tiered_log = config.tier.local_retention  # queues keep their entries below the local log (mqstore.tier)
    # A node of a replication group appends nothing of its own at start: an earlier version's SQL offsets are
    # imported by its leader on the first offsets call it answers (README, Consumer offsets).
    store.start()
    parts.on_close(store.stop)
    store_offsets.import_sql_offsets(store, now=not config.replication.enabled)
    node = _compose_replication(config, store, parts) if config.replication.enabled else None
    if config.replication.etcd_endpoints:
        for flag, _, what in sql_catalogs(config):  # accepted by --shared-sql-metadata (refuse_unshared_metadata)
            log.warning("config.shared_sql_metadata", catalog=what, flag=flag,
                        why="one SQL database every node shares is a single point of failure unless it fails over "
                            "by itself; etcd:// keeps the catalog on every etcd member")
    if isinstance(store.topics.meta, etcd_meta.EtcdTopicCatalog):  # topics created on another node, within a poll
        watch = parts.add_duty(catalogs.TopicWatch(store.topics.meta, store.topics.refresh))
        store.topics.freshen = watch.fresh  # ListTopics reads the catalog's latest, not the last poll's
    pop = PopLeadership(store, config.pop, leading_epoch=node.leading_epoch if node else lambda: 0,
                        ready=store.replica_view.promoted_visible)
    parts.on_close(pop.close)
    if node is None:  # one node: pop consumption is rebuilt before the server serves
        parts.add_duty(pop.start_now().reviver)
    else:  # only the leader runs it, rebuilt at each leadership (mqstore.pop.leadership)
        parts.add_duty(pop)
    timer = compose_timer(config, store, node, parts)
    scheduler = Scheduler(store, config.timer, timer.wake, timer.note)
    servicer = CommitLogServicer(store, scheduler=scheduler, auth=config.server.auth.enabled)
    parts.add_servicer(SERVICE_NAME, lambda server: add_to_server(servicer, server))
    parts.add_servicer(internal.INTERNAL_SERVICE_NAME, lambda server: internal.add_to_server(
        internal.CommitLogInternalServicer(store, config.internal_token, scheduler), server))
    parts.add_servicer(consumer.CONSUMER_SERVICE_NAME, lambda server: consumer.add_to_server(
        consumer.ConsumerServicer(pop.current), server))
    parts.add_health_problem(store.health_problem)
    if config.tier.enabled:
        compose_tier(config.tier, store, node, parts)
    compose_access(config, parts)
    for part in config.hosted:  # Local mode
        part.compose(Host(config, store, pop.current, scheduler), parts)


def compose_timer(config: CommitLogConfig, store: MessageStore, node: ReplicationNode | None,
                  parts: service.Composition) -> TimerDuty:
    """The timer's duty: on a single node always; in a replication group on the leader once it shows the log it
    copied (mqstore.timer.leadership). Its last checkpoint is written before the store stops."""
    if node is None:
        def leading() -> bool:
            return True
    else:
        def leading() -> bool:
            return node.leading_epoch() != 0 and store.replica_view.promoted_visible()
    timer = TimerDuty(store, config.timer, config.store.data_dir / "timer", leading=leading, registry=parts.metrics)
    parts.on_close(timer.close)
    parts.add_duty(timer)
    return timer


def compose_tier(tier: TierConfig, store: MessageStore, node: ReplicationNode | None,
                 parts: service.Composition) -> None:
    """The uploader of sealed segments (mqstore.tier.uploader): on the leader only, records in the log."""
    objects = open_store(tier.tier_url, timeout_ms=tier.tier_call_timeout_ms, endpoint=tier.tier_endpoint,
                         region=tier.tier_region, credentials=tier.credentials,
                         multipart_bytes=tier.tier_multipart_bytes)
    parts.on_close(objects.close)
    leader_epoch = (lambda: node.leading_epoch() or None) if node is not None else (lambda: 0)
    ledger = Ledger.of_store(store)
    local = None
    logical_min = store.log_min  # without local retention the logical log is the local one
    if tier.local_retention:
        local = LocalRetention(store, ledger, local_retention_ms=tier.local_retention_ms,
                               local_retention_bytes=tier.local_retention_bytes,
                               writable=lambda: leader_epoch() is not None and store.replica_view.promoted_visible(),
                               interval_ms=tier.tier_upload_interval_ms)

        def logical_min() -> int:
            return local.logical_min
    uploader = Uploader(objects, ledger, lambda: sealed_segments(store), leader_epoch=leader_epoch,
                        ready=store.replica_view.promoted_visible, log_min=store.log_min,
                        interval_ms=tier.tier_upload_interval_ms, logical_min=logical_min,
                        queue_files=lambda: sealed_queue_files(store), segment_size=store.segments.segment_size,
                        queue_min=lambda topic, queue_id: queue_min(store, topic, queue_id),
                        quota=UploadQuota(tier.tier_upload_max_bytes_per_second),
                        read_done=store.warmer.drop_read_back)  # its reads leave no pages behind the window
    store.retention.add_floor("tier", uploader.retention_floor)  # retention deletes nothing not uploaded
    parts.add_duty(uploader)

    def finished(base: int):  # the ledger as last read, else read on to the log's end once
        upload = ledger.finished_upload(base)
        if upload is None:
            ledger.catch_up()
            upload = ledger.finished_upload(base)
        return upload
    def queue_file(topic: str, queue_id: int, base: int):  # as finished, for a consume queue's file
        upload = ledger.queue_file_upload(topic, queue_id, base)
        if upload is None:
            ledger.catch_up()
            upload = ledger.queue_file_upload(topic, queue_id, base)
        return upload
    reader = TierReader(objects, finished, store.segments.segment_size, read_ahead_bytes=tier.tier_read_ahead_bytes,
                        cache_bytes=tier.tier_cache_bytes, floor=logical_min, queue_file=queue_file)
    store.commitlog.remote = reader.read  # Pull, GetMessage(s) and Tail below the local log read the tier
    store.commitlog.remote_floor = logical_min
    stats = TierStats(store, uploader, reader, logical_min)
    store.tier_status = stats.status  # CommitLog/GetTierStatus, `mqstore tier status`
    if parts.metrics is not None:
        register_metrics(parts.metrics, stats)
    if local is not None:
        local.reader = reader  # consume queue files go from the local disk too, read back from the tier
        local.open()
        parts.add_duty(local)
        store.tier_join = TierJoin(store, local)  # a replica starts from the tier plus its leader's local tail


def compose_access(config: CommitLogConfig, parts: service.Composition) -> None:
    """The Access service (users, rules, SDK keys) over the auth database every service shares; a change
    drops this server's caches at once. SDK secret keys are sealed under the kek file (made on first use;
    ``<data-dir>/auth.kek`` unless --auth-kek-file names another)."""
    auth_store = catalogs.open_auth_store(str(config.server.auth.url.reveal())
                                           or default_auth_url(config.store.data_dir), SystemClock())
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
    node.on_promote = store.replica_view.promote
    node.in_sync.on_committed = store.replica_view.advance_visible
    store.gate = node
    servicer = replication.ReplicationServicer(store, node, data_port=_data_port(config, rc, parts))
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
    members = len(parse_endpoints(rc.etcd_endpoints))
    coordination = EtcdCoordination(rc.etcd_endpoints, attempt_timeout_s=attempt_timeout_s(
        rc.lease_ttl_s, rc.controller_interval_ms, members))
    parts.on_close(coordination.close)
    controller = Controller(node, coordination, on_leader_change=follower.leader_changed)
    node.in_sync.publish = controller.publish_isr
    servicer.controller = controller
    parts.add_duty(controller)
    return node


def _data_port(config: CommitLogConfig, rc: ReplicationConfig, parts: service.Composition) -> DataPort | None:
    """The replication data port (commitlog_service.data_link) on the gRPC port's host and loop, with its TLS;
    None with ``--replication-data-port -1``."""
    if rc.replication_data_port < 0:
        return None
    port = DataPort(config.server.host, rc.replication_data_port, rc.advertised_address.rpartition(":")[0],
                    rc.replication_data_address, config.server.tls)
    try:
        parts.server.run_on_loop(port.start, 10.0)
    except OSError as exc:
        raise OSError(f"cannot bind the replication data port {config.server.host}:{rc.replication_data_port} "
                      f"(--replication-data-port): {exc}") from None
    parts.server.add_loop_closer(port.close)
    return port


# ---- configuration ------------------------------------------------------------------------------------

def _store_fields() -> list[dataclasses.Field]:
    return S.config_fields(StoreConfig, skip=_NOT_FLAGS)


def _replication_fields() -> list[dataclasses.Field]:
    return S.config_fields(ReplicationConfig)


def build_arg_parser(hosted_flags: Sequence[HostedFlags] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commitlog_service", description="mqstore CommitLog gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory")
    parser.add_argument("--store-port", help="port written into message ids (default: the bound port)")
    parser.add_argument("--retention-hours", help="shorthand for --retention-ms")
    S.add_flags(parser, PopConfig)
    S.add_flags(parser, TimerConfig)
    S.add_flags(parser, TierConfig)
    for hosted in hosted_flags:
        hosted.add_flags(parser)
    for f in [*_store_fields(), *_replication_fields()]:
        # A boolean flag alone means true (`--check-all`); `--check-all false` works too.
        switch = dict(nargs="?", const="true") if isinstance(f.default, bool) else {}
        about = f.metadata["help"] + "; " if "help" in f.metadata else ""
        parser.add_argument(S.flag(f.name), dest=f.name, help=f"{about}env {S.env_name(f.name)}, default {f.default}",
                            **switch)
    return parser


def _store_config(args: argparse.Namespace, env: Mapping[str, str]) -> StoreConfig:
    values = S.values_for(args, env, StoreConfig, _NOT_FLAGS)
    hours = S.typed(args, env, "retention_hours", float, None)
    if hours is not None:
        if "retention_ms" in values:
            raise InvalidArgument("retention: give retention_hours or retention_ms, not both")
        values["retention_ms"] = int(hours * 3600 * 1000)
    return StoreConfig(data_dir=S.data_dir(args, env), **values)


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str],
                 hosted_flags: Sequence[HostedFlags] = ()) -> CommitLogConfig:
    """The settings; ``hosted_flags``: the flags of the parts this process hosts (Local mode), none here."""
    if not hosted_flags:
        _refuse_local_mode(env)
    args = build_arg_parser(hosted_flags).parse_args(argv)
    store = _store_config(args, env)
    config = CommitLogConfig(store=store, server=S.server_config(args, env, DEFAULT_PORT, default_running=RUNNING),
                             pop=PopConfig(**S.values_for(args, env, PopConfig)),
                             timer=TimerConfig(**S.values_for(args, env, TimerConfig)),
                             advertised_port=S.typed(args, env, "store_port", S.parse_int, 0),
                             log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env),
                             internal_token=S.internal_token(args, env),
                             replication=ReplicationConfig(**S.values_for(args, env, ReplicationConfig)),
                             hosted=tuple(hosted.parse(args, env, store) for hosted in hosted_flags),
                             tier=TierConfig(**S.values_for(args, env, TierConfig)).with_env(env))
    refuse_unshared_metadata(config)
    config.tier.check_against(store.retention_ms)
    return config


def warn_short_retention(config: CommitLogConfig) -> None:
    """The timer holds a retention floor (TimerDuty.retention_floor): no segment holding a timer record not delivered
    or rolled yet is deleted, so a retention below the wheel's span keeps the log longer than asked (up to a span,
    more after downtime) and loses no delayed message. Said at start because the rest of the timer topic still goes
    by retention: a recall of a message rolled since its first record was deleted answers NOT_FOUND; and a replica
    keeps only the timer records of the last span (a leader's timer lagging more than that can meet
    timer.record_missing after a failover). Not refused: short retentions are common in tests and demos."""
    span_ms = config.timer.span_ms
    if config.store.retention_ms <= span_ms:
        log.warning("timer.retention_short", retention_ms=config.store.retention_ms, wheel_span_ms=span_ms,
                    why="the timer keeps the log from its oldest undelivered record (up to a span past retention); "
                        "a recall of a message rolled since its first record was deleted answers NOT_FOUND",
                    fix="raise --retention-ms above --timer-wheel-slots x --timer-precision-ms, or lower those")


def refuse_unshared_metadata(config: CommitLogConfig) -> None:
    """A node of a replication group needs topic metadata (and, with auth on, users and rules) that every node of
    the group sees: the nodes' logs are byte-identical, but a topic lives in the catalog, so with a catalog of its
    own a replica answers NOT_FOUND for a topic its leader created and a message acknowledged on 2 copies cannot
    be read once the leader is gone (issue 34).

    A node started for HA (``--etcd-endpoints``) takes its catalogs from etcd (``--metadata-url etcd://...``, and
    ``--auth-url etcd://...`` with ``--auth on``): replicated on every etcd member, so the loss of one machine
    neither loses nor blocks them. A SQL database shared by the nodes is refused unless ``--shared-sql-metadata``
    says the operator chose it (a PostgreSQL with failover of its own, e.g. Patroni): one PostgreSQL is a single
    point of failure the HA group exists to remove, and a warning at start says so. A node of a static group
    (``--replica-of``: no failover) may share a SQL database. SQLite inside this node's data dir (the default
    when --metadata-url is not given) or in memory is refused in both, as no other node can share it."""
    rc = config.replication
    if not (rc.etcd_endpoints or rc.replica_of):
        return
    role = "--etcd-endpoints" if rc.etcd_endpoints else "--replica-of"
    for flag, url, what in sql_catalogs(config):
        _refuse_unshared_sql(config, role, flag, url, what)
        if rc.etcd_endpoints and not rc.shared_sql_metadata:
            raise InvalidArgument(
                f"this commit log node is started for HA ({role}) but keeps its {what} in SQL ({flag}): one database "
                f"the nodes share is a single point of failure (when it is away no topic can be created or read). "
                f"Give {flag} the group's etcd, etcd://{rc.etcd_endpoints}{defaults.ETCD_CATALOG_PREFIX}, or, if that "
                f"database has failover of its own, say so with --shared-sql-metadata (MQSTORE_SHARED_SQL_METADATA)")


def sql_catalogs(config: CommitLogConfig) -> list[tuple[str, str, str]]:
    """(flag, URL, what it keeps) of the catalogs this node keeps in SQL: topics, and users and rules with auth on."""
    catalogs = [("--metadata-url (MQSTORE_METADATA_URL)", config.store.metadata_url_resolved, "topic metadata")]
    if config.server.auth.enabled:
        catalogs.append(("--auth-url (MQSTORE_AUTH_URL)", str(config.server.auth.url.reveal())
                         or default_auth_url(config.store.data_dir), "users and rules"))
    return [c for c in catalogs if not is_etcd_url(c[1])]


def _refuse_unshared_sql(config: CommitLogConfig, role: str, flag: str, url: str, what: str) -> None:
    file = sqlite_file(url)
    if file is None:
        return
    where = "in memory" if file == ":memory:" else None
    if where is None:
        path = pathlib.Path(file).resolve()
        if not path.is_relative_to(config.store.data_dir.absolute().resolve()):
            return
        given = config.store.metadata_url if flag.startswith("--metadata-url") else str(config.server.auth.url.reveal())
        where = f"{path}, inside this node's data dir" + ("" if given else f" (the default: {flag.split()[0]} was "
                                                                             f"not given)")
    shared = (f"the group's etcd (etcd://{config.replication.etcd_endpoints}{defaults.ETCD_CATALOG_PREFIX})"
              if config.replication.etcd_endpoints else
              "a PostgreSQL URL (postgresql+psycopg2://USER:PASSWORD@HOST:5432/DB), or, for nodes on one machine "
              "only, a SQLite file outside every node's data dir (sqlite:////PATH/metadata.db)")
    raise InvalidArgument(
        f"this commit log node is started for replication ({role}) but keeps its {what} in SQLite {where}: no other "
        f"node of the group sees what it creates, so a replica answers NOT_FOUND for a topic and a message "
        f"acknowledged on several copies cannot be read after a failover. Give {flag} a catalog every node of "
        f"the group shares: {shared}")


def _refuse_local_mode(env: Mapping[str, str]) -> None:
    """A variable that turns Local mode on is not ignored where no Local mode is composed (its flags are
    refused by the parser)."""
    for name in ("MQSTORE_GATEWAY_PORT", "MQSTORE_TXN_PORT"):
        if env.get(name):
            raise InvalidArgument(f"{name} is set, but this command serves no Local mode: run mqstore-commitlog "
                                  f"(python -m mqstore_launcher.node), or unset it")


def describe(config: CommitLogConfig, port: int) -> dict:
    store = {f.name: getattr(config.store, f.name) for f in dataclasses.fields(config.store)}
    store["store_port"] = config.advertised_port or port  # what compose gave the store
    return {"store": store, "server": dataclasses.asdict(config.server), "pop": dataclasses.asdict(config.pop),
            "timer": dataclasses.asdict(config.timer),
            "replication": dataclasses.asdict(config.replication),
            **{key: value for part in config.hosted for key, value in part.describe().items()},
            "tier": config.tier.described()}


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe,
                             data_dir=lambda config: config.store.data_dir)


def build_server(config: CommitLogConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: CommitLogConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
