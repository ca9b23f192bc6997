"""The one service skeleton (mqstore_rpc.service): a composition that fails half way closes what it
opened, duties start after it and stop before what they use, a duty a bug kills turns health
NOT_SERVING; and every service process keeps the exit codes (0 after SIGTERM, 1 start failed, 2 bad
config) and the ``server.started`` event with the port, through real processes on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore.background import Duty
from mqstore.errors import InvariantViolation, NotFound
from mqstore_rpc import service
from mqstore_rpc.server import ServerConfig
from tests.support.processes import ServiceProcess

pytestmark = pytest.mark.integration

WAIT_S = 20


class Config:
    server = ServerConfig(port=0, grace_s=0.5)
    log_level = "info"
    failpoints = ""


class Recorded(Duty):
    """A duty that records its life in ``events``; ``bug`` set makes its next step raise one."""

    def __init__(self, events: list[str], name: str):
        super().__init__(name, interval_s=0.01)
        self.events, self.bug = events, threading.Event()

    def step(self) -> None:
        if self.bug.is_set():
            raise InvariantViolation("offsets went backwards")

    def start(self) -> None:
        self.events.append(f"start {self.name}")
        super().start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        self.events.append(f"stop {self.name}")
        return super().stop(timeout_s)


def skeleton(compose) -> service.ServiceDef:
    return service.ServiceDef("test.Skeleton", lambda argv, env: Config(), compose)


def test_a_composition_that_fails_closes_what_it_opened():
    events: list[str] = []

    def compose(config, parts: service.Composition) -> None:
        parts.on_close(lambda: events.append("close store"))
        parts.add_duty(Recorded(events, "follower"))
        raise NotFound("the commit log's address does not resolve")

    with pytest.raises(NotFound):
        service.build_server(skeleton(compose), Config())
    assert events == ["stop follower", "close store"]  # never started; closed in reverse


def test_duties_start_after_the_composition_and_stop_before_what_they_use():
    events: list[str] = []
    duties: list[Recorded] = []

    def compose(config, parts: service.Composition) -> None:
        parts.on_close(lambda: events.append("close channel"))
        parts.on_close(lambda: events.append("close store"))
        duties.extend(parts.add_duty(Recorded(events, name)) for name in ("maintainer", "follower"))
        parts.add_servicer("test.Skeleton", lambda grpc_server: events.append("registered"))
        events.append("composed")

    with service.serving(skeleton(compose), Config()) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "test.Skeleton"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=WAIT_S)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert all(d.state().alive for d in duties)
    assert events == ["registered", "composed", "start maintainer", "start follower", "stop follower",
                      "stop maintainer", "close store", "close channel"]


def test_a_duty_killed_by_a_bug_turns_health_not_serving():
    duties: list[Recorded] = []
    problem = [""]  # the service's own problem: healthy, so the duty's is what turns health

    def compose(config, parts: service.Composition) -> None:
        parts.add_health_problem(lambda: problem[0])
        duties.append(parts.add_duty(Recorded([], "upkeep")))
        parts.add_servicer("test.Skeleton", lambda grpc_server: None)

    with service.serving(skeleton(compose), Config()) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def status() -> int:
            return health.Check(health_pb2.HealthCheckRequest(service="test.Skeleton"), timeout=WAIT_S).status

        assert status() == health_pb2.HealthCheckResponse.SERVING
        duties[0].bug.set()
        deadline = time.monotonic() + WAIT_S
        while status() != health_pb2.HealthCheckResponse.NOT_SERVING:  # polled every second by the monitor
            assert time.monotonic() < deadline, "health never turned NOT_SERVING"
            threading.Event().wait(0.05)
        assert "InvariantViolation: offsets went backwards" in duties[0].problem()


def test_a_duty_of_a_second_port_turns_only_that_ports_health():
    """A Local-mode service's duty (the Transaction service's follower in the commit log process): its
    problem makes its own port NOT_SERVING and leaves the process's main port SERVING."""
    duties: list[Recorded] = []
    second: list = []
    parts_seen: list[service.Composition] = []

    def compose(config, parts: service.Composition) -> None:
        parts_seen.append(parts)
        parts.add_servicer("test.Skeleton", lambda grpc_server: None)
        server, add_problem = parts.add_server("second", ServerConfig(port=0, grace_s=0.5))
        server.add_service_names(["test.Second"])
        second.append(server)
        duties.append(parts.add_duty(Recorded([], "second-upkeep"), health=add_problem))

    with service.serving(skeleton(compose), Config()) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as main_channel, \
            grpc.insecure_channel(f"127.0.0.1:{second[0].port}") as second_channel:
        def status(channel, name: str) -> int:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=name),
                                                             timeout=WAIT_S).status

        assert status(second_channel, "test.Second") == health_pb2.HealthCheckResponse.SERVING
        duties[0].bug.set()
        deadline = time.monotonic() + WAIT_S
        while status(second_channel, "test.Second") != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "the second port's health never turned NOT_SERVING"
            threading.Event().wait(0.05)
        assert "offsets went backwards" in duties[0].problem()
        assert parts_seen[0].problem() == ""  # what the main port's health follows
        assert status(main_channel, "test.Skeleton") == health_pb2.HealthCheckResponse.SERVING


def test_a_service_not_ready_at_start_is_not_serving_until_it_says_it_is():
    ready = threading.Event()
    parts_seen: list[service.Composition] = []

    def compose(config, parts: service.Composition) -> None:
        parts.add_health_problem(lambda: "" if ready.is_set() else "recovering")
        parts_seen.append(parts)

    with service.serving(skeleton(compose), Config()) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def status() -> int:
            return health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S).status

        assert status() == health_pb2.HealthCheckResponse.NOT_SERVING  # from the first answer (SERVING before)
        ready.set()
        parts_seen[0].health_changed()  # the monitor polls now
        deadline = time.monotonic() + WAIT_S
        while status() != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "health never turned SERVING"
            threading.Event().wait(0.01)


# ---- the processes ---------------------------------------------------------------------------------------

SERVICES = {"commitlog": "commitlog_service.main", "index": "index_service.main", "txn": "txn_service.main"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_exit_codes_and_the_started_event(tmp_path, name):
    module = SERVICES[name]
    with ServiceProcess(module, ["--data-dir", str(tmp_path / "bad"), "--port", "x"]) as bad:
        assert bad.wait_exit() == 2
        assert bad.wait_for("config.invalid")["message"].startswith("port (--port / MQSTORE_PORT)")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with ServiceProcess(module, ["--data-dir", str(tmp_path / "busy"), "--port", str(port)]) as busy:
            assert busy.wait_exit() == 1
            assert busy.wait_for("server.start_failed")["error"] == "OSError"

    # The txn service is ready (SERVING) only once it has read the commit log, which is not running here
    # (a closed port, so that no other commit log on this machine answers).
    extra = ["--commitlog", f"127.0.0.1:{_closed_port()}"] if name == "txn" else []
    good = ServiceProcess(module, ["--data-dir", str(tmp_path / "good"), "--port", "0", "--grace-s", "1", *extra])
    try:
        good.started()  # server.started with the bound port
        with grpc.insecure_channel(good.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
        ready = name != "txn"
        assert reply.status == (health_pb2.HealthCheckResponse.SERVING if ready else
                                health_pb2.HealthCheckResponse.NOT_SERVING)
    finally:
        assert good.stop() == 0  # SIGTERM
    assert good.wait_for("server.stopped")["port"] == int(good.address.rsplit(":", 1)[1])


def test_a_health_monitor_killed_by_a_bug_leaves_health_not_serving():
    from mqstore_rpc.server import create_server

    server = create_server(ServerConfig(port=0, grace_s=0.5))
    server.add_service_names(["test.Skeleton"])
    monitor = server.monitor_health(lambda: 1 / 0, interval_s=0.01)  # a bug in the problem function
    server.mark_serving()
    server.start()  # starts the monitor
    try:
        monitor._thread.join(WAIT_S)
        assert "ZeroDivisionError" in monitor.problem()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        server.stop()
