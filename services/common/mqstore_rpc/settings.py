"""Flags and ``MQSTORE_*`` environment variables -> values for a service's frozen config dataclasses.

The rule every service follows: a flag wins over its environment variable, which wins over the
default. A dataclass field ``slot_count`` becomes ``--slot-count`` and ``MQSTORE_SLOT_COUNT``; integers
accept ``_`` separators and KiB/MiB/GiB suffixes, booleans 1/0/true/false/yes/no/on/off. A value that
does not parse raises InvalidArgument naming the flag and the variable.

Every service has the flags of :func:`add_service_flags` (``--data-dir``, ``--host``, ``--port``,
``--max-workers``, ``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``) and reads
``MQSTORE_FAILPOINTS``; :func:`server_config` and friends read them.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Any, Callable, Iterable, Mapping

from mqstore.errors import InvalidArgument

from mqstore_rpc.server import ServerConfig

ENV_PREFIX = "MQSTORE_"
_SIZE_SUFFIXES = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_int(text: str) -> int:
    cleaned = text.strip().replace("_", "").lower()
    for suffix, factor in _SIZE_SUFFIXES.items():
        if cleaned.endswith(suffix):
            return int(cleaned[: -len(suffix)]) * factor
    return int(cleaned)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def parser_for(default: object) -> Callable[[str], Any]:
    if isinstance(default, bool):
        return parse_bool
    if isinstance(default, int):
        return parse_int
    if isinstance(default, float):
        return float
    return str


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def config_fields(cls, skip: Iterable[str] = ()) -> list[dataclasses.Field]:
    """The fields of a config dataclass that get a flag (those with a plain default)."""
    skipped = set(skip)
    return [f for f in dataclasses.fields(cls)
            if f.name not in skipped and f.default is not dataclasses.MISSING]


def add_flags(parser: argparse.ArgumentParser, cls, skip: Iterable[str] = ()) -> None:
    """One flag per field of ``cls`` (its value is parsed later, so the environment can fill gaps)."""
    for f in config_fields(cls, skip):
        parser.add_argument(flag(f.name), dest=f.name, help=f"env {env_name(f.name)}, default {f.default}")


def setting(args: argparse.Namespace, env: Mapping[str, str], name: str) -> str | None:
    """A flag's text, else the environment's, else None (flags win)."""
    value = getattr(args, name, None)
    return value if value is not None else env.get(env_name(name))


def typed(args: argparse.Namespace, env: Mapping[str, str], name: str, parse: Callable[[str], Any], default):
    text = setting(args, env, name)
    if text is None:
        return default
    try:
        return parse(text)
    except ValueError as exc:
        raise InvalidArgument(f"{name} ({flag(name)} / {env_name(name)}): {exc}") from None


def values_for(args: argparse.Namespace, env: Mapping[str, str], cls, skip: Iterable[str] = ()) -> dict:
    """The fields of ``cls`` given by a flag or a variable, parsed by the type of their default."""
    return {f.name: typed(args, env, f.name, parser_for(f.default), f.default)
            for f in config_fields(cls, skip) if setting(args, env, f.name) is not None}


# ---- the settings every service has -----------------------------------------------------------------

_SERVICE_FLAGS = {
    "host": "address to bind (default 127.0.0.1; 0.0.0.0 only inside containers)",
    "port": "port to bind, 0 = any (default {port})",
    "max_workers": f"gRPC handler threads (default {ServerConfig.max_workers})",
    "max_concurrent_rpcs": f"RPCs admitted at once (default {ServerConfig.max_concurrent_rpcs})",
    "grace_s": f"seconds running RPCs get on stop (default {ServerConfig.grace_s:g})",
    "log_level": "debug, info, warning, error (default info)",
}


def add_service_flags(parser: argparse.ArgumentParser, default_port: int, data_dir_help: str) -> None:
    parser.add_argument(flag("data_dir"), dest="data_dir",
                        help=f"{data_dir_help} (required); env {env_name('data_dir')}")
    for name, text in _SERVICE_FLAGS.items():
        parser.add_argument(flag(name), dest=name, help=f"{text.format(port=default_port)}; env {env_name(name)}")


def data_dir(args: argparse.Namespace, env: Mapping[str, str]) -> pathlib.Path:
    text = setting(args, env, "data_dir")
    if not text:
        raise InvalidArgument("data_dir: pass --data-dir or set MQSTORE_DATA_DIR")
    return pathlib.Path(text)


def server_config(args: argparse.Namespace, env: Mapping[str, str], default_port: int) -> ServerConfig:
    d = ServerConfig()
    return ServerConfig(host=typed(args, env, "host", str, d.host),
                        port=typed(args, env, "port", parse_int, default_port),
                        max_workers=typed(args, env, "max_workers", parse_int, d.max_workers),
                        max_concurrent_rpcs=typed(args, env, "max_concurrent_rpcs", parse_int, d.max_concurrent_rpcs),
                        grace_s=typed(args, env, "grace_s", float, d.grace_s))


def log_level(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return typed(args, env, "log_level", str, "info")


def failpoints_spec(env: Mapping[str, str]) -> str:
    """``MQSTORE_FAILPOINTS``, the crash points to arm (tests only; it has no flag)."""
    return env.get(ENV_PREFIX + "FAILPOINTS", "")
