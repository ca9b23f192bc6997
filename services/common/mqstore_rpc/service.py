"""One skeleton for every service process, so that a service's ``main()`` is a few lines.

A service describes itself once as a :class:`ServiceDef`: its name, how its settings are parsed (flags,
then ``MQSTORE_*`` variables, then defaults: mqstore_rpc.settings), and its *composition*: a function
that builds the domain objects on a bound server and registers them on a :class:`Composition` (what to
close, which background duties to run, which servicers to serve, what makes it unhealthy). Then:

* ``run(SERVICE, argv)`` is the process: its exit status is ``main()``'s;
* ``build_server(SERVICE, config)`` and the ``serving(SERVICE, config)`` context manager are the same
  server for tests and benchmarks, in this process, on port 0.

Lifecycle of a service process:
  umask 077 -> logging -> parse the settings (a bad value: ``config.invalid``, exit 2) -> arm failpoints
  -> catch SIGTERM/SIGINT (a signal during a long start is kept) -> the data directory (made 0700 when
  missing; ``security.data_dir_open`` and ``security.secret_in_data_dir`` warnings: mqstore_rpc.private_files)
  -> bind -> compose -> start the duties -> health
  SERVING if no problem is registered, else NOT_SERVING until there is none (a store or OS error on the
  way: ``server.start_failed``, what was built is closed, exit 1)
  -> serve, with health and reflection -> ``server.started`` (service, port, pid, ports (a second port by
  name: Composition.add_server), config: tests and the launcher read the port from it)
  -> SIGTERM/SIGINT -> ``server.stopping``: health NOT_SERVING, running
  RPCs get ``grace_s``, then the closers run in reverse order of registration (duties stop before the
  stores they use close) -> ``server.stopped``, exit 0.

Health is NOT_SERVING while any registered problem (the service's own, then each duty's: a duty a bug
has killed) is non-empty (mqstore_rpc.server.HealthMonitor polls them every second, and at once on
``Composition.health_changed()``). SERVING means ready: a service that cannot answer its RPCs yet (the
Transaction service until it has read the log up to the end it saw at start) registers a problem that
says so, and reports the change when it is ready.

What every service gets here, from the settings every service has (mqstore_rpc.settings): a metrics
registry (``Composition.metrics``, served at ``/metrics`` on ``--metrics-port``: mqstore_rpc.metrics),
TLS on its port (``--tls-cert``/``--tls-key``/``--tls-client-ca``: mqstore_rpc.tls), authentication
and permissions when ``--auth`` is on (the auth database, the Authority and its refresh duty, the
interceptor: mqstore_rpc.auth), and ``Composition.peers``, how it calls the other services (TLS
client settings and its own identity).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import grpc
import structlog
from mqstore import failpoints
from mqstore.auth.authority import Authority, AuthRefresh
from mqstore.auth.sealing import Kek
from mqstore.background import Duty
from mqstore.clock import SystemClock
from mqstore.errors import InvalidArgument, MqStoreError
from mqstore.meta.catalog import AuthCatalog
from mqstore.metrics import Registry

from mqstore_rpc import logging as mqlogging
from mqstore_rpc import catalogs, private_files
from mqstore_rpc.auth import AuthInterceptor
from mqstore_rpc.peers import Peers
from mqstore_rpc.server import ManagedServer, ServerConfig, StopSignals, create_server, serve_until_signal

log = structlog.get_logger("mqstore_rpc.service")

EXIT_OK, EXIT_START_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


class Composition:
    """What a composition function registers on a bound server. Not thread-safe: used by the
    composition root only, before the server starts."""

    def __init__(self, server: ManagedServer, authority: Authority | None = None,
                 interceptors: Sequence[grpc.ServerInterceptor] = ()):
        self.server = server
        self.authority = authority      # None while authentication is off
        self._interceptors = tuple(interceptors)
        self._duties: list[Duty] = []
        self._own_duties: list[Duty] = []  # those whose problem is this service's (add_duty's ``health``)
        self._problems: list[Callable[[], str]] = []
        self._servers: list[tuple[ManagedServer, list[Callable[[], str]]]] = []

    @property
    def metrics(self) -> Registry:
        """The service's registry: the domain registers its figures here (mqstore.metrics)."""
        return self.server.registry

    @property
    def peers(self) -> Peers:
        """How this service calls the others: ``parts.peers.channel(address)``, or pass it to
        CommitLogClient."""
        return self.server.config.peers

    @property
    def port(self) -> int:
        """The bound port (the commit log writes it into message ids)."""
        return self.server.port

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run after the server stops, in reverse order of registration; registered at once, so that a
        composition that fails half way closes what it had opened."""
        self.server.add_closer(closer)

    def add_duty(self, duty: Duty, health: Callable[[Callable[[], str]], None] | None = None) -> Duty:
        """Started once the composition is complete; stopped (before what was registered earlier closes)
        when the server stops; health turns NOT_SERVING while it has a problem (a bug killed it, or its own
        ``problem()``). ``health``: the duty serves a second port only (the function add_server returned),
        so its problem turns that port's health, not this service's."""
        self._duties.append(duty)
        if health is None:
            self._own_duties.append(duty)
        else:
            health(duty.problem)
        self.server.add_closer(duty.stop)
        return duty

    def add_servicer(self, service_name: str, register: Callable[[grpc.Server], None]) -> None:
        """``register(grpc_server)`` adds the servicer; ``service_name`` (``mqstore.v1.Index``) gets
        health and reflection."""
        register(self.server.grpc_server)
        self.server.add_service_names([service_name])

    def add_server(self, name: str, config: ServerConfig, *, signed_requests: bool = False,
                   ) -> tuple[ManagedServer, Callable[[Callable[[], str]], None]]:
        """A second port of this process (the commit log's Local-mode gateway and Transaction service): its
        RPCs are counted in this service's metrics and pass the same authentication (``signed_requests``:
        also the RocketMQ SDKs' signed requests, as the gateway's own process takes them); its health is
        NOT_SERVING while this service's is or while a problem given to the returned function is non-empty.
        Started after the duties; stopped when this service stops, before what was registered earlier
        closes. Its bound port is in ``server.started`` as ``ports[name]``. Returns the server (``.grpc_server``
        takes servicers, ``.port`` is the bound port) and that function."""
        interceptors = [i.taking_signed_requests() if signed_requests and isinstance(i, AuthInterceptor) else i
                        for i in self._interceptors]
        extra = ManagedServer(config, self.server.registry, interceptors, rpc_metrics=self.server.rpc_metrics)
        self.server.extra_ports[name] = extra.port
        self.server.add_closer(extra.stop)
        problems: list[Callable[[], str]] = []
        self._servers.append((extra, problems))
        return extra, problems.append

    def add_health_problem(self, problem: Callable[[], str]) -> None:
        """``problem()`` is "" while healthy, else why not (polled every second)."""
        self._problems.append(problem)

    def problem(self) -> str:
        for problem in [*self._problems, *(duty.problem for duty in self._own_duties)]:
            if reason := problem():
                return reason
        return ""

    def health_changed(self) -> None:
        """A registered problem may have changed (e.g. the service became ready): health follows now,
        not within the polling interval. Any thread; a no-op before start."""
        self.server.health_changed()

    def start(self) -> None:
        for duty in self._duties:
            duty.start()
        problem = self.problem()
        if problem:  # never SERVING before ready: health stays NOT_SERVING until the problem clears
            log.info("health.not_serving", port=self.server.port, problem=problem)
        else:
            self.server.mark_serving()
        self.server.monitor_health(self.problem, reported=problem)
        for extra, problems in self._servers:
            extra_problem = _first_problem([self.problem, *problems])
            reported = extra_problem()
            if not reported:
                extra.mark_serving()
            extra.monitor_health(extra_problem, reported=reported)
            extra.start()


def _first_problem(problems: Sequence[Callable[[], str]]) -> Callable[[], str]:
    return lambda: next((reason for problem in problems if (reason := problem())), "")


@dataclass(frozen=True)
class ServiceDef:
    """One service. Its config object has ``server`` (ServerConfig), ``log_level`` and ``failpoints``."""

    grpc_service: str                                                   # e.g. "mqstore.v1.Index", for logs
    parse_config: Callable[[Sequence[str] | None, Mapping[str, str]], Any]
    compose: Callable[[Any, Composition], None]
    describe: Callable[[Any, int], dict] = lambda config, port: {}      # config fields for server.started
    signed_requests: bool = False   # with auth on, also take the RocketMQ SDKs' signed requests (the gateway)
    data_dir: Callable[[Any], pathlib.Path | None] = lambda config: None  # its data directory (None: keeps none)


def _authority(config: ServerConfig, registry: Registry) -> tuple[Authority | None, AuthCatalog | None]:
    if not config.auth.enabled:
        return None, None
    store = catalogs.open_auth_store(str(config.auth.url.reveal()), SystemClock())
    try:
        kek = Kek(pathlib.Path(config.auth.kek_file), create=False) if config.auth.kek_file else None
        authority = Authority(store, default_decision=config.auth.default_decision,
                              service_secret=str(config.auth.internal_token.reveal()), metrics=registry, kek=kek,
                              throttle=config.auth.throttle)
    except BaseException:
        store.close()
        raise
    return authority, store


def build_server(service: ServiceDef, config) -> tuple[ManagedServer, int]:
    """Bind and compose; returns the server (not started) and its port. ``server.stop()`` stops the
    duties and closes what the composition opened."""
    registry = Registry()
    authority, auth_store = _authority(config.server, registry)
    interceptors = ([AuthInterceptor(authority, registry, signed_requests=service.signed_requests)]
                    if authority is not None else [])
    try:
        server = create_server(config.server, registry, interceptors)
    except BaseException:
        if auth_store is not None:
            auth_store.close()
        raise
    parts = Composition(server, authority, interceptors)
    try:
        if auth_store is not None:
            parts.on_close(auth_store.close)
            for interceptor in interceptors:
                parts.on_close(interceptor.flush)  # the summary of the denials not logged one by one
            parts.add_duty(AuthRefresh(authority, config.server.auth.refresh_ms))
        service.compose(config, parts)
        parts.start()
    except BaseException:
        try:
            server.stop(0)  # runs the closers registered so far
        except Exception:  # the start failure is what to report; the closer's is logged
            log.exception("server.cleanup_failed", service=service.grpc_service)
        raise
    return server, server.port


@contextlib.contextmanager
def serving(service: ServiceDef, config) -> Iterator[tuple[ManagedServer, int]]:
    """A started server for tests and benchmarks; stopped (duties and stores included) on exit."""
    server, port = build_server(service, config)
    try:
        server.start()
        yield server, port
    finally:
        server.stop()


def run(service: ServiceDef, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The service process; returns the exit status (0 stopped by a signal, 1 start failed, 2 bad config)."""
    env = os.environ if env is None else env
    private_files.private_umask()  # data dirs 0700, files 0600 (mqstore_rpc.private_files)
    mqlogging.configure("info")
    try:
        config = service.parse_config(argv, env)
        mqlogging.configure(config.log_level)
        failpoints.arm_from_spec(config.failpoints)
    except (InvalidArgument, ValueError) as exc:
        log.error("config.invalid", message=str(exc))
        return EXIT_BAD_CONFIG
    signals = StopSignals().install()  # before the (possibly long) start: a SIGTERM then stops cleanly
    try:
        data_dir = service.data_dir(config)
        private_files.warn_open_data_dir(data_dir)
        private_files.make_data_dir(data_dir)
        private_files.warn_secrets_in_data_dir(data_dir, config.server)
        server, port = build_server(service, config)
    except (MqStoreError, OSError) as exc:
        signals.restore()
        log.error("server.start_failed", **_error_fields(exc))
        return EXIT_START_FAILED
    server.start()
    log.info("server.started", service=service.grpc_service, port=port, pid=os.getpid(),
             metrics_port=server.metrics_port, tls=_tls_mode(config.server), auth=config.server.auth.enabled,
             failpoints=config.failpoints, ports=server.extra_ports, config=service.describe(config, port))
    serve_until_signal(server, signals, on_signal=lambda name: log.info("server.stopping", signal=name, port=port))
    log.info("server.stopped", port=port)
    return EXIT_OK


def _tls_mode(config: ServerConfig) -> str:
    if config.tls is None:
        return "off"
    return "mutual" if config.tls.mutual else "on"


def _error_fields(exc: Exception) -> dict:
    fields = {"error": type(exc).__name__, "message": str(exc)}
    for name in ("path", "position", "physical_offset"):
        if hasattr(exc, name):
            fields[name] = getattr(exc, name)
    return fields
