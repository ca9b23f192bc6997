"""``make run``'s launcher (python -m mqstore_launcher) starting real services: a port that cannot be
bound stops it before anything starts; its terminal holds its own lines only, each service's JSON log
going to <data-dir>/logs (``--service-logs stream``: on its stderr); a child that fails to start is named
with its last log lines, the others are stopped and "mqstore is running" is never printed; a server of
someone else on a child's port is not taken for the child; ``make run-ha`` (--ha) checks its ports the same
way and serves on the ports it is given. (The launcher's examples: tests/integration/test_readme.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mqstore_launcher import etcd_local, launcher
from mqstore_launcher.child import Child, StartFailed, free_port, port_problems
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc

from tests.integration.test_readme import Launcher
from tests.support.ports import service_ports
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER_TIMEOUT_S = 240  # five services start and stop on a loaded 2-core machine
STARTED = re.compile(r"^starting (\w+) on 127\.0\.0\.1:(\d+) \(pid (\d+)\)", re.M)


def launcher_command(data_dir: pathlib.Path, ports: dict[str, int], *extra_args: str) -> list[str]:
    command = [sys.executable, "-m", "mqstore_launcher", "--data-dir", str(data_dir), *extra_args]
    for name, port in ports.items():
        command += [f"--{name}-port", str(port)]
    return command


def run_launcher(data_dir: pathlib.Path, ports: dict[str, int], env: dict[str, str] | None = None,
                 *extra_args: str):
    return subprocess.run(launcher_command(data_dir, ports, *extra_args), cwd=ROOT, capture_output=True, text=True,
                          timeout=LAUNCHER_TIMEOUT_S, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def free_ports_for_all(besides: int = 0) -> dict[str, int]:
    """A distinct free port for each service (and its /metrics port), none of them ``besides``."""
    return service_ports([e.name for e in launcher.SERVICES], besides)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def listening(port: int = 0):
    """A socket listening on 127.0.0.1 (a program that holds the port); yields its port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_port_in_use_stops_the_launcher_before_it_starts_anything(tmp_path):
    with listening() as taken:
        ports = free_ports_for_all(besides=taken)
        ports["compactor"] = taken
        done = run_launcher(tmp_path / "data", ports)
    assert done.returncode == 1, done.stderr
    assert f"port {taken} of compactor on 127.0.0.1 is in use" in done.stderr
    assert "--compactor-port" in done.stderr and "RUN_ARGS=" in done.stderr
    assert "starting" not in done.stdout and not (tmp_path / "data").exists()  # nothing started, nothing made


def test_port_problems_name_each_port_in_use_and_a_port_asked_twice():
    with listening() as taken:
        free = free_port()
        problems = port_problems([("commitlog", free), ("index", taken), ("txn", free)])
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"port {taken} of index on 127.0.0.1 is in use")
    assert problems[1] == f"port {free} is asked for both commitlog and txn: give txn another one with --txn-port"


def json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("{")]


def started_events(text: str) -> dict[str, int]:
    """service.name or module -> pid of each server.started line in ``text``."""
    events = [json.loads(line) for line in json_lines(text)]
    return {e.get("service", "?"): e["pid"] for e in events if e.get("event") == "server.started"}


def test_the_terminal_holds_the_launchers_lines_and_each_service_logs_to_a_file(tmp_path):
    data_dir, ports = tmp_path / "data", free_ports_for_all()
    with open(tmp_path / "stderr", "w+") as stderr, \
            subprocess.Popen(launcher_command(data_dir, ports), cwd=ROOT, stdin=subprocess.DEVNULL, text=True,
                             stdout=subprocess.PIPE, stderr=stderr) as process:
        try:
            seen = []
            for line in process.stdout:  # ends at EOF if the launcher exits: the assertion below then says so
                seen.append(line)
                if line.strip() == "Ctrl-C stops everything.":
                    break
            process.send_signal(signal.SIGINT)
            out, _ = process.communicate(timeout=LAUNCHER_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
        out = "".join(seen) + out
        err = (tmp_path / "stderr").read_text()
    assert process.returncode == 0, out + err
    assert "mqstore is running" in out and out.rstrip().endswith("stopped")
    assert json_lines(out) == [] and json_lines(err) == [], err  # no service's log line on the terminal
    logs = data_dir / "logs"
    names = [e.name for e in launcher.SERVICES]
    assert f"  logs       {logs}/{{{','.join(names)}}}.log" in out, out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("stopping ")] == names[::-1]
    pids = {name: int(pid) for name, _, pid in STARTED.findall(out)}
    for name in names:
        assert f"(pid {pids[name]}), its log in {logs / name}.log" in out
        assert pids[name] in started_events((logs / f"{name}.log").read_text()).values(), name
    assert f"an empty store takes ~{launcher.empty_store_mib()} MiB" in out
    measured = float(re.search(r"^  disk +([\d.,]+) MiB", out, re.M).group(1))
    assert abs(measured - launcher.empty_store_mib()) < 1, out  # the start line's estimate, the banner's measure


@pytest.mark.parametrize("service_logs", ["files", "stream"])
def test_a_child_that_fails_to_start_is_named_and_the_others_are_stopped(tmp_path, service_logs):
    ports = free_ports_for_all()
    # Read by the compactor only: it refuses the setting and exits 2 while the others start fine.
    done = run_launcher(tmp_path / "data", ports, {"MQSTORE_DELETE_RETENTION_MS": "-1"},
                        "--service-logs", service_logs)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "mqstore is running" not in done.stdout
    assert f"mqstore did not start: compactor (127.0.0.1:{ports['compactor']}) exited with status 2" in done.stderr
    report = done.stderr[done.stderr.index("mqstore did not start"):]
    assert "config.invalid" in report and "delete_retention_ms" in report  # its last log lines
    assert json_lines(done.stdout) == []
    commitlog_log = tmp_path / "data" / "logs" / "commitlog.log"
    if service_logs == "files":
        assert json_lines(done.stderr[:done.stderr.index("mqstore did not start")]) == []
        assert "config.invalid" in (tmp_path / "data" / "logs" / "compactor.log").read_text()
        assert started_events(commitlog_log.read_text())
    else:  # the services' lines on the launcher's stderr, as they come; no log files
        assert started_events(done.stderr) and not commitlog_log.parent.exists()
    started = {name: int(pid) for name, _, pid in STARTED.findall(done.stdout)}
    assert set(started) == {"commitlog", "index", "txn", "compactor", "gateway"}, done.stdout
    assert [name for name, pid in started.items() if alive(pid)] == []
    assert port_problems(list(ports.items())) == []  # every port free again


class _ForeignHealth:
    """Someone else's gRPC server on a port: health says SERVING for everything, even our names."""

    def __init__(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        servicer = health.HealthServicer()
        for name in ("", "mqstore.v1.Compactor"):
            servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_a_server_of_someone_else_on_the_port_is_not_taken_for_the_child(tmp_path):
    foreign = _ForeignHealth()
    service = launcher.services({"compactor": foreign.port})[3]
    child = Child(service.name, service.entry.grpc_service, service.port, service.command(tmp_path), dict(os.environ))
    try:
        with pytest.raises(StartFailed) as failed:
            child.wait_ready(threading.Event(), LAUNCHER_TIMEOUT_S)
        message = str(failed.value)
        assert message.startswith(f"compactor (127.0.0.1:{foreign.port}) exited with status 1 before serving")
        assert "server.start_failed" in message and "cannot bind" in message
    finally:
        child.stop()
        foreign.server.stop(None)


ETCD_PORT_NAMES = ("etcd", "etcd-peer", "etcd-e2", "etcd-e2-peer", "etcd-e3", "etcd-e3-peer")


@pytest.mark.parametrize("name", ["commitlog-n2", "etcd-e3-peer"])
def test_run_ha_with_a_port_in_use_stops_before_it_starts_anything(tmp_path, name):
    with listening() as taken:
        ports = service_ports([e.name for e in launcher.SERVICES] + list(ETCD_PORT_NAMES), besides=taken)
        ports[name] = taken
        done = run_launcher(tmp_path / "data", ports, None, "--ha")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"port {taken} of {name} on 127.0.0.1 is in use" in done.stderr
    assert f"--{name}-port" in done.stderr and "make run-ha RUN_ARGS=" in done.stderr
    assert not (tmp_path / "data").exists()  # no etcd, no node: nothing started, nothing made


def _serving(address: str, service: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=10)
        except grpc.RpcError:
            return False
    return answer.status == health_pb2.HealthCheckResponse.SERVING


def _pid_with_argument(argument: str) -> int:
    """The one process whose command line holds ``argument`` (/proc)."""
    found = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if argument.encode() in cmdline.read_bytes().split(b"\0")[1:]:
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # it ended meanwhile
    assert len(found) == 1, found
    return found[0]


def _etcd_peer_urls(endpoint: str) -> list[str]:
    from mqstore_rpc.gen.etcd.etcdserver.etcdserverpb import rpc_pb2, rpc_pb2_grpc
    with grpc.insecure_channel(endpoint) as channel:
        members = rpc_pb2_grpc.ClusterStub(channel).MemberList(rpc_pb2.MemberListRequest(), timeout=10).members
    return sorted(url for member in members for url in member.peerURLs)


def _role(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        return replication_pb2_grpc.ReplicationStub(channel).GetReplicationState(
            replication_pb2.GetReplicationStateRequest(), timeout=10).role


@pytest.mark.slow
def test_run_ha_serves_every_node_and_service_on_the_ports_it_is_given(tmp_path):
    if etcd_local.find_binary() is None:
        pytest.skip(f"no etcd server binary: {etcd_local.INSTALL_HINT} (.ci/run and `make setup-ha` install it)")
    names = [e.name for e in launcher.SERVICES] + ["commitlog-n2", "commitlog-n3", "index-2", "txn-2", "compactor-2",
                                                   "gateway-2", *ETCD_PORT_NAMES]
    ports = service_ports(names)  # none of them a default, none another's metrics port
    ha_launcher = Launcher(tmp_path / "data", ports, tmp_path / "launcher.log", ("--ha",))
    try:
        banner = ha_launcher.banner()
        nodes = [f"127.0.0.1:{ports[name]}" for name in ("commitlog", "commitlog-n2", "commitlog-n3")]
        rest = ha_launcher.lines.get(timeout=60)
        assert rest is not None and f"The commit log nodes: {','.join(nodes)} (leader now: " in rest, rest
        members = [f"127.0.0.1:{ports[name]}" for name in ("etcd", "etcd-e2", "etcd-e3")]
        etcd_line = ha_launcher.lines.get(timeout=60)
        assert etcd_line is not None and f"etcd, a cluster of 3 members (the loss of one changes nothing): " \
            f"{','.join(members)} (peers {ports['etcd-peer']},{ports['etcd-e2-peer']},{ports['etcd-e3-peer']}" \
            in etcd_line, etcd_line
        peers = _etcd_peer_urls(members[1])  # one cluster: any member lists all three, on the ports given
        assert peers == sorted(f"http://127.0.0.1:{ports[n]}" for n in ("etcd-peer", "etcd-e2-peer", "etcd-e3-peer"))
        assert all((tmp_path / "data" / "etcd" / m / "member").is_dir() for m in ("e1", "e2", "e3"))
        roles = [_role(address) for address in nodes]
        assert roles.count("LEADER") == 1, roles
        assert all(_serving(address, "mqstore.v1.CommitLog") for address in nodes)
        for entry in launcher.SERVICES[1:]:
            address = f"127.0.0.1:{ports[entry.name]}"
            assert f"{entry.name:<10} {address}" in banner
            assert _serving(address, entry.grpc_service), f"{entry.name} does not serve on {address}"
        # Index and gateway twice (issue 34): the second instances serve, and the banner gives both to clients.
        index = f"127.0.0.1:{ports['index']},127.0.0.1:{ports['index-2']}"
        gateways = f"127.0.0.1:{ports['gateway']};127.0.0.1:{ports['gateway-2']}"
        assert _serving(f"127.0.0.1:{ports['index-2']}", "mqstore.v1.Index")
        assert _serving(f"127.0.0.1:{ports['gateway-2']}", "apache.rocketmq.v2.MessagingService")
        txns = f"127.0.0.1:{ports['txn']},127.0.0.1:{ports['txn-2']}"
        assert _serving(f"127.0.0.1:{ports['txn-2']}", "mqstore.v1.Transaction")  # the standby is SERVING
        compactors = f"127.0.0.1:{ports['compactor']},127.0.0.1:{ports['compactor-2']}"
        assert _serving(f"127.0.0.1:{ports['compactor-2']}", "mqstore.v1.Compactor")
        # replication status, Index, txn, Compactors, gateways
        more = [ha_launcher.lines.get(timeout=60) for _ in range(5)]
        assert f"MQSTORE_INDEX_ADDRESS={index}" in more[1] and f'endpoints "{gateways}"' in more[4], more
        assert f"MQSTORE_TXN_ADDRESS={txns}" in more[2], more
        assert f"MQSTORE_COMPACTOR_ADDRESS={compactors}" in more[3], more
        # kill -9 of one Index: reported, the other serves, the launcher runs on
        os.kill(_pid_with_argument(str(tmp_path / "data" / "index-2")), signal.SIGKILL)
        said = "index-2 exited with status -9; its other instance still serves"
        wait_until(lambda: said in ha_launcher.log_path.read_text(), "the launcher's report", 60)
        assert ha_launcher.process.poll() is None and _serving(f"127.0.0.1:{ports['index']}", "mqstore.v1.Index")
    finally:
        status = ha_launcher.stop()
    assert status == 0, ha_launcher.log_tail()
