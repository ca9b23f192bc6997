"""Redis Streams as the peer a user might pick instead: Debian's redis-server driven by redis-benchmark.

Each instance is our own process on a free 127.0.0.1 port with a temp directory: ``appendonly yes``,
``appendfsync everysec`` (against our ASYNC) or ``always`` (against our SYNC), ``save ""`` (no RDB
snapshots; AOF rewrites stay at Redis's defaults, as a user would have them). The workload is
``XADD <stream> * field <1024-byte value>`` with pipeline 100 from ``-c`` connections; redis-benchmark's
``--csv`` line gives requests/s (= messages/s) and latency percentiles per request.

redis-benchmark 7.0 has no data-size placeholder for a custom command (``-d`` applies only to its
built-in SET/GET tests), so the 1 KiB value is passed as the literal last argument.
"""

from __future__ import annotations

import csv
import io
import pathlib
import shutil
import socket
import subprocess
import time

from procs import BenchError, free_port, memory_kib, spawn, stop

VALUE = "v" * 1024
PIPELINE = 100


def ensure_installed() -> str:
    """'present', or 'installed with apt-get' after installing Debian's redis-server; BenchError if not."""
    if shutil.which("redis-server") and shutil.which("redis-benchmark"):
        return "present"
    print("bench: redis-server is not installed; installing Debian's redis-server with apt-get", flush=True)
    install = ["apt-get", "install", "-y", "-q", "redis-server"]
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(install, env=env, capture_output=True, timeout=300)
    if done.returncode != 0:  # a fresh machine may not have package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
        done = subprocess.run(install, env=env, capture_output=True, timeout=300)
    if done.returncode != 0 or not shutil.which("redis-benchmark"):
        raise BenchError(f"could not install redis-server: {done.stderr.decode(errors='replace')[-500:]}")
    return "installed with apt-get"


def _command(port: int, *args: str, timeout_s: float = 30.0) -> bytes:
    """Send one command in RESP and return the first reply line (enough for PING, DEL, CONFIG SET)."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        conn.sendall(payload.encode())
        return conn.makefile("rb").readline().strip()


class RedisServer:
    def __init__(self, work_dir: pathlib.Path, fsync: str):
        self.fsync = fsync
        self.dir = work_dir / f"redis-{fsync}"
        self.dir.mkdir(parents=True)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> "RedisServer":
        self.port = free_port()
        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
                "--appendonly", "yes", "--appendfsync", self.fsync, "--save", "", "--daemonize", "no",
                "--protected-mode", "yes", "--logfile", str(self.dir / "redis.log")]
        self.proc = spawn(args)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"redis-server exited with {self.proc.returncode}; see {self.dir / 'redis.log'}")
            try:
                if _command(self.port, "PING", timeout_s=1.0) == b"+PONG":
                    return self
            except OSError:
                pass  # not listening yet
            time.sleep(0.05)
        raise BenchError(f"redis-server not answering PING within {timeout_s} s")

    def benchmark(self, clients: int, requests: int, timeout_s: float) -> dict:
        """One redis-benchmark run of XADD; the stream is deleted afterwards so every run starts empty."""
        stream = f"bench-stream-{clients}"
        args = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(self.port), "-n", str(requests),
                "-P", str(PIPELINE), "-c", str(clients), "--csv", "XADD", stream, "*", "field", VALUE]
        try:
            done = subprocess.run(args, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"redis-benchmark -c {clients} -n {requests} took over {timeout_s} s") from None
        if done.returncode != 0:
            raise BenchError(f"redis-benchmark failed: {done.stderr.decode(errors='replace')[-500:]}")
        row = parse_csv(done.stdout.decode())
        length = _command(self.port, "XLEN", stream)
        _command(self.port, "DEL", stream)
        return {"msgs_per_s": float(row["rps"]), "p50_ms": float(row["p50_latency_ms"]),
                "p99_ms": float(row["p99_latency_ms"]), "requests": requests, "clients": clients,
                "stream_length": int(length.lstrip(b":") or 0)}

    def measure(self, clients: int, duration_s: float, probe_requests: int) -> dict:
        """Size the run from a short probe so that it lasts about ``duration_s``."""
        probe = self.benchmark(clients, probe_requests, timeout_s=60.0)
        requests = int(min(max(probe["msgs_per_s"] * duration_s, probe_requests), 3_000_000))
        requests -= requests % (PIPELINE * clients)  # whole pipelines per connection
        result = self.benchmark(clients, max(requests, PIPELINE * clients), timeout_s=duration_s * 6 + 30)
        if result["stream_length"] != result["requests"]:
            raise BenchError(f"Redis stream has {result['stream_length']} entries after {result['requests']} XADDs")
        return result

    def memory_kib(self) -> dict:
        return memory_kib(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def parse_csv(text: str) -> dict:
    """The first data row of redis-benchmark --csv output as a dict (header: test, rps, ...)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or "rps" not in rows[0]:
        raise BenchError(f"unexpected redis-benchmark output: {text[:300]!r}")
    return rows[0]
