"""Issue 32's rows on failed authentication, against a real CommitLog process with ``--auth``:

* a flood of new wrong secrets and unknown users (16 threads, in a process of their own, for 5 s) beside
  a legitimate caller whose credentials are cached: the legitimate median stays within a generous bound of
  its unloaded value, the server's peak memory within a generous factor of its size before, the scrypt
  verifications stay few (the failure backoff refuses the rest without a hash), and the denial lines are
  sampled while the metric counts every denial. Before the fix every wrong secret was an scrypt of its
  own, as many at once as there were callers (16 MiB each), and every denial a log line.
* 60 MiB request bodies sent without credentials or with wrong ones, 6 at once: all UNAUTHENTICATED, and the
  server never reads them (its peak memory grows by far less than one body; Append answered on the port's
  event loop, mqstore_rpc.aio). Before the fix the server read and parsed each body before the
  check: the commit log's peak RSS went from 72 to 828 MiB.

The bounds are generous on purpose (a loaded 2-core machine); bench/auth_flood.py reports the figures.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import pathlib
import statistics
import sys
import threading
import time

import grpc
import pytest

from mqstore.auth.admin import AccessAdmin
from mqstore.access import ALLOW, NORMAL, PUB, TOPIC
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_rpc.auth import token
from mqstore_rpc.gen.mqstore.v1 import common_pb2, commitlog_pb2, commitlog_pb2_grpc
from tests.support.processes import commitlog
from tests.support.scrape import scrape

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
# The attackers are bench/auth_flood.py's (one copy of them): 16 threads of Appends, each with a new random
# secret, half for alice and half for a new unknown user.
from auth_flood import attack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
INTERNAL = "flood-internal-token-77"
USER, SECRET = "alice", "alice-secret-0001"
TOPIC_NAME = "orders"
MiB = 1024 * 1024
FLOOD_S = 5.0
ATTACKERS = 16
RPC_TIMEOUT_S = 30


def _metadata(user: str, secret: str) -> tuple:
    return (("authorization", token(user, secret)),)


def _append_request(body: bytes = b"x") -> commitlog_pb2.AppendRequest:
    return commitlog_pb2.AppendRequest(topic=TOPIC_NAME, messages=[common_pb2.MessageInput(body=body)])


def memory_mib(pid: int) -> dict[str, float]:
    """The process's resident memory now (VmRSS) and at its peak so far (VmHWM), in MiB."""
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


@contextlib.contextmanager
def log_server(data: pathlib.Path, *extra: str):
    """A CommitLog process with auth on, the user alice (PUB on topic orders) and the topic; yields the
    process, its address, its metrics port and a channel to it (that may send 60 MiB messages)."""
    url = f"sqlite:///{data / 'auth.db'}"
    store = AuthStore(url, SystemClock())
    try:
        admin = AccessAdmin(store)
        admin.create_user(USER, NORMAL, SECRET)
        admin.add_rule(USER, TOPIC, TOPIC_NAME, frozenset({PUB}), ALLOW)
    finally:
        store.close()
    with commitlog(data / "log", "--auth", "--auth-url", url, "--metrics-port", "0", *extra,
                   env={"MQSTORE_INTERNAL_TOKEN": INTERNAL}) as server:
        started = server.wait_for("server.started")
        address = f"127.0.0.1:{started['port']}"
        options = [("grpc.max_send_message_length", 100 * MiB)]
        with grpc.insecure_channel(address, options=options) as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
                commitlog_pb2.CreateTopicRequest(name=TOPIC_NAME, queue_count=1), timeout=RPC_TIMEOUT_S,
                metadata=_metadata("service", INTERNAL))
            yield server, address, started["metrics_port"], channel


def _timed_appends(append, until: float, at_most: int) -> list[float]:
    latencies = []
    while len(latencies) < at_most and time.monotonic() < until:
        t0 = time.perf_counter()
        assert append(_append_request(), timeout=RPC_TIMEOUT_S, metadata=_metadata(USER, SECRET)).results
        latencies.append(time.perf_counter() - t0)
    return latencies


def flood(address: str, append, seconds: float = FLOOD_S, threads: int = ATTACKERS) -> tuple[list[float], dict]:
    """The legitimate caller's latencies while ``threads`` attackers flood ``address`` for ``seconds``, and
    the attackers' calls by status code."""
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    attacker = spawn.Process(target=attack, args=(address, seconds, threads, results), daemon=True)
    attacker.start()
    try:
        assert results.get(timeout=120) == "flooding"          # the child's imports and channels first
        latencies = _timed_appends(append, time.monotonic() + seconds * 0.9, 1_000_000)
        codes = results.get(timeout=seconds + 2 * RPC_TIMEOUT_S)
    finally:
        attacker.join(RPC_TIMEOUT_S)
        if attacker.is_alive():
            attacker.kill()
            attacker.join(RPC_TIMEOUT_S)
    return latencies, codes


def test_a_flood_of_wrong_secrets_leaves_a_cached_caller_fast_and_the_server_small(tmp_path):
    with log_server(tmp_path) as (server, address, metrics_port, channel):
        pid = server.process.pid
        append = commitlog_pb2_grpc.CommitLogStub(channel).Append
        _timed_appends(append, time.monotonic() + 60, 20)                 # the first call hashes; then cached
        unloaded = statistics.median(_timed_appends(append, time.monotonic() + 60, 200))
        before = memory_mib(pid)
        hashed_before = scrape(metrics_port).value("mqstore_auth_secret_verifications_total")

        latencies, codes = flood(address, append)

        after = memory_mib(pid)
        flooded = statistics.median(latencies)
        figures = scrape(metrics_port)
        hashed = figures.value("mqstore_auth_secret_verifications_total") - hashed_before
        denied = figures.value("mqstore_auth_denied_total")
        report = (f"legitimate p50 {unloaded * 1e3:.2f} ms unloaded, {flooded * 1e3:.2f} ms under the flood "
                  f"({len(latencies)} calls); peak RSS {before['VmRSS']:.0f} -> {after['VmHWM']:.0f} MiB; "
                  f"{hashed:.0f} scrypt verifications; attackers: {codes}")
        print(report)
        assert set(codes) <= {"UNAUTHENTICATED", "UNAVAILABLE"} and codes.get("UNAUTHENTICATED", 0) > ATTACKERS
        # The target is 3x and 1.2x (bench/auth_flood.py measures them); asserted generously
        assert flooded <= max(10 * unloaded, 0.05), report
        assert after["VmHWM"] <= 1.5 * before["VmRSS"] + 32, report
        # Per address: 10 failures, then one per window of 1, 2, 4 s...; per user alice the same
        assert hashed <= 40, report
        assert figures.value("mqstore_auth_throttled_total", reason="backoff") > 0, report
    assert server.process.returncode == 0
    events = [json.loads(line) for line in server.stderr().splitlines() if line.startswith("{")]
    lines = [e for e in events if e.get("event") == "auth.denied"]
    suppressed = sum(e["suppressed"] for e in events if e.get("event") == "auth.denied_suppressed")
    assert len(lines) + suppressed == denied and len(lines) <= 400, (len(lines), suppressed, denied)


def test_unauthenticated_60_mib_bodies_are_refused_without_being_read(tmp_path):
    with log_server(tmp_path) as (
            server, _, metrics_port, channel):
        pid = server.process.pid
        append = commitlog_pb2_grpc.CommitLogStub(channel).Append
        big = _append_request(os.urandom(60 * MiB))
        before = memory_mib(pid)
        def send(metadata: tuple, codes: list[grpc.StatusCode]) -> None:
            try:
                append(big, timeout=RPC_TIMEOUT_S, metadata=metadata)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        for metadata in ((), _metadata("nobody", "wrong-secret-0001"), _metadata(USER, "wrong-secret-0002")):
            codes: list[grpc.StatusCode] = []
            senders = [threading.Thread(target=send, args=(metadata, codes)) for _ in range(6)]
            for t in senders:
                t.start()
            for t in senders:
                t.join(2 * RPC_TIMEOUT_S)
            assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 6, metadata
        after = memory_mib(pid)
        # 18 bodies of 60 MiB refused. Read and parsed first, they took 700 to 1,000 MiB more at the peak; now
        # what grpc receives of each is its stream's HTTP/2 window until the refusal (grown by grpc's BDP
        # probing: 25-105 MiB in all measured here), and two scrypt hashes of 16 MiB
        assert after["VmHWM"] - before["VmRSS"] <= 200, (before, after)
        # alice's first call (credentials not cached yet: the screened handler) is served, as a unary call
        assert append(_append_request(os.urandom(MiB)), timeout=RPC_TIMEOUT_S, metadata=_metadata(USER, SECRET)).results
        figures = scrape(metrics_port)
        unary = dict(grpc_service="mqstore.v1.CommitLog", grpc_method="Append", grpc_type="unary")
        assert figures.value("grpc_server_handled_total", grpc_code="OK", **unary) == 1
        assert figures.value("grpc_server_handled_total", grpc_code="UNAUTHENTICATED", **unary) == 18
        assert not figures.has("grpc_server_handled_total", grpc_type="client_stream", grpc_method="Append")
