"""Composition root of the Index service: ``python -m index_service.main --data-dir ./data/index``.

Configuration: flags, then ``MQSTORE_*`` environment variables, then defaults (flags win; rules in
mqstore_rpc.settings). ``--data-dir`` (the index files go to ``<data-dir>/index``), ``--host``
(127.0.0.1; 0.0.0.0 only inside containers), ``--port`` (50052), ``--commitlog`` (the CommitLog
service, env MQSTORE_COMMITLOG, default 127.0.0.1:50051), ``--tier-dir`` (second storage tier for
sealed compact files; none by default), ``--rpc-timeout-ms``, ``--tail-stream-deadline-ms``,
``--max-workers``, ``--grace-s``, ``--log-level``; and one flag per field of IndexConfig
(``--slot-count``, ``--entry-count``, ``--checkpoint-interval-ms``, ...), FollowerConfig
(``--heartbeat-ms``, ``--backoff-max-ms``, ``--retention-interval-ms``, ...) and LookupConfig.
``MQSTORE_FAILPOINTS`` arms crash points (tests only).

The process prints only JSON log lines on stderr; the first after start is ``server.started`` with
the bound port. Exit status: 0 after SIGTERM/SIGINT, 1 when the index cannot start, 2 for invalid
configuration. The service starts even when the commit log is not reachable yet: its follower
connects when the log comes up, and meanwhile it answers what needs no commit log (Stats, queries
for keys without index entries; the rest is UNAVAILABLE, as index.proto says).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import sys
from typing import Iterator, Mapping, Sequence

import structlog
from mqstore import failpoints
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore_rpc import logging as mqlogging
from mqstore_rpc import settings as S
from mqstore_rpc.server import (
    ManagedServer,
    ServerConfig,
    StopSignals,
    create_server,
    serve_until_signal,
)

from .commitlog_client import CommitLogClient
from .config import IndexConfig
from .follower import FollowerConfig, TailFollower
from .lookup import IndexQueries, LookupConfig
from .maintenance import IndexMaintainer
from .servicer import SERVICE_NAME, IndexServicer, add_to_server
from .store import IndexStore
from .tier import open_tier
from .upkeep import IndexUpkeep

log = structlog.get_logger("index_service")

DEFAULT_PORT = 50052
DEFAULT_COMMITLOG = "127.0.0.1:50051"


@dataclasses.dataclass(frozen=True)
class IndexServiceConfig:
    index: IndexConfig
    server: ServerConfig = ServerConfig()
    commitlog_address: str = DEFAULT_COMMITLOG
    follower: FollowerConfig = FollowerConfig()
    lookup: LookupConfig = LookupConfig()
    tier_dir: pathlib.Path | None = None
    tier_url: str = ""                        # an fsspec URL (s3://bucket/prefix, memory://x); wins over tier_dir
    rpc_timeout_ms: int = 10_000             # GetMessage, GetStoreInfo, GetOffsetByTime
    tail_stream_deadline_ms: int = 60_000    # a Tail stream is re-opened this often (bounds a stall)
    log_level: str = "info"
    failpoints: str = ""

    def __post_init__(self) -> None:
        if not self.commitlog_address:
            raise InvalidArgument("commitlog address (--commitlog / MQSTORE_COMMITLOG) must not be empty")
        if self.rpc_timeout_ms <= 0 or self.tail_stream_deadline_ms <= 0:
            raise InvalidArgument("rpc_timeout_ms and tail_stream_deadline_ms must be positive")


def build_server(config: IndexServiceConfig) -> tuple[ManagedServer, int]:
    """Bind, open the index store, start its background threads and register the servicer; returns
    the server (not started) and its port. ``server.stop()`` stops the threads and closes the store."""
    server = create_server(config.server)
    try:
        tier = open_tier(config.tier_dir, config.tier_url)
        store = IndexStore(config.index, tier=tier)
        store.start()
    except BaseException:
        server.stop(0)
        raise
    client = CommitLogClient(config.commitlog_address, rpc_timeout_s=config.rpc_timeout_ms / 1000,
                             stream_deadline_s=config.tail_stream_deadline_ms / 1000,
                             max_reconnect_backoff_ms=config.follower.backoff_max_ms)
    maintainer = IndexMaintainer(store)
    follower = TailFollower(store, client, config.follower)
    upkeep = IndexUpkeep(store, client, config.follower)
    queries = IndexQueries(store, client, follower.state, upkeep.state, config.lookup)
    for closer in (client.close, store.close, maintainer.stop, follower.stop, upkeep.stop):
        server.add_closer(closer)  # run in reverse: threads first, then the store, then the channel
    add_to_server(IndexServicer(queries), server.grpc_server)
    server.add_service_names([SERVICE_NAME])
    maintainer.start()
    follower.start()
    upkeep.start()
    server.mark_serving()
    server.monitor_health(lambda: queries.stats().problem)
    return server, server.port


@contextlib.contextmanager
def serving(config: IndexServiceConfig) -> Iterator[tuple[ManagedServer, int]]:
    """A started server for tests and benchmarks; stopped (threads and store included) on exit."""
    server, port = build_server(config)
    try:
        server.start()
        yield server, port
    finally:
        server.stop()


# ---- configuration ------------------------------------------------------------------------------------

_OWN_FLAGS = {
    "data_dir": "data directory; the index files go to <data-dir>/index (required)",
    "host": "address to bind (default 127.0.0.1)",
    "port": f"port to bind, 0 = any (default {DEFAULT_PORT})",
    "commitlog": f"CommitLog service host:port (default {DEFAULT_COMMITLOG})",
    "tier_dir": "directory of the second storage tier for sealed compact files (default: none)",
    "tier_url": "fsspec URL of the second storage tier instead of a directory, e.g. s3://bucket/index",
    "rpc_timeout_ms": "timeout of each call to the commit log (default 10000)",
    "tail_stream_deadline_ms": "a Tail stream is re-opened this often (default 60000)",
    "max_workers": "gRPC handler threads (default 64)",
    "grace_s": "seconds running RPCs get on stop (default 5)",
    "log_level": "debug, info, warning, error (default info)",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="index_service", description="mqstore Index gRPC service")
    for name, text in _OWN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    S.add_flags(parser, IndexConfig, skip={"data_dir"})
    S.add_flags(parser, FollowerConfig)
    S.add_flags(parser, LookupConfig)
    return parser


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> IndexServiceConfig:
    args = build_arg_parser().parse_args(argv)
    data_dir = S.setting(args, env, "data_dir")
    if not data_dir:
        raise InvalidArgument("data_dir: pass --data-dir or set MQSTORE_DATA_DIR")
    defaults = ServerConfig()
    server = ServerConfig(host=S.typed(args, env, "host", str, defaults.host),
                          port=S.typed(args, env, "port", S.parse_int, DEFAULT_PORT),
                          max_workers=S.typed(args, env, "max_workers", S.parse_int, defaults.max_workers),
                          grace_s=S.typed(args, env, "grace_s", float, defaults.grace_s))
    tier_dir = S.setting(args, env, "tier_dir")
    return IndexServiceConfig(
        index=IndexConfig(data_dir=pathlib.Path(data_dir), **S.values_for(args, env, IndexConfig, {"data_dir"})),
        server=server, commitlog_address=S.typed(args, env, "commitlog", str, DEFAULT_COMMITLOG),
        follower=FollowerConfig(**S.values_for(args, env, FollowerConfig)),
        lookup=LookupConfig(**S.values_for(args, env, LookupConfig)),
        tier_dir=pathlib.Path(tier_dir) if tier_dir else None,
        tier_url=S.typed(args, env, "tier_url", str, ""),
        rpc_timeout_ms=S.typed(args, env, "rpc_timeout_ms", S.parse_int, 10_000),
        tail_stream_deadline_ms=S.typed(args, env, "tail_stream_deadline_ms", S.parse_int, 60_000),
        log_level=S.typed(args, env, "log_level", str, "info"),
        failpoints=env.get(S.ENV_PREFIX + "FAILPOINTS", ""))


def _config_fields(config: IndexServiceConfig) -> dict:
    return {name: dataclasses.asdict(getattr(config, name)) for name in ("index", "server", "follower", "lookup")} | {
        "commitlog_address": config.commitlog_address, "tier_dir": config.tier_dir, "tier_url": config.tier_url}


def main(argv: Sequence[str] | None = None) -> int:
    mqlogging.configure("info")
    try:
        config = parse_config(argv, os.environ)
        mqlogging.configure(config.log_level)
        failpoints.arm_from_spec(config.failpoints)
    except (InvalidArgument, ValueError) as exc:
        log.error("config.invalid", message=str(exc))
        return 2
    signals = StopSignals().install()  # before opening the store: a SIGTERM then stops cleanly
    try:
        server, port = build_server(config)
    except MqStoreError as exc:
        signals.restore()
        log.error("server.start_failed", error=type(exc).__name__, message=str(exc))
        return 1
    server.start()
    log.info("server.started", service=SERVICE_NAME, port=port, pid=os.getpid(), failpoints=config.failpoints,
             config=_config_fields(config))
    serve_until_signal(server, signals, on_signal=lambda name: log.info("server.stopping", signal=name, port=port))
    log.info("server.stopped", port=port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
