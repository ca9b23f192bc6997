"""Flags and ``MQSTORE_*`` environment variables -> values for a service's frozen config dataclasses.

The rule every service follows: a flag wins over its environment variable, which wins over the
default. A dataclass field ``slot_count`` becomes ``--slot-count`` and ``MQSTORE_SLOT_COUNT``; integers
accept ``_`` separators and KiB/MiB/GiB suffixes, booleans 1/0/true/false/yes/no/on/off. A value that
does not parse raises InvalidArgument naming the flag and the variable.

Every service has the flags of :func:`add_service_flags` (``--data-dir``, ``--host``, ``--port``,
``--max-workers``, ``--max-concurrent-rpcs``, ``--grace-s``, ``--log-level``; the operations settings:
``--metrics-host``/``--metrics-port``, the server's TLS ``--tls-cert``/``--tls-key``/``--tls-client-ca``,
the TLS of its calls to the other services ``--tls-ca``/``--tls-client-cert``/``--tls-client-key``/
``--tls-server-name``, ``--auth``/``--auth-url``/``--auth-default``/``--auth-refresh-ms``/``--auth-kek-file`` and
``--internal-token``) and reads ``MQSTORE_FAILPOINTS``; :func:`server_config` and friends read them.

Metrics: ``/metrics`` is served on the gRPC port + :data:`METRICS_PORT_OFFSET` (50151 for the commit
log's 50051) unless ``--metrics-port`` says another port, ``0`` (any free port) or ``off``; a server on
port 0 (tests) serves no metrics unless asked.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Any, Callable, Iterable, Mapping

from mqstore import defaults
from mqstore.auth.throttle import Throttle
from mqstore.errors import InvalidArgument

from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.server import AuthConfig, ServerConfig
from mqstore_rpc.tls import ServerTls, client_tls

METRICS_PORT_OFFSET = defaults.METRICS_PORT_OFFSET
SERVICE_USER = "service"  # mqstore.access.SERVICE_USER: the services' own identity

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


def add_flags(parser: argparse.ArgumentParser, cls, skip: Iterable[str] = (), prefix: str = "",
              about: str = "") -> None:
    """One flag per field of ``cls`` (its value is parsed later, so the environment can fill gaps).

    A part hosted on another service's command line (Local mode) names its flags ``--<prefix><field>``
    (``prefix="gateway_"``: ``--gateway-max-body-bytes``, ``MQSTORE_GATEWAY_MAX_BODY_BYTES``) and leads each help
    with ``about``, formatted with the field's name (``"Local-mode gateway: {field}"``). A field's
    ``metadata["help"]`` says what it means."""
    for f in config_fields(cls, skip):
        name = prefix + f.name
        lead = about.format(field=f.name) + "; " if about else ""
        lead += f.metadata["help"] + "; " if "help" in f.metadata else ""
        parser.add_argument(flag(name), dest=name, help=f"{lead}env {env_name(name)}, default {f.default}")


def add_texts(parser: argparse.ArgumentParser, texts: Mapping[str, str]) -> None:
    """One flag per name of ``texts`` (name -> help), read later with :func:`typed`."""
    for name, text in texts.items():
        parser.add_argument(flag(name), dest=name, help=f"{text}; env {env_name(name)}")


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


def values_for(args: argparse.Namespace, env: Mapping[str, str], cls, skip: Iterable[str] = (),
               prefix: str = "") -> dict:
    """The fields of ``cls`` given by a flag or a variable (``--<prefix><field>``, see :func:`add_flags`), parsed
    by the type of their default, keyed by the field's name."""
    return {f.name: typed(args, env, prefix + f.name, parser_for(f.default), f.default)
            for f in config_fields(cls, skip) if setting(args, env, prefix + f.name) is not None}


# ---- the settings every service has -----------------------------------------------------------------

_SERVICE_FLAGS = {
    "host": "address to bind (default 127.0.0.1; 0.0.0.0 only inside containers)",
    "port": "port to bind, 0 = any (default {port})",
    "max_workers": f"gRPC handler threads (default {ServerConfig.max_workers})",
    "max_running_handlers": "gRPC calls that run at once, not counting those that wait (mqstore_rpc.executor; 0 = "
                            "as many as there are threads; default 4 for the CommitLog service, 0 for the others)",
    "max_concurrent_rpcs": f"RPCs admitted at once (default {ServerConfig.max_concurrent_rpcs})",
    "grace_s": f"seconds running RPCs get on stop (default {ServerConfig.grace_s:g})",
    "log_level": "debug, info, warning, error (default info)",
    "metrics_host": "address /metrics listens on (default: --host)",
    "metrics_port": f"port of /metrics: a number, 0 = any free one, off (default: gRPC port + {METRICS_PORT_OFFSET})",
    "tls_cert": "this server's TLS certificate chain (PEM); with --tls-key the server speaks TLS only",
    "tls_key": "this server's TLS private key (PEM)",
    "tls_client_ca": "CA of client certificates: clients must present one signed by it (mutual TLS)",
    "tls_ca": "CA that signed the other services' certificates: calls to them use TLS",
    "tls_client_cert": "certificate this service presents to the others (mutual TLS)",
    "tls_client_key": "key of --tls-client-cert",
    "tls_server_name": "name the other services' certificates must carry (default: the host called)",
    "auth": "authentication and permissions: on or off (default off)",
    "auth_url": "the users, rules and SDK keys every service shares: a SQLAlchemy URL (default sqlite in the data "
                "dir) or etcd://HOST:PORT,HOST:PORT/PREFIX (an HA group's, in its etcd)",
    "auth_default": "decision when no rule of a user matches: deny or allow (default deny)",
    "auth_refresh_ms": "how often users and rules are re-read for changes (default 1000)",
    "auth_hash_limit": "secrets checked against their scrypt hash at once, in this process (default 2)",
    "auth_failures_before_backoff": "failed logins in a row from one address or for one user after which its new "
                                    "credentials are refused for a while, without a hash (default 10)",
    "auth_kek_file": "key-encryption key of the SDK keys' secrets, the same file for the CommitLog server (which "
                     "makes it 0600 on first use) and the gateway (default <data-dir>/auth.kek)",
    "internal_token": "secret of the services' own identity, user 'service' (prefer the variable: flags "
                      "show in ps)",
}


def add_service_flags(parser: argparse.ArgumentParser, default_port: int, data_dir_help: str) -> None:
    parser.add_argument(flag("data_dir"), dest="data_dir",
                        help=f"{data_dir_help} (required); env {env_name('data_dir')}")
    for name, text in _SERVICE_FLAGS.items():
        switch = dict(nargs="?", const="on") if name == "auth" else {}  # `--auth` alone turns it on
        parser.add_argument(flag(name), dest=name, help=f"{text.format(port=default_port)}; env {env_name(name)}",
                            **switch)


def data_dir(args: argparse.Namespace, env: Mapping[str, str]) -> pathlib.Path:
    text = setting(args, env, "data_dir")
    if not text:
        raise InvalidArgument("data_dir: pass --data-dir or set MQSTORE_DATA_DIR")
    return pathlib.Path(text)


def server_config(args: argparse.Namespace, env: Mapping[str, str], default_port: int,
                  default_running: int = 0) -> ServerConfig:
    """``default_running``: the service's default max_running_handlers (mqstore_rpc.executor says which
    services cap their running calls and why)."""
    d = ServerConfig()
    port = typed(args, env, "port", parse_int, default_port)
    return ServerConfig(host=typed(args, env, "host", str, d.host), port=port,
                        max_workers=typed(args, env, "max_workers", parse_int, d.max_workers),
                        max_running_handlers=typed(args, env, "max_running_handlers", parse_int, default_running),
                        max_concurrent_rpcs=typed(args, env, "max_concurrent_rpcs", parse_int, d.max_concurrent_rpcs),
                        grace_s=typed(args, env, "grace_s", float, d.grace_s),
                        metrics_host=typed(args, env, "metrics_host", str, ""),
                        metrics_port=metrics_port(args, env, port), tls=server_tls(args, env),
                        auth=auth_config(args, env), peers=peers(args, env))


def metrics_port(args: argparse.Namespace, env: Mapping[str, str], grpc_port: int) -> int | None:
    """None (no /metrics) for ``off``, else the port; by default the gRPC port + METRICS_PORT_OFFSET
    (off for a gRPC port of 0: tests ask for metrics explicitly)."""
    text = setting(args, env, "metrics_port")
    if text is None:
        return grpc_port + METRICS_PORT_OFFSET if grpc_port else None
    if text.strip().lower() == "off":
        return None
    return typed(args, env, "metrics_port", parse_int, None)


def server_tls(args: argparse.Namespace, env: Mapping[str, str]) -> ServerTls | None:
    cert, key, ca = (setting(args, env, name) or "" for name in ("tls_cert", "tls_key", "tls_client_ca"))
    if not cert and not key:
        if ca:
            raise InvalidArgument("tls_client_ca needs tls_cert and tls_key: mutual TLS is TLS first")
        return None
    return ServerTls.from_files(cert, key, ca)


def internal_token(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """The services' shared secret (``--internal-token`` / MQSTORE_INTERNAL_TOKEN), "" when not set."""
    return typed(args, env, "internal_token", str, "")


def default_auth_url(directory: pathlib.Path) -> str:
    """The auth database when auth_url is not set: a SQLite file in the data directory."""
    return f"sqlite:///{directory.resolve() / 'auth.db'}"


def auth_config(args: argparse.Namespace, env: Mapping[str, str]) -> AuthConfig:
    d = Throttle()
    enabled = typed(args, env, "auth", parse_bool, False)
    url = setting(args, env, "auth_url") or ""
    if enabled and not url:
        url = default_auth_url(data_dir(args, env))
    return AuthConfig(enabled=enabled, url=Secret(url), default_decision=typed(args, env, "auth_default", str, "deny"),
                      refresh_ms=typed(args, env, "auth_refresh_ms", parse_int, 1_000),
                      internal_token=Secret(internal_token(args, env)), kek_file=kek_file(args, env),
                      throttle=Throttle(hash_limit=typed(args, env, "auth_hash_limit", parse_int, d.hash_limit),
                                        failures_before_backoff=typed(args, env, "auth_failures_before_backoff",
                                                                      parse_int, d.failures_before_backoff)))


def kek_file(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """``--auth-kek-file``, else ``<data-dir>/auth.kek`` when there is a data directory, else ""."""
    path = setting(args, env, "auth_kek_file") or ""
    if not path and setting(args, env, "data_dir"):
        path = str(data_dir(args, env).resolve() / "auth.kek")
    return path


def peers(args: argparse.Namespace, env: Mapping[str, str]) -> Peers:
    """TLS of this service's calls to the others, and its identity there (``service`` with the internal
    token, when one is set)."""
    tls = client_tls(*(setting(args, env, name) or "" for name in
                       ("tls_ca", "tls_client_cert", "tls_client_key", "tls_server_name")))
    token = internal_token(args, env)
    return Peers(tls, SERVICE_USER if token else "", Secret(token))


def log_level(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return typed(args, env, "log_level", str, "info")


def failpoints_spec(env: Mapping[str, str]) -> str:
    """``MQSTORE_FAILPOINTS``, the crash points to arm (tests only; it has no flag)."""
    return env.get(ENV_PREFIX + "FAILPOINTS", "")
