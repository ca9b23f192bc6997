"""Composition root of the CommitLog service: ``python -m commitlog_service.main --data-dir ./data``.

Configuration comes from flags, then ``MQSTORE_*`` environment variables, then defaults (flags win).
Every :class:`mqstore.config.StoreConfig` field has a flag and a variable named after it
(``segment_size_bytes`` -> ``--segment-size-bytes`` / ``MQSTORE_SEGMENT_SIZE_BYTES``; sizes accept
KiB/MiB/GiB suffixes). The server adds ``--host`` (127.0.0.1; 0.0.0.0 only inside containers),
``--port`` (50051), ``--max-workers``, ``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``;
``--retention-hours`` is a shorthand for ``--retention-ms``; ``--store-port`` is the port written into
message ids (default: the bound port). ``MQSTORE_FAILPOINTS`` arms crash points (tests only).

The process prints nothing but JSON log lines on stderr; the first after start is ``server.started``
with the bound port. Exit status: 0 after SIGTERM/SIGINT, 1 when the store cannot start (for example
corruption that needs ``mqstore repair``), 2 for invalid configuration.
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
from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore.store import MessageStore
from mqstore_rpc import logging as mqlogging
from mqstore_rpc import settings as S
from mqstore_rpc.server import (
    ManagedServer,
    ServerConfig,
    StopSignals,
    create_server,
    serve_until_signal,
)

from commitlog_service.servicer import SERVICE_NAME, CommitLogServicer, add_to_server

log = structlog.get_logger("commitlog_service")

DEFAULT_PORT = 50051
# StoreConfig fields that do not get a generic flag: set from other flags, or not user settings.
_NOT_FLAGS = {"data_dir", "store_port", "extra"}


@dataclasses.dataclass(frozen=True)
class CommitLogConfig:
    store: StoreConfig
    server: ServerConfig = ServerConfig()
    advertised_port: int = 0      # port written into message ids; 0 = the bound port
    log_level: str = "info"
    failpoints: str = ""          # MQSTORE_FAILPOINTS spec, e.g. "log.after_write=exit"


def build_server(config: CommitLogConfig) -> tuple[ManagedServer, int]:
    """Bind, recover the store and register the servicer; returns the server (not started) and port.

    The store stops after the server when ``server.stop()`` is called.
    """
    server = create_server(config.server)
    try:
        store = MessageStore(dataclasses.replace(config.store, store_port=config.advertised_port or server.port))
        store.start()
    except BaseException:
        server.stop(0)
        raise
    server.add_closer(store.stop)
    add_to_server(CommitLogServicer(store), server.grpc_server)
    server.add_service_names([SERVICE_NAME])
    server.mark_serving()
    server.monitor_health(store.health_problem)
    return server, server.port


@contextlib.contextmanager
def serving(config: CommitLogConfig) -> Iterator[tuple[ManagedServer, int]]:
    """A started server for tests and benchmarks; stopped (store included) on exit."""
    server, port = build_server(config)
    try:
        server.start()
        yield server, port
    finally:
        server.stop()


# ---- configuration ------------------------------------------------------------------------------------

def _store_fields() -> list[dataclasses.Field]:
    return S.config_fields(StoreConfig, skip=_NOT_FLAGS)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commitlog_service", description="mqstore CommitLog gRPC service")
    parser.add_argument("--data-dir", help="data directory (env MQSTORE_DATA_DIR); required")
    parser.add_argument("--host", help="address to bind (env MQSTORE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", help=f"port to bind, 0 = any (env MQSTORE_PORT, default {DEFAULT_PORT})")
    parser.add_argument("--store-port", help="port written into message ids (default: the bound port)")
    parser.add_argument("--max-workers", help="gRPC handler threads (default 64)")
    parser.add_argument("--max-concurrent-rpcs", help="RPCs admitted at once (default 1024)")
    parser.add_argument("--grace-s", help="seconds running RPCs get on stop (default 5)")
    parser.add_argument("--log-level", help="debug, info, warning, error (default info)")
    parser.add_argument("--retention-hours", help="shorthand for --retention-ms")
    for f in _store_fields():
        # A boolean flag alone means true (`--check-all`); `--check-all false` works too.
        switch = dict(nargs="?", const="true") if isinstance(f.default, bool) else {}
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name,
                            help=f"env {S.env_name(f.name)}, default {f.default}", **switch)
    return parser


def _store_config(args: argparse.Namespace, env: Mapping[str, str]) -> StoreConfig:
    data_dir = S.setting(args, env, "data_dir")
    if not data_dir:
        raise InvalidArgument("data_dir: pass --data-dir or set MQSTORE_DATA_DIR")
    values = {}
    for f in _store_fields():
        if S.setting(args, env, f.name) is not None:
            values[f.name] = S.typed(args, env, f.name, S.parser_for(f.default), f.default)
    hours = S.typed(args, env, "retention_hours", float, None)
    if hours is not None:
        if "retention_ms" in values:
            raise InvalidArgument("retention: give retention_hours or retention_ms, not both")
        values["retention_ms"] = int(hours * 3600 * 1000)
    return StoreConfig(data_dir=pathlib.Path(data_dir), **values)


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> CommitLogConfig:
    args = build_arg_parser().parse_args(argv)
    defaults = ServerConfig()
    server = ServerConfig(
        host=S.typed(args, env, "host", str, defaults.host),
        port=S.typed(args, env, "port", S.parse_int, DEFAULT_PORT),
        max_workers=S.typed(args, env, "max_workers", S.parse_int, defaults.max_workers),
        max_concurrent_rpcs=S.typed(args, env, "max_concurrent_rpcs", S.parse_int, defaults.max_concurrent_rpcs),
        grace_s=S.typed(args, env, "grace_s", float, defaults.grace_s))
    return CommitLogConfig(store=_store_config(args, env), server=server,
                           advertised_port=S.typed(args, env, "store_port", S.parse_int, 0),
                           log_level=S.typed(args, env, "log_level", str, "info"),
                           failpoints=env.get(S.ENV_PREFIX + "FAILPOINTS", ""))


def _config_fields(config: CommitLogConfig, port: int) -> dict:
    store = {f.name: getattr(config.store, f.name) for f in dataclasses.fields(config.store)}
    store["store_port"] = config.advertised_port or port  # what build_server gave the store
    return {"store": store, "server": dataclasses.asdict(config.server)}


def _error_fields(exc: Exception) -> dict:
    fields = {"error": type(exc).__name__, "message": str(exc)}
    for name in ("path", "position", "physical_offset"):
        if hasattr(exc, name):
            fields[name] = getattr(exc, name)
    return fields


def main(argv: Sequence[str] | None = None) -> int:
    mqlogging.configure("info")
    try:
        config = parse_config(argv, os.environ)
        mqlogging.configure(config.log_level)
        failpoints.arm_from_spec(config.failpoints)
    except (InvalidArgument, ValueError) as exc:
        log.error("config.invalid", message=str(exc))
        return 2
    signals = StopSignals().install()  # before the (possibly long) recovery: a SIGTERM then stops cleanly
    try:
        server, port = build_server(config)
    except (MqStoreError, OSError) as exc:
        signals.restore()
        log.error("server.start_failed", **_error_fields(exc))
        return 1
    server.start()
    log.info("server.started", service=SERVICE_NAME, port=port, pid=os.getpid(), failpoints=config.failpoints,
             config=_config_fields(config, port))
    serve_until_signal(server, signals, on_signal=lambda name: log.info("server.stopping", signal=name, port=port))
    log.info("server.stopped", port=port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
