"""Real service processes for crash and end-to-end tests.

``ServiceProcess`` runs ``python -m <module> ... --port 0`` on 127.0.0.1, learns the bound port from
the ``server.started`` JSON log event, drains stderr in a thread (so the child never blocks on a full
pipe), and always ends the child: ``stop()`` sends SIGTERM and waits up to ``STOP_TIMEOUT_S``, then
SIGKILL; ``kill9()`` is the crash. Use it as a context manager or call stop() in a finally.

The stop deadline is generous on purpose: on a loaded 2-core machine a clean stop (grace for running
RPCs, duties joined, flush, checkpoint) has taken more than 30 s, and a test that asserts ``stop() ==
0`` then saw -9. A stop that needs SIGKILL says so on stderr with the child's last log lines (pytest
shows them with the failure), so a slow stop is never mistaken for a crash.

File sizes: the services' defaults are for production (1 GiB commit log segments, allocated for real, the
next one created ahead of the writer; consume queue files of 5.7 MB; index files of 400 MB), and with them
every service a test started kept over 1 GB in pytest's temp dir: a full run left 25-28 GB there. So a
ServiceProcess gets the small sizes of :data:`SMALL_FILES` through the environment; a flag the test passes
wins (flags win over variables), and so does a variable in its ``env``; the same variable in the test
process's own environment does not.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 120        # SIGTERM to exit; then SIGKILL (reported)
KILL_TIMEOUT_S = 30
LAST_LINES = 20
MiB = 1024 * 1024

# Per module: 16 MiB commit log segments (a 4 MiB body still fits one) created 4 MiB ahead of the
# writer instead of 64 MiB; the rest as mqstore_launcher gives make run: consume queue files of
# 50,000 entries (1 MB), index files of 100,000 slots and 400,000 entries (8.4 MB), compaction log
# segments of 8 MiB.
COMMITLOG = "mqstore_launcher.node"  # mqstore-commitlog: the commit log with Local mode's flags
_SMALL_LOG = {"MQSTORE_SEGMENT_SIZE_BYTES": str(16 * MiB), "MQSTORE_WARM_AHEAD_BYTES": str(4 * MiB),
              "MQSTORE_CQ_ENTRIES_PER_FILE": "50000"}
SMALL_FILES: dict[str, dict[str, str]] = {
    COMMITLOG: _SMALL_LOG,
    "commitlog_service.main": _SMALL_LOG,  # the commit log alone (a 1 GiB segment allocated otherwise)
    "index_service.main": {"MQSTORE_SLOT_COUNT": "100000", "MQSTORE_ENTRY_COUNT": "400000"},
    "compactor_service.main": {"MQSTORE_SEGMENT_SIZE_BYTES": str(8 * MiB)},
}


class ServiceProcess:
    def __init__(self, module: str, args: list[str], env: dict[str, str] | None = None):
        command = [sys.executable, "-m", module, *args]
        full_env = {**os.environ, **SMALL_FILES.get(module, {}), **(env or {})}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=full_env)
        self.events: queue.Queue[dict] = queue.Queue()
        self.lines: list[str] = []
        self.address = ""
        self.stdout_lines: list[str] = []
        self._reader = threading.Thread(target=self._drain, name=f"{module}-stderr", daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=lambda: self.stdout_lines.extend(self.process.stdout),
                                            name=f"{module}-stdout", daemon=True)
        self._out_reader.start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                self.events.put({"event": "not-json", "line": line})

    def wait_for(self, event: str, timeout_s: float = START_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.process.poll() is not None and self.events.empty():
                    break
                continue
            if item.get("event") == event:
                return item
        raise AssertionError(f"no {event!r} event within {timeout_s} s (exit code {self.process.poll()}); "
                             f"stderr:\n{self.stderr()}")

    def started(self, timeout_s: float = START_TIMEOUT_S) -> "ServiceProcess":
        """Wait for ``server.started``; if it never comes, stop the process before raising, since
        the caller gets no object to stop."""
        try:
            event = self.wait_for("server.started", timeout_s)
        except BaseException:
            self.stop()
            raise
        self.address = f"127.0.0.1:{event['port']}"
        return self

    def serving(self, timeout_s: float = START_TIMEOUT_S) -> "ServiceProcess":
        """Wait until the standard health check answers SERVING: a started service may still be recovering
        (the Transaction service reads the log up to the end it saw at start, answering UNAVAILABLE until
        then), and health means ready. Stops the process before raising, as started() does."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline, status = time.monotonic() + timeout_s, None
        try:
            with grpc.insecure_channel(self.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while time.monotonic() < deadline:
                    try:
                        status = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                    except grpc.RpcError as exc:
                        status = exc.code()
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return self
                    time.sleep(0.05)
            raise AssertionError(f"{self.address} not SERVING within {timeout_s} s (last: {status}); "
                                 f"stderr:\n{self.stderr()}")
        except BaseException:
            self.stop()
            raise

    def wait_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        code = self.process.wait(timeout_s)
        self._reader.join(KILL_TIMEOUT_S)
        return code

    def stderr(self) -> str:
        return "".join(self.lines)

    @property
    def stdout(self) -> str:
        return "".join(self.stdout_lines)

    def kill9(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(KILL_TIMEOUT_S)
        self._reader.join(KILL_TIMEOUT_S)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it has not exited within STOP_TIMEOUT_S (said on stderr); the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            began = time.monotonic()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(KILL_TIMEOUT_S)
                last = "".join(self.lines[-LAST_LINES:])
                waited_s = time.monotonic() - began
                print(f"{self.process.args[2]} (pid {self.process.pid}) had not exited {waited_s:.0f} s after "
                      f"SIGTERM: killed with SIGKILL. Its last log lines:\n{last}", file=sys.stderr)
        self._reader.join(KILL_TIMEOUT_S)
        self._out_reader.join(KILL_TIMEOUT_S)
        for stream in (self.process.stderr, self.process.stdout):
            if stream and not stream.closed:
                stream.close()
        return self.process.returncode

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def commitlog(data_dir, *extra: str, env: dict[str, str] | None = None) -> ServiceProcess:
    return ServiceProcess(COMMITLOG,
                          ["--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", *extra], env)
