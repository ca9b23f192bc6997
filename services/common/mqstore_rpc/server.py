"""Assembles a gRPC server the same way for every mqstore service.

``create_server(config, registry)`` gives a :class:`ManagedServer`: a ``grpc.aio`` server on an event loop of
its own, whose ``async def`` handlers run on the loop and whose synchronous ones run in a bounded handler pool
(mqstore_rpc.aio; mqstore_rpc.executor, ``max_running_handlers`` caps the calls that run at once), 64 MiB message
limits, the interceptors (per-RPC metrics outermost, then the error mapping, then any the caller adds:
authentication), gRPC health and server reflection, already bound to ``host:port`` (port 0 picks a free
port, read it from ``.port``) in plaintext or, with ``config.tls``, TLS only (mutual when a client CA is
set: mqstore_rpc.tls), and the ``/metrics`` exporter of ``registry`` on ``config.metrics_port`` when it is
set (mqstore_rpc.metrics; ``.metrics_port`` is the bound one). The
service registers its servicers, adds what must be closed after the server stops
(``add_closer(store.stop)``), calls ``start()`` and then ``serve_until_signal()``, which returns after
SIGTERM or SIGINT (caught by a :class:`StopSignals` installed first thing in ``main()``) and a graceful
stop. Every port of every service is such a server (one concurrency model: README, *Endpoints*).

Lifecycle of a service process:
  create_server -> register servicers -> start domain objects -> start() -> mark_serving()
  -> serve_until_signal(): wait for SIGTERM/SIGINT -> stop(grace): health NOT_SERVING, stop taking new
  RPCs, let running ones finish for grace_s, cancel the rest -> closers in reverse order.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mqstore import defaults
from mqstore.auth.throttle import Throttle
from mqstore.background import Duty
from mqstore.errors import InvalidArgument
from mqstore.metrics import Registry
from mqstore_rpc import aio as aio_server
from mqstore_rpc.errors import ErrorInterceptor
from mqstore_rpc.executor import HandlerPool
from mqstore_rpc.metrics import MetricsExporter, RpcMetrics
from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.tls import ServerTls

T = TypeVar("T")

log = structlog.get_logger("mqstore_rpc.server")


@dataclass(frozen=True)
class AuthConfig:
    """Authentication and permissions of a server (mqstore_rpc.auth). ``url``: the auth database every
    service shares; ``internal_token``: the secret of the services' own identity ``service``."""

    enabled: bool = False
    url: Secret = Secret()               # a database URL may hold a password
    default_decision: str = "deny"       # when no rule of a user matches: deny or allow
    refresh_ms: int = 1_000              # how often the users' version is read (changes by others)
    internal_token: Secret = Secret()
    # The key-encryption key of SDK secret keys (mqstore.auth.sealing): the CommitLog server's Access service
    # seals with it (creating it on first use), the gateway opens with it; "" = none (no SDK keys)
    kek_file: str = ""
    # What keeps failed authentication cheap: concurrent hashes, the failed-secret cache, the failure backoff
    throttle: Throttle = Throttle()

    def __post_init__(self) -> None:
        if self.default_decision not in ("allow", "deny"):
            raise InvalidArgument(f"auth_default must be allow or deny, not {self.default_decision!r}")
        if self.refresh_ms <= 0:
            raise InvalidArgument(f"auth_refresh_ms must be positive, not {self.refresh_ms}")
        if self.enabled and not self.url:
            raise InvalidArgument("auth is on but auth_url (--auth-url / MQSTORE_AUTH_URL) is not set")


@dataclass(frozen=True)
class ServerConfig:
    """How a service listens. Validated on construction."""

    host: str = defaults.HOST
    port: int = 0                        # 0 = any free port (tests)
    max_workers: int = 64                # handler threads; long polls and Tail streams each hold one
    max_running_handlers: int = 0        # calls that run at once, waits not counted (executor); 0 = max_workers
    max_concurrent_rpcs: int = 1024      # beyond this new RPCs get RESOURCE_EXHAUSTED instead of queueing
    max_message_bytes: int = defaults.MAX_MESSAGE_BYTES  # send and receive
    grace_s: float = 5.0                 # how long running RPCs may finish on stop
    stop_timeout_s: float = 30.0         # bound on waiting for the server to stop after the grace period
    metrics_host: str = ""               # where /metrics listens; "" = host
    metrics_port: int | None = None      # None = no /metrics; 0 = any free port
    tls: ServerTls | None = None         # None = plaintext
    auth: AuthConfig = AuthConfig()      # authentication and permissions (off by default)
    peers: Peers = Peers()               # how this service calls the others (TLS, its own identity)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"port must be in [0, 65535], not {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgument(f"metrics_port must be in [0, 65535] or off, not {self.metrics_port}")
        for name in ("max_workers", "max_concurrent_rpcs", "max_message_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.max_running_handlers < 0:
            raise InvalidArgument(f"max_running_handlers must be 0 (no cap) or positive, not "
                                  f"{self.max_running_handlers}")
        if self.max_concurrent_rpcs < self.max_workers:
            raise InvalidArgument(f"max_concurrent_rpcs ({self.max_concurrent_rpcs}) must be at least "
                                  f"max_workers ({self.max_workers})")
        if self.grace_s < 0 or self.stop_timeout_s <= 0:
            raise InvalidArgument("grace_s must be >= 0 and stop_timeout_s > 0")

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class HealthMonitor(Duty):
    """Duty "health-monitor": every interval, and at once when woken (``wake()``: a service that has
    become ready says so), it polls ``problem()`` and flips health NOT_SERVING while it returns a
    non-empty reason (a failed background duty, a service not ready yet), SERVING after. A problem()
    that raises a store or OS error is retried; a bug kills the monitor and health turns NOT_SERVING
    for good (nothing would report a later problem).

    Thread-safe: ``check_once()`` may also be called from another thread (tests); it takes ``_check_lock``.
    """

    def __init__(self, server: "ManagedServer", problem: Callable[[], str], interval_s: float = 1.0,
                 reported: str = ""):
        super().__init__("health-monitor", interval_s=interval_s)
        self._server = server
        self._problem = problem
        self._check_lock = threading.Lock()
        self._reported = reported  # what the status set at start says

    def step(self) -> None:
        self._wake.clear()  # a wake() from now on makes the next pause return at once
        self.check_once()

    def pause(self) -> None:
        self._wake.wait(self.interval_s)

    def check_once(self) -> None:
        problem = self._problem()
        with self._check_lock:
            if problem == self._reported:
                return
            self._reported = problem
            if problem:
                log.error("health.not_serving", port=self._server.port, problem=problem)
                self._server.set_status(health_pb2.HealthCheckResponse.NOT_SERVING)
            else:
                log.info("health.serving", port=self._server.port)
                self._server.set_status(health_pb2.HealthCheckResponse.SERVING)

    def on_died(self, exc: BaseException) -> None:
        log.error("health.not_serving", port=self._server.port, problem=self.problem())
        self._server.set_status(health_pb2.HealthCheckResponse.NOT_SERVING)


class ManagedServer:
    """A bound grpc.aio server with its health servicer and the closers to run after it stops.

    Thread-safe: ``stop()`` may be called from any thread and more than once (later calls wait for the
    first). ``add_closer`` and ``add_service_names`` are for the composition root, before ``start()``.
    """

    def __init__(self, config: ServerConfig, registry: Registry | None = None,
                 interceptors: Sequence[grpc.ServerInterceptor] = (), rpc_metrics: RpcMetrics | None = None):
        """``rpc_metrics``: another server's per-RPC figures on the same ``registry`` (a second port of
        one process counts its RPCs in the same families); None makes them."""
        self.config = config
        self.registry = registry or Registry()
        self.rpc_metrics = rpc_metrics or RpcMetrics(self.registry)
        self._executor = HandlerPool(config.max_workers,
                                     max_running=config.max_running_handlers or config.max_workers)
        options = [("grpc.max_send_message_length", config.max_message_bytes),
                   ("grpc.max_receive_message_length", config.max_message_bytes),
                   ("grpc.so_reuseport", 0)]  # two servers must never share a port silently
        chain = [self.rpc_metrics, ErrorInterceptor(), *interceptors]
        self._loop = aio_server.LoopThread()
        self._loop_closers: list[Callable[[], Awaitable[None]]] = []

        async def make() -> grpc.aio.Server:
            server = grpc.aio.server(migration_thread_pool=self._executor,
                                     interceptors=[aio_server.Interceptors(chain, self._executor)], options=options,
                                     maximum_concurrent_rpcs=config.max_concurrent_rpcs)
            return _generic_only(server)
        self.grpc_server = self._loop.run(make)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._service_names: list[str] = []
        self.extra_ports: dict[str, int] = {}  # other ports this process serves on, by name (service.Composition)
        self._closers: list[Callable[[], None]] = []
        self._monitor: HealthMonitor | None = None
        self._stop_lock = threading.Lock()
        self._stopped = threading.Event()
        self._stopping = False
        try:
            if config.tls is None:
                self.port = self.grpc_server.add_insecure_port(config.address)
            else:
                self.port = self.grpc_server.add_secure_port(config.address, config.tls.credentials())
        except RuntimeError as exc:  # grpc's way of saying the address is taken or not ours
            self._close_loop()
            raise OSError(f"cannot bind {config.address}: in use, or not an address of this host ({exc})") from None
        self._exporter: MetricsExporter | None = None
        if config.metrics_port is not None:
            self._exporter = MetricsExporter(self.registry, config.metrics_host or config.host, config.metrics_port)

    @property
    def pool(self) -> HandlerPool:
        """The handler pool: where this server runs its synchronous handlers."""
        return self._executor

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on (None: not served)."""
        return self._exporter.port if self._exporter is not None else None

    def add_service_names(self, names: Sequence[str]) -> None:
        """Full service names (``mqstore.v1.CommitLog``) for health and reflection."""
        self._service_names.extend(names)

    def add_closer(self, closer: Callable[[], None]) -> None:
        """Run after the server has stopped (in reverse order of adding), e.g. ``store.stop``."""
        self._closers.append(closer)

    def monitor_health(self, problem: Callable[[], str], interval_s: float = 1.0, reported: str = "") -> HealthMonitor:
        """Health follows ``problem()`` (empty = healthy) once started; see :class:`HealthMonitor`.
        ``reported``: the problem the status set now stands for ("" = SERVING)."""
        self._monitor = HealthMonitor(self, problem, interval_s, reported)
        return self._monitor

    def health_changed(self) -> None:
        """Poll the health problem now rather than within the interval (no-op before monitoring)."""
        if self._monitor is not None:
            self._monitor.wake()

    def start(self) -> None:
        names = [*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.grpc_server)
        self._loop.run(self.grpc_server.start, self.config.stop_timeout_s)
        if self._monitor is not None:
            self._monitor.start()

    def set_status(self, status: int) -> None:
        """Health status per service name and overall ("")."""
        for name in ["", *self._service_names]:
            self.health.set(name, status)

    def mark_serving(self) -> None:
        """Health SERVING: call once the domain objects are ready."""
        self.set_status(health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop gracefully, then run the closers. Blocks until done (bounded by the config's timeouts)."""
        with self._stop_lock:
            first = not self._stopping
            self._stopping = True
        if not first:
            self._stopped.wait(self.config.grace_s + self.config.stop_timeout_s)
            return
        grace = self.config.grace_s if grace_s is None else grace_s
        try:
            self.health.enter_graceful_shutdown()
            if self._monitor is not None:
                self._monitor.stop(self.config.stop_timeout_s)
            if not self._stop_grpc(grace):
                log.warning("server.stop_timeout", port=self.port, waited_s=grace + self.config.stop_timeout_s)
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._close_loop()
            if self._exporter is not None:
                self._exporter.stop()
            self._run_closers()
        finally:
            self._stopped.set()

    def _stop_grpc(self, grace: float) -> bool:
        """grpc's stop: no new calls, running ones cancelled after ``grace``; False if that timed out."""
        bound = grace + self.config.stop_timeout_s
        try:
            self._loop.run(lambda: self.grpc_server.stop(grace), bound)
            return True
        except TimeoutError:
            return False

    def run_on_loop(self, make: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        """``await make()`` on the server's loop (what lives there, e.g. a listener of another protocol), from
        the composition root's thread; its result."""
        return self._loop.run(make, timeout_s)

    def add_loop_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """``await closer()`` on the server's loop once the server has stopped, before the loop
        closes (what was opened on the loop, e.g. a grpc.aio client channel)."""
        self._loop_closers.append(closer)

    def _close_loop(self) -> None:
        for closer in reversed(self._loop_closers):
            try:
                self._loop.run(closer, self.config.stop_timeout_s)
            except Exception:  # the others still run; the loop closes anyway
                log.exception("server.loop_closer_failed", port=self.port)
        self._loop.close()

    def _run_closers(self) -> None:
        first_error: BaseException | None = None
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception as exc:  # every closer runs; the first error is re-raised
                log.error("server.closer_failed", closer=getattr(closer, "__qualname__", repr(closer)), exc_info=exc)
                first_error = first_error or exc
        if first_error is not None:
            raise first_error


class _Methods(grpc.GenericRpcHandler):
    """Every method a server's services register, by full name (``/mqstore.v1.CommitLog/Pull``): one dict
    lookup finds a call's handler."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(handler_call_details.method)

    def add(self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in method_handlers.items():
            self.handlers[f"/{service_name}/{name}"] = handler


def _generic_only(server: grpc.aio.Server) -> grpc.aio.Server:
    """``server`` with no method registered with grpc's core: what the generated ``add_*_to_server`` functions
    (and health's, reflection's) register as methods goes into one generic handler, first in the server's list.

    Why: a grpc.aio server (grpcio 1.85) keeps one pending request task per registered method, plus one for
    the rest, and awaits ``asyncio.wait`` over all of them twice a call: with the CommitLog port's ~22 methods
    ~27 µs of the loop's CPU a call more than over one (bench/README.md, *Reads on the loop*). The generated
    functions also add the same handlers as a generic handler, which the one lookup here answers before them.
    The attribute set on the instance shadows the class's method (the server must stay a ``grpc.aio.Server``:
    reflection and health check that)."""
    methods = _Methods()
    server.add_generic_rpc_handlers((methods,))
    server.add_registered_method_handlers = methods.add  # type: ignore[method-assign]
    return server


def create_server(config: ServerConfig, registry: Registry | None = None,
                  interceptors: Sequence[grpc.ServerInterceptor] = ()) -> ManagedServer:
    return ManagedServer(config, registry, interceptors)


class StopSignals:
    """Turns SIGTERM and SIGINT into a flag. Install it first thing in ``main()`` (main thread only), so
    a signal that arrives while the service is still starting is not lost or fatal: it stops the
    service as soon as it is up.

    The handler takes no lock. Python runs it on the main thread between two bytecodes, possibly while that
    thread holds the lock a ``threading.Event`` would take (``Event.wait`` holds its condition's lock on entry
    and on waking): an ``Event.set()`` in the handler then waits for itself forever, and the service ignored
    SIGTERM until the suite's SIGKILL 120 s later (seen in the suite, on a commit log stopped just after it
    started). So the handler only appends to a list and :meth:`wait` looks at it every ``POLL_S``.
    """

    POLL_S = 0.05

    def __init__(self) -> None:
        self._received: list[str] = []
        self._previous: dict[int, object] = {}

    def install(self) -> "StopSignals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous.clear()

    def _handle(self, signum: int, _frame) -> None:
        self._received.append(signal.Signals(signum).name)  # no lock: see the class's docstring

    def wait(self) -> str:
        """Block until a signal came; its name (within POLL_S of the signal)."""
        while not self._received:
            time.sleep(self.POLL_S)
        return self._received[0]


def serve_until_signal(server: ManagedServer, signals: StopSignals,
                       on_signal: Callable[[str], None] | None = None) -> str:
    """Block until ``signals`` fires, then stop the server gracefully. Returns the signal's name.

    ``on_signal`` is called with the name before stopping (to log).
    """
    try:
        name = signals.wait()
    finally:
        signals.restore()
    if on_signal is not None:
        on_signal(name)
    server.stop()
    return name
