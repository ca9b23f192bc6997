"""Processes of the benchmark: servers (mqstore, no-op, Redis) and load generators.

Every process started here is registered in ``STARTED`` and stopped by :func:`stop_all` (run.py calls it
in a ``finally``); each wait has a timeout, after which the process is killed. Everything binds
127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import signal
import socket
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import diskuse

BENCH_DIR = pathlib.Path(__file__).resolve().parent
PYTHON = sys.executable
STARTED: list[subprocess.Popen] = []
STOP_TIMEOUT_S = 20.0


class BenchError(RuntimeError):
    """A workload could not run (a process failed to start, timed out or reported an error)."""


def spawn(args: list[str], stderr_path: pathlib.Path | None = None, **kwargs) -> subprocess.Popen:
    stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stderr=stderr, **kwargs)
    finally:
        if stderr_path:
            stderr.close()
    STARTED.append(proc)
    return proc


def stop(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc in STARTED:
        STARTED.remove(proc)
    return proc.returncode


def kill9(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)
    if proc in STARTED:
        STARTED.remove(proc)


def stop_all() -> None:
    for proc in list(reversed(STARTED)):
        stop(proc, 5.0)


def free_port() -> int:
    """A port free on 127.0.0.1 now (for servers that cannot report the port they bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json_lines(path: pathlib.Path) -> list[dict]:
    events = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return events
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a kill -9
    return events


def wait_for_event(proc: subprocess.Popen, log_path: pathlib.Path, event: str, timeout_s: float) -> dict:
    """The first JSON log line with ``event`` from ``proc`` (a line naming another pid is an earlier
    process's, in the same log file); BenchError if the process exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for e in read_json_lines(log_path):
            if e.get("event") == event and e.get("pid", proc.pid) == proc.pid:
                return e
        if proc.poll() is not None:
            raise BenchError(f"{proc.args[:4]} exited with {proc.returncode} before {event}; see {log_path}: "
                             f"{log_path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.02)
    raise BenchError(f"no {event} from {proc.args[:4]} within {timeout_s} s; see {log_path}")


def is_serving(port: int, timeout_s: float = 0.1) -> bool:
    """One health probe on a fresh channel (so no reconnect back-off delays the next probe)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def wait_serving(proc: subprocess.Popen, port: int, timeout_s: float, interval_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_serving(port):
            return
        if proc.poll() is not None:
            raise BenchError(f"{proc.args[:4]} exited with {proc.returncode} before serving")
        time.sleep(interval_s)
    raise BenchError(f"port {port} not SERVING within {timeout_s} s")


def memory_kib(pid: int) -> dict:
    """VmRSS, VmHWM (peak RSS), RssAnon and RssFile of a process, in KiB, from /proc/PID/status."""
    wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in wanted:
                found[name] = int(value.split()[0])
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The codecs a server can run (mqstore.codec): the compiled one, or the pure-Python reference.
CODEC_COMPILED, CODEC_PYTHON = "compiled", "python"
# Suffix of a mode (ASYNC, SYNC) measured on the pure-Python codec, in the results and tables.
PY_SUFFIX = "-py"


class GrpcServer:
    """An mqstore CommitLog server or the no-op server as a child process, with its JSON log file."""

    def __init__(self, name: str, args: list[str], log_path: pathlib.Path, env: dict[str, str] | None = None):
        self.name, self.args, self.log_path = name, args, log_path
        self.env = {**os.environ, **env} if env else None
        self.codec = ""  # for a CommitLog server: the codec it must report (check_codec)
        self.data_dir: pathlib.Path | None = None  # for a CommitLog server: its --data-dir
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @classmethod
    def commitlog(cls, data_dir: pathlib.Path, flush_mode: str, port: int = 0, extra: tuple[str, ...] = (),
                  log_name: str = "", codec: str = CODEC_COMPILED):
        """``codec``: CODEC_PYTHON runs the server with MQSTORE_PURE_PYTHON=1 (mqstore.codec)."""
        args = [PYTHON, "-m", "commitlog_service.main", "--data-dir", str(data_dir), "--host", "127.0.0.1",
                "--port", str(port), "--flush-mode", flush_mode, *extra]
        env = {"MQSTORE_PURE_PYTHON": "1" if codec == CODEC_PYTHON else "0"}
        suffix = "" if codec == CODEC_COMPILED else PY_SUFFIX
        server = cls(f"mqstore-{flush_mode}{suffix}", args, data_dir.parent / (log_name or f"{data_dir.name}.log"), env)
        server.codec, server.data_dir = codec, data_dir
        return server

    @classmethod
    def noop(cls, log_dir: pathlib.Path, log_name: str = "noop.log", flavour: str = "", name: str = "noop"):
        """``flavour``: noop_server.py's --flavour ("" its default: every handler in the handler pool)."""
        return cls(name, [PYTHON, str(BENCH_DIR / "noop_server.py"), "--port", "0",
                          *(("--flavour", flavour) if flavour else ())], log_dir / log_name)

    def start_timed(self, port: int, timeout_s: float) -> float:
        """Start on a known ``port`` and return the seconds from spawn until gRPC health says SERVING."""
        started = time.perf_counter()
        self.proc = spawn(self.args, self.log_path, env=self.env)
        self.port = port
        wait_serving(self.proc, port, timeout_s, interval_s=0.005)
        return time.perf_counter() - started

    def events(self, name: str) -> list[dict]:
        return [e for e in read_json_lines(self.log_path) if e.get("event") == name]

    def start(self, timeout_s: float = 120.0) -> "GrpcServer":
        self.proc = spawn(self.args, self.log_path, env=self.env)
        started = wait_for_event(self.proc, self.log_path, "server.started", timeout_s)
        self.port = started["port"]
        wait_serving(self.proc, self.port, timeout_s)
        return self

    def restart_empty(self, timeout_s: float = 120.0) -> "GrpcServer":
        """Stop a CommitLog server, delete its data and start it again on the empty directory (another
        port, the same flags): how a benchmark keeps its disk use bounded."""
        if self.stop() != 0:
            raise BenchError(f"{self.name} exited uncleanly before its data was reset; see {self.log_path}")
        diskuse.remove(self.data_dir)
        return self.start(timeout_s)

    def check_codec(self) -> "GrpcServer":
        """Refuse to measure a server whose GetStoreInfo names another codec than asked for (e.g. a
        build without the extension measured as 'compiled')."""
        from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
        with grpc.insecure_channel(self.target) as channel:
            active = commitlog_pb2_grpc.CommitLogStub(channel).GetStoreInfo(
                commitlog_pb2.GetStoreInfoRequest(), timeout=30).codec
        if self.codec and active != self.codec:
            raise BenchError(f"{self.name} runs the {active!r} codec, not {self.codec!r}: run make setup "
                             f"(the compiled codec needs a C compiler)")
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def memory_kib(self) -> dict:
        return memory_kib(self.proc.pid)

    def stop(self) -> int:
        return stop(self.proc) if self.proc else 0


def run_loadgen(spec: dict, processes: int = 1, timeout_s: float = 120.0,
                env: dict[str, str] | None = None) -> list[dict]:
    """Run ``processes`` loadgen processes with the same spec (concurrency split between them), with
    ``env`` added to their environment (grpc's variables: bench/security.py).

    With several processes they agree on a wall-clock start so that their windows coincide.
    """
    if processes > 1:
        spec = {**spec, "start_at": time.time() + 2.0}
    share = [spec["concurrency"] // processes + (1 if i < spec["concurrency"] % processes else 0)
             for i in range(processes)]
    procs = []
    for n in share:
        if n > 0:
            spec_n = json.dumps({**spec, "concurrency": n})
            procs.append(subprocess.Popen([PYTHON, str(BENCH_DIR / "loadgen.py"), spec_n],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          env={**os.environ, **env} if env else None))
            STARTED.append(procs[-1])
    results = []
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchError(f"loadgen {spec['kind']} did not finish within {timeout_s} s") from None
            if proc.returncode != 0:
                raise BenchError(f"loadgen {spec['kind']} failed with status {proc.returncode}: "
                                 f"{err.decode(errors='replace')[-1000:]}")
            results.append(json.loads(out))
    finally:
        for proc in procs:
            stop(proc, 2.0)
    return results


def git_rev() -> str:
    """The commit measured, and whether tracked code differed from it (read-only git commands)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "core", "services", "protos"],
                                    cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (rev or "unknown") + (" plus uncommitted changes in core/services/protos" if dirty else "")


def run_meta(mode: str, **extra) -> dict:
    """What every table of a single bench's run begins with: when, the machine and its load at the end, the
    mode (quick, partial, full) and the commit measured, then ``extra`` (its workload and disk figures)."""
    return {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.node()} "
            f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)", "mode": mode,
            "git": git_rev(), **extra}


def write_table(out_dir: pathlib.Path, stem: str, meta: dict, table: list[dict], raw, markdown) -> None:
    """``stem``.json (meta, rows and the raw measurements) and ``stem``.md (``markdown(table, meta)``, also
    printed) in ``out_dir``."""
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": table, "raw": raw}, indent=1) + "\n")
    text = markdown(table, meta)
    (out_dir / f"{stem}.md").write_text(text)
    print(text)
