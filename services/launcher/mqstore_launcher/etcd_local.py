"""A throwaway etcd on 127.0.0.1 for `make run-ha` and the tests: free ports, a temporary data directory,
health checked before use, always stopped (SIGTERM, then SIGKILL), its directory removed.

The binary is Debian's ``etcd-server`` package (``/usr/bin/etcd``, 3.4.23 in bookworm), installed by
``make setup-ha`` (the Makefile) and by .ci/run; :func:`find_binary` says how to install it when it is
missing. Not for production: one member, no TLS, no auth.

Thread-safety: one owner per instance.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

INSTALL_HINT = "install Debian's etcd-server (apt-get install etcd-server) or run `make setup-ha`"


def find_binary() -> str | None:
    """The etcd server binary (``MQSTORE_ETCD_BINARY``, else ``etcd`` on PATH), or None."""
    return os.environ.get("MQSTORE_ETCD_BINARY") or shutil.which("etcd")


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
