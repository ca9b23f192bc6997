"""Composition root of the Index service: ``python -m index_service.main --data-dir ./data/index``.

Configuration: flags, then ``MQSTORE_*`` environment variables, then defaults (flags win; rules in
mqstore_rpc.settings). Every service's flags: ``--data-dir`` (the index files go to ``<data-dir>/index``),
``--host`` (127.0.0.1; 0.0.0.0 only inside containers), ``--port`` (50052), ``--max-workers``,
``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``. Its own: ``--commitlog`` (the CommitLog service,
env MQSTORE_COMMITLOG, default 127.0.0.1:50051), the second storage tier for sealed compact files
(mqstore.index.tier.IndexTierConfig: ``--tier-url`` file:///DIR or s3://BUCKET[/PREFIX], ``--tier-endpoint``,
``--tier-region``, ``--tier-call-timeout-ms``, ``--tier-read-timeout-ms``; S3 credentials from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN; ``--tier-dir DIR`` is an alias of ``--tier-url
file://DIR``), ``--rpc-timeout-ms``, ``--tail-stream-deadline-ms``; and one flag per field of IndexConfig
(``--slot-count``, ``--entry-count``, ``--checkpoint-interval-ms``, ...), FollowerConfig (``--heartbeat-ms``,
``--backoff-max-ms``, ``--retention-interval-ms``, ...) and LookupConfig. ``MQSTORE_FAILPOINTS`` arms crash
points (tests only).

The process runs as every service does (mqstore_rpc.service): JSON log lines on stderr, the first
after start ``server.started`` with the bound port; exit status 0 after SIGTERM/SIGINT, 1 when the
index cannot start, 2 for invalid configuration. The service starts even when the commit log is not
reachable yet: its follower connects when the log comes up, and meanwhile it answers what needs no
commit log (Stats, queries for keys without index entries; the rest is UNAVAILABLE, as index.proto
says).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import sys
from typing import Mapping, Sequence

from mqstore import defaults
from mqstore.errors import InvalidArgument
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.server import ManagedServer, ServerConfig

from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig, index_follower
from mqstore.index.lookup import IndexQueries, LookupConfig
from mqstore.index.maintenance import IndexMaintainer
from mqstore.index.store import IndexStore
from mqstore.index.tier import IndexTierConfig, check_no_old_layout, dir_url, open_tier
from mqstore.index.upkeep import IndexUpkeep

from .servicer import SERVICE_NAME, IndexServicer, add_to_server

DEFAULT_PORT = defaults.INDEX_PORT
DEFAULT_COMMITLOG = defaults.COMMITLOG_ADDRESS


@dataclasses.dataclass(frozen=True)
class IndexServiceConfig:
    index: IndexConfig
    server: ServerConfig = ServerConfig()
    commitlog_address: str = DEFAULT_COMMITLOG
    follower: FollowerConfig = FollowerConfig()
    lookup: LookupConfig = LookupConfig()
    tier: IndexTierConfig = IndexTierConfig()  # the second tier; tier_url "" = none (mqstore.index.tier)
    rpc_timeout_ms: int = 10_000             # GetMessage, GetStoreInfo, GetOffsetByTime
    tail_stream_deadline_ms: int = 60_000    # a Tail stream is re-opened this often (bounds a stall)
    log_level: str = "info"
    failpoints: str = ""

    def __post_init__(self) -> None:
        if not self.commitlog_address:
            raise InvalidArgument("commitlog address (--commitlog / MQSTORE_COMMITLOG) must not be empty")
        if self.rpc_timeout_ms <= 0 or self.tail_stream_deadline_ms <= 0:
            raise InvalidArgument("rpc_timeout_ms and tail_stream_deadline_ms must be positive")


def compose(config: IndexServiceConfig, parts: service.Composition) -> None:
    """Open the index store, start its background threads and serve the queries. On stop the threads
    stop first, then the store closes (its checkpoint), then the channel to the commit log."""
    client = CommitLogClient(config.commitlog_address, rpc_timeout_s=config.rpc_timeout_ms / 1000,
                             stream_deadline_s=config.tail_stream_deadline_ms / 1000,
                             max_reconnect_backoff_ms=config.follower.backoff_max_ms, peers=parts.peers)
    parts.on_close(client.close)
    check_no_old_layout(config.tier, config.index.index_dir)
    tier = open_tier(config.tier)
    if tier is not None:
        parts.on_close(tier.close)  # after the store's close (on_close runs in reverse)
    store = IndexStore(config.index, tier=tier)
    store.start()
    parts.on_close(store.close)
    maintainer = parts.add_duty(IndexMaintainer(store))
    follower = parts.add_duty(index_follower(store, client, config.follower))
    follower.register_metrics(parts.metrics)
    store.register_metrics(parts.metrics)
    upkeep = parts.add_duty(IndexUpkeep(store, client, config.follower))
    queries = IndexQueries(store, client, follower.state, upkeep.state, config.lookup,
                           maintainer_died=lambda: maintainer.state().died)
    parts.add_servicer(SERVICE_NAME, lambda server: add_to_server(IndexServicer(queries), server))
    parts.add_health_problem(lambda: queries.stats().problem)


# ---- configuration ------------------------------------------------------------------------------------

_OWN_FLAGS = {
    "commitlog": f"CommitLog service host:port (default {DEFAULT_COMMITLOG})",
    "tier_dir": "alias of --tier-url file://DIR (a directory as the second tier; its objects under DIR/index/)",
    "rpc_timeout_ms": "timeout of each call to the commit log (default 10000)",
    "tail_stream_deadline_ms": "a Tail stream is re-opened this often (default 60000)",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="index_service", description="mqstore Index gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory; the index files go to <data-dir>/index")
    for name, text in _OWN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    S.add_flags(parser, IndexConfig, skip={"data_dir"})
    S.add_flags(parser, FollowerConfig)
    S.add_flags(parser, LookupConfig)
    S.add_flags(parser, IndexTierConfig, skip={"credentials"})
    return parser


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> IndexServiceConfig:
    args = build_arg_parser().parse_args(argv)
    return IndexServiceConfig(
        index=IndexConfig(data_dir=S.data_dir(args, env), **S.values_for(args, env, IndexConfig, {"data_dir"})),
        server=S.server_config(args, env, DEFAULT_PORT),
        commitlog_address=S.typed(args, env, "commitlog", str, DEFAULT_COMMITLOG),
        follower=FollowerConfig(**S.values_for(args, env, FollowerConfig)),
        lookup=LookupConfig(**S.values_for(args, env, LookupConfig)),
        tier=_tier_config(args, env),
        rpc_timeout_ms=S.typed(args, env, "rpc_timeout_ms", S.parse_int, 10_000),
        tail_stream_deadline_ms=S.typed(args, env, "tail_stream_deadline_ms", S.parse_int, 60_000),
        log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env))


def _tier_config(args, env: Mapping[str, str]) -> IndexTierConfig:
    values = S.values_for(args, env, IndexTierConfig, {"credentials"})
    tier_dir = S.setting(args, env, "tier_dir")
    if tier_dir:
        if values.get("tier_url"):
            raise InvalidArgument("give --tier-dir DIR or --tier-url, not both (--tier-dir DIR is --tier-url file://DIR)")
        values["tier_url"] = dir_url(pathlib.Path(tier_dir))
    return IndexTierConfig(**values).with_env(env)


def describe(config: IndexServiceConfig, port: int) -> dict:
    return {name: dataclasses.asdict(getattr(config, name)) for name in ("index", "server", "follower", "lookup")} | {
        "commitlog_address": config.commitlog_address, "tier": config.tier.described()}


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe,
                             data_dir=lambda config: config.index.data_dir)


def build_server(config: IndexServiceConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: IndexServiceConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
