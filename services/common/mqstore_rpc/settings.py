"""Flags and ``MQSTORE_*`` environment variables -> values for a service's frozen config dataclasses.

The rule every service follows: a flag wins over its environment variable, which wins over the
default. A dataclass field ``slot_count`` becomes ``--slot-count`` and ``MQSTORE_SLOT_COUNT``; integers
accept ``_`` separators and KiB/MiB/GiB suffixes, booleans 1/0/true/false/yes/no/on/off. A value that
does not parse raises InvalidArgument naming the flag and the variable. (The commit log service has
the same rules inline in its main.py; this module is the shared form for the other services.)
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable, Mapping

from mqstore.errors import InvalidArgument

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
