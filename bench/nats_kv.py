"""NATS JetStream KV as the peer of BatchGetLatest: Debian's nats-server (installed with apt-get when
absent, as redis_peer.py does for Redis), driven by a minimal client written here on the NATS text
protocol (CONNECT, PUB, SUB, MSG/HMSG; no client library is pinned in the project).

The bucket is what a KV bucket is under the hood: stream ``KV_bench`` on subjects ``$KV.bench.>`` with
max_msgs_per_subject 1 and allow_direct. It is loaded with the same keys and 1 KiB values; a get is a
direct get of the last message of ``$KV.bench.<key>`` (what a client's kv.get does with allow_direct),
sequential, for ``duration_s``.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import socket
import subprocess
import time

from procs import BenchError, free_port, spawn, stop


def ensure_installed() -> None:
    if shutil.which("nats-server"):
        return
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    install = ["apt-get", "install", "-y", "-q", "nats-server"]
    done = subprocess.run(install, env=env, capture_output=True, timeout=300)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
        done = subprocess.run(install, env=env, capture_output=True, timeout=300)
    if done.returncode != 0 or not shutil.which("nats-server"):
        raise BenchError(f"could not install nats-server: {done.stderr.decode(errors='replace')[-300:]}")


class Nats:
    """One connection; requests are sequential (one inbox, replies read in order)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.file = self.sock.makefile("rb")
        self.file.readline()  # INFO
        self._send(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
                   b"SUB _INBOX.bench 1\r\nPING\r\n")
        self._until_pong()

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _until_pong(self) -> None:
        while (line := self.file.readline()) and not line.startswith(b"PONG"):
            if line.startswith(b"-ERR"):
                raise BenchError(f"nats: {line!r}")

    def publish(self, subject: str, payload: bytes, reply: str = "_INBOX.bench") -> None:
        self._send(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")

    def reply(self) -> tuple[bytes, bytes]:
        """(headers, payload) of the next message on the inbox."""
        while True:
            line = self.file.readline()
            if line.startswith(b"PING"):
                self._send(b"PONG\r\n")
                continue
            parts = line.split()
            if parts[0] == b"MSG":
                data = self.file.read(int(parts[-1]) + 2)
                return b"", data[:-2]
            if parts[0] == b"HMSG":
                head, total = int(parts[-2]), int(parts[-1])
                data = self.file.read(total + 2)
                return data[:head], data[head:total]
            if parts[0] == b"-ERR":
                raise BenchError(f"nats: {line!r}")

    def request(self, subject: str, payload: bytes) -> tuple[bytes, bytes]:
        self.publish(subject, payload)
        return self.reply()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def measure(work: pathlib.Path, keys: list[str], value: bytes, duration_s: float) -> dict:
    ensure_installed()
    port = free_port()
    store = work / "nats"
    store.mkdir(exist_ok=True)
    proc = spawn(["nats-server", "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)], work / "nats.log")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = Nats(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        config = {"name": "KV_bench", "subjects": ["$KV.bench.>"], "max_msgs_per_subject": 1, "discard": "new",
                  "allow_direct": True, "allow_rollup_hdrs": True, "deny_delete": True, "storage": "file",
                  "num_replicas": 1}
        _, created = client.request("$JS.API.STREAM.CREATE.KV_bench", json.dumps(config).encode())
        if b'"error"' in created:
            raise BenchError(f"nats: stream create: {created[:300]!r}")
        for first in range(0, len(keys), 500):  # pipelined puts, each acknowledged
            chunk = keys[first:first + 500]
            for key in chunk:
                client.publish(f"$KV.bench.{key}", value)
            for _ in chunk:
                client.reply()
        rng, gets, found = random.Random(1), 0, 0
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            key = rng.choice(keys)
            _, payload = client.request("$JS.API.DIRECT.GET.KV_bench", json.dumps({"last_by_subj": f"$KV.bench.{key}"})
                                        .encode())
            found += payload == value
            gets += 1
        seconds = time.perf_counter() - started
        client.close()
        return {"get_keys_per_s": gets / seconds, "gets": gets, "found": found, "server": "nats-server (Debian)"}
    finally:
        stop(proc)
