"""A throwaway etcd on 127.0.0.1 for `make run-ha` and the tests: free ports, a temporary data directory,
health checked before use, always stopped (SIGTERM, then SIGKILL), its directory removed. :class:`LocalEtcd`
is one member; :class:`LocalEtcdCluster` is a real cluster of several (three for `make run-ha`: one
``--initial-cluster``, a client and a peer port each, a data dir each), whose members can be killed and
restarted one at a time (they rejoin with their data dir).

The binary is Debian's ``etcd-server`` package (``/usr/bin/etcd``, 3.4.23 in bookworm), installed by
``make setup-ha`` (the Makefile) and by .ci/run; :func:`find_binary` says how to install it when it is
missing. Not for production: no TLS, no auth.

Thread-safety: one owner per instance.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import signal
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Sequence

INSTALL_HINT = "install Debian's etcd-server (apt-get install etcd-server) or run `make setup-ha`"


def find_binary() -> str | None:
    """The etcd server binary (``MQSTORE_ETCD_BINARY``, else ``etcd`` on PATH), or None."""
    return os.environ.get("MQSTORE_ETCD_BINARY") or shutil.which("etcd")


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T or t in /proc); True where /proc is missing."""
    tasks = pathlib.Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return True  # no /proc here, or the process is gone
    try:
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()]
    except OSError:
        return False  # a thread ended while they were read: look again
    return all(state in ("T", "t") for state in states)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalEtcd:
    def __init__(self, binary: str | None = None, data_dir: str | None = None):
        self.binary = binary or find_binary()
        if self.binary is None:
            raise FileNotFoundError(f"no etcd binary: {INSTALL_HINT}")
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="mqstore-etcd-")
        self.client_port, self.peer_port = _free_port(), _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 30.0) -> "LocalEtcd":
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        self.process = subprocess.Popen(
            [self.binary, "--name", "mqstore", "--data-dir", self.data_dir, "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"mqstore={peer}", "--log-level", "error", "--logger", "zap"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.process.stderr.read()[-2000:]
                raise RuntimeError(f"etcd exited with {self.process.returncode}: {tail!r}")
            if self._healthy(client):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd on {self.endpoint} was not healthy within {timeout_s} s")

    @staticmethod
    def _healthy(client_url: str) -> bool:
        try:
            with urllib.request.urlopen(f"{client_url}/health", timeout=1) as response:
                return b'"true"' in response.read()
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        if self._own_dir:
            shutil.rmtree(self.data_dir)

    def __enter__(self) -> "LocalEtcd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _healthy(client_url: str) -> bool:
    return LocalEtcd._healthy(client_url)


# etcd's defaults are 100 ms and 1000 ms: the cluster then has no leader for 1-2 s after its leader member is
# lost, and no lease is renewed meanwhile. A commit log leader on a 2 s lease may go unconfirmed for 1 s at
# most after a renewal it sent (controller.fence_margin_s), less the time since that renewal: the election
# must be over well within that. At 50 and 300 ms, the process test (tests/crash/test_etcd_member_loss.py)
# still fenced its leader in 2 runs of 6 on a loaded 2-core machine (load ~9); at 25 and 150 ms, in none of
# 6. --pre-vote: a member back from a pause or a partition does not depose the leader by campaigning.
HEARTBEAT_MS = int(os.environ.get("MQSTORE_ETCD_HEARTBEAT_MS", "25"))
ELECTION_TIMEOUT_MS = int(os.environ.get("MQSTORE_ETCD_ELECTION_TIMEOUT_MS", "150"))


@dataclass
class Member:
    """One member of a :class:`LocalEtcdCluster`: its name, ports and data dir; its process while it runs."""
    name: str
    client_port: int
    peer_port: int
    data_dir: str
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class LocalEtcdCluster:
    """``size`` etcd members on 127.0.0.1 forming one cluster. ``ports``: (client, peer) of each member
    (free ports when not given); ``data_dir``: each member's data under ``<data_dir>/<name>``, its stderr in
    ``<data_dir>/<name>.log`` (a temporary directory, removed by :meth:`stop`, when not given)."""

    def __init__(self, size: int = 3, binary: str | None = None, data_dir: str | None = None,
                 ports: Sequence[tuple[int, int]] | None = None, heartbeat_ms: int = HEARTBEAT_MS,
                 election_timeout_ms: int = ELECTION_TIMEOUT_MS):
        self.timings = ("--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_timeout_ms),
                        "--pre-vote")
        self.binary = binary or find_binary()
        if self.binary is None:
            raise FileNotFoundError(f"no etcd binary: {INSTALL_HINT}")
        if ports is None:
            taken: set[int] = set()
            while len(taken) < 2 * size:
                taken.add(_free_port())
            chosen = sorted(taken)
            ports = [(chosen[2 * i], chosen[2 * i + 1]) for i in range(size)]
        if len(ports) != size or len({p for pair in ports for p in pair}) != 2 * size:
            raise ValueError(f"{size} etcd members need {2 * size} distinct ports, not {list(ports)}")
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="mqstore-etcd-")
        self.members = [Member(f"e{i + 1}", client, peer, os.path.join(self.data_dir, f"e{i + 1}"))
                        for i, (client, peer) in enumerate(ports)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> str:
        """Every member's client address, comma-separated (what ``--etcd-endpoints`` takes)."""
        return ",".join(m.endpoint for m in self.members)

    def _launch(self, member: Member) -> None:
        with open(os.path.join(self.data_dir, f"{member.name}.log"), "ab") as log:
            member.process = subprocess.Popen(
                [self.binary, "--name", member.name, "--data-dir", member.data_dir,
                 "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
                 "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
                 "--initial-cluster", self.initial_cluster, "--initial-cluster-token", "mqstore",
                 "--initial-cluster-state", "new", *self.timings, "--log-level", "error", "--logger", "zap"],
                stdout=subprocess.DEVNULL, stderr=log)

    def _wait_healthy(self, members: Sequence[Member], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = list(members)
        while waiting and time.monotonic() < deadline:
            for member in list(waiting):
                if member.process.poll() is not None:
                    with open(os.path.join(self.data_dir, f"{member.name}.log"), "rb") as log:
                        tail = log.read()[-2000:]
                    raise RuntimeError(f"etcd member {member.name} exited with {member.process.returncode}: {tail!r}")
                if _healthy(member.client_url):
                    waiting.remove(member)
            if waiting:
                time.sleep(0.05)
        if waiting:
            raise RuntimeError(f"etcd members {[m.name for m in waiting]} were not healthy within {timeout_s} s")

    def start(self, timeout_s: float = 60.0) -> "LocalEtcdCluster":
        """Every member at once (a member is healthy only once a quorum elected a leader). A data dir kept
        from an earlier run is reused if that run's members had the same names and peer ports (the cluster
        keeps its membership in its data; other ports would leave each member calling peers that are not
        there): RuntimeError, naming the ports of then, otherwise."""
        os.makedirs(self.data_dir, exist_ok=True)
        plan = os.path.join(self.data_dir, "initial-cluster")
        if os.path.exists(plan):
            with open(plan) as file:
                then = file.read().strip()
            if then != self.initial_cluster:
                raise RuntimeError(f"the etcd data in {self.data_dir} is of a cluster of {then}, not "
                                   f"{self.initial_cluster}: give the peer ports of then, or remove that directory "
                                   f"(the commit log nodes keep their data and epochs; a new cluster has no in-sync "
                                   f"set yet)")
        with open(plan, "w") as file:
            file.write(self.initial_cluster + "\n")
        try:
            for member in self.members:
                self._launch(member)
            self._wait_healthy(self.members, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def kill9(self, index: int) -> Member:
        member = self.members[index]
        if member.process is not None:
            member.process.kill()
            member.process.wait(10)
        return member

    def pause(self, index: int, timeout_s: float = 10.0) -> Member:
        """SIGSTOP: the member holds its connections but answers nothing (a member cut off). Returns once every
        thread of it has stopped (Linux's /proc; elsewhere at once): the signal takes effect asynchronously, and
        a call made right after it was once answered by the member on a loaded machine."""
        member = self.members[index]
        member.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while not _stopped(member.process.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        return member

    def resume(self, index: int) -> Member:
        member = self.members[index]
        member.process.send_signal(signal.SIGCONT)
        return member

    def restart(self, index: int, timeout_s: float = 60.0) -> Member:
        """Start a member that was killed again, on its data dir: it rejoins the cluster."""
        member = self.members[index]
        if member.running:
            raise RuntimeError(f"etcd member {member.name} is running")
        self._launch(member)
        self._wait_healthy([member], timeout_s)
        return member

    def stop(self) -> None:
        for member in self.members:
            if member.running:
                member.process.send_signal(signal.SIGCONT)  # a paused member would never see SIGTERM
                member.process.terminate()
        for member in self.members:
            if member.process is None:
                continue
            try:
                member.process.wait(10)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait(10)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "LocalEtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
