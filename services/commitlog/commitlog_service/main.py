"""Composition root of the CommitLog service: ``python -m commitlog_service.main --data-dir ./data``.

Configuration comes from flags, then ``MQSTORE_*`` environment variables, then defaults (flags win).
Every :class:`mqstore.config.StoreConfig` field has a flag and a variable named after it
(``segment_size_bytes`` -> ``--segment-size-bytes`` / ``MQSTORE_SEGMENT_SIZE_BYTES``; sizes accept
KiB/MiB/GiB suffixes). Every service's flags (mqstore_rpc.settings) are here too: ``--host``
(127.0.0.1; 0.0.0.0 only inside containers), ``--port`` (50051), ``--max-workers``,
``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``; ``--retention-hours`` is a shorthand for
``--retention-ms``; ``--store-port`` is the port written into message ids (default: the bound port);
``--internal-token`` / ``MQSTORE_INTERNAL_TOKEN`` is the shared secret of the CommitLogInternal service
(the Transaction service's way into its system topics; commitlog.proto). Pop consumption (the
``mqstore.v1.Consumer`` service on the same port, mqstore.pop) has the flags of
:class:`mqstore.pop.config.PopConfig` (``--pop-max-in-flight`` / ``MQSTORE_POP_MAX_IN_FLIGHT``, ...).
``MQSTORE_FAILPOINTS`` arms crash points (tests only).

The process runs as every service does (mqstore_rpc.service): JSON log lines on stderr, the first
after start ``server.started`` with the bound port; exit status 0 after SIGTERM/SIGINT, 1 when the
store cannot start (for example corruption that needs ``mqstore repair``), 2 for invalid configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Mapping, Sequence

from mqstore.auth.admin import AccessAdmin
from mqstore.clock import SystemClock
from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.meta.auth import AuthStore
from mqstore.pop.config import PopConfig
from mqstore.pop.service import PopService
from mqstore.store import MessageStore
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.settings import default_auth_url
from mqstore_rpc.server import ManagedServer, ServerConfig

from commitlog_service import access, consumer, internal
from commitlog_service.servicer import SERVICE_NAME, CommitLogServicer, add_to_server

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


def compose(config: CommitLogConfig, parts: service.Composition) -> None:
    """Recover the store, rebuild pop consumption's in-flight set from it, and serve both; on stop the
    revive duty ends, pop offsets are stored, then the store stops."""
    store = MessageStore(dataclasses.replace(config.store, store_port=config.advertised_port or parts.port),
                         metrics=parts.metrics)
    store.start()
    parts.on_close(store.stop)
    pop = PopService(store, config.pop)
    pop.start(run_duty=False)
    parts.on_close(pop.stop)
    parts.add_duty(pop.reviver)
    parts.add_servicer(SERVICE_NAME, lambda server: add_to_server(CommitLogServicer(store), server))
    parts.add_servicer(internal.INTERNAL_SERVICE_NAME, lambda server: internal.add_to_server(
        internal.CommitLogInternalServicer(store, config.internal_token), server))
    parts.add_servicer(consumer.CONSUMER_SERVICE_NAME, lambda server: consumer.add_to_server(
        consumer.ConsumerServicer(pop), server))
    parts.add_health_problem(store.health_problem)
    compose_access(config, parts)


def compose_access(config: CommitLogConfig, parts: service.Composition) -> None:
    """The Access service (users and rules) over the auth database every service shares; a change
    drops this server's caches at once."""
    auth_store = AuthStore(str(config.server.auth.url.reveal()) or default_auth_url(config.store.data_dir),
                           SystemClock())
    parts.on_close(auth_store.close)
    changed = parts.authority.invalidate if parts.authority is not None else (lambda: None)
    parts.add_servicer(access.SERVICE_NAME, lambda server: access.add_to_server(
        access.AccessServicer(AccessAdmin(auth_store, changed)), server))


# ---- configuration ------------------------------------------------------------------------------------

def _store_fields() -> list[dataclasses.Field]:
    return S.config_fields(StoreConfig, skip=_NOT_FLAGS)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commitlog_service", description="mqstore CommitLog gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory")
    parser.add_argument("--store-port", help="port written into message ids (default: the bound port)")
    parser.add_argument("--retention-hours", help="shorthand for --retention-ms")
    S.add_flags(parser, PopConfig)
    for f in _store_fields():
        # A boolean flag alone means true (`--check-all`); `--check-all false` works too.
        switch = dict(nargs="?", const="true") if isinstance(f.default, bool) else {}
        parser.add_argument(S.flag(f.name), dest=f.name, help=f"env {S.env_name(f.name)}, default {f.default}",
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


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> CommitLogConfig:
    args = build_arg_parser().parse_args(argv)
    return CommitLogConfig(store=_store_config(args, env), server=S.server_config(args, env, DEFAULT_PORT),
                           pop=PopConfig(**S.values_for(args, env, PopConfig)),
                           advertised_port=S.typed(args, env, "store_port", S.parse_int, 0),
                           log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env),
                           internal_token=S.internal_token(args, env))


def describe(config: CommitLogConfig, port: int) -> dict:
    store = {f.name: getattr(config.store, f.name) for f in dataclasses.fields(config.store)}
    store["store_port"] = config.advertised_port or port  # what compose gave the store
    return {"store": store, "server": dataclasses.asdict(config.server), "pop": dataclasses.asdict(config.pop)}


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe)


def build_server(config: CommitLogConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: CommitLogConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
