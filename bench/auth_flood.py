"""What a flood of failed logins costs a server: ``make bench`` runs ``bench/auth_flood.py`` (bench/README.md).

A CommitLog process with authentication on (ASYNC flush, the synchronous gRPC server) and one user, alice,
with PUB on topic ``orders``. Measured, in order:

  unloaded   alice's Append (one 1-byte message) called back to back, credentials cached: the median
             latency, and the server's RSS
  flood      the same while THREADS attackers (a process of their own, so that the legitimate caller's
             process is not slowed by them) send Appends with a new random secret each, half for alice,
             half for a new unknown user, for SECONDS: alice's median under the flood over unloaded, the
             server's peak RSS (VmHWM, reset through /proc/PID/clear_refs before the phase) over its RSS
             before, the scrypt verifications the server made (mqstore_auth_secret_verifications_total)
             and the attackers' calls by status code
  bodies     BODIES Appends of BODY_MIB each, at once, without credentials, then with an unknown user's
             secret: all UNAUTHENTICATED; the server's peak RSS over its RSS before

Issue 32's targets: alice's median within 3x its unloaded value, the server's RSS within 1.2x. Before the
throttling of failed authentication (mqstore.auth.throttle) and the screened handler (mqstore_rpc.auth)
a flood of 16 threads made alice's median 0.66 -> 638 ms and the RSS 73 -> 219 MiB with 111 scrypt hashes
in 5 s, and 6 bodies of 60 MiB took the RSS from 72 to 1,004 MiB at the peak.

A full run writes bench/results/auth_flood.json and .md; ``--quick`` (2 s, 8 threads, 8 MiB bodies)
writes to bench/results/scratch/. Every process started is stopped at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import secrets as random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

import grpc

from procs import BENCH_DIR, BenchError, GrpcServer, memory_kib, run_meta, stop_all, write_table

from mqstore.auth.admin import AccessAdmin
from mqstore.access import ALLOW, NORMAL, PUB, TOPIC
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_rpc.auth import token
from mqstore_rpc.gen.mqstore.v1 import common_pb2, commitlog_pb2, commitlog_pb2_grpc

INTERNAL = "bench-internal-token-0001"
USER, SECRET = "alice", "alice-secret-0001"
TOPIC_NAME = "orders"
MiB = 1 << 20
TIMEOUT_S = 60.0
FULL = {"seconds": 5.0, "threads": 16, "bodies": 6, "body_mib": 60, "unloaded_calls": 300}
QUICK = {"seconds": 2.0, "threads": 8, "bodies": 6, "body_mib": 8, "unloaded_calls": 100}


def _metadata(user: str, secret: str) -> tuple:
    return (("authorization", token(user, secret)),)


def _request(body: bytes = b"x") -> commitlog_pb2.AppendRequest:
    return commitlog_pb2.AppendRequest(topic=TOPIC_NAME, messages=[common_pb2.MessageInput(body=body)])


def _mib(pid: int) -> dict[str, float]:
    return {k: v / 1024 for k, v in memory_kib(pid).items()}


def _reset_peak(pid: int) -> None:
    """VmHWM := VmRSS (Linux: clear_refs 5), so that the next phase's peak is its own."""
    pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")


def _metric(port: int, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def attack(address: str, seconds: float, threads: int, results) -> None:
    """The attackers (run in a process of their own); puts "flooding" once every thread is ready, then
    their calls by status code."""
    codes: dict[str, int] = {}
    lock = threading.Lock()
    ready = threading.Barrier(threads + 1)
    deadline: list[float] = []

    def one_thread() -> None:
        with grpc.insecure_channel(address) as channel:
            append = commitlog_pb2_grpc.CommitLogStub(channel).Append
            ready.wait(TIMEOUT_S)
            i = 0
            while time.monotonic() < deadline[0]:
                user = USER if i % 2 else f"nobody-{random.token_hex(4)}"
                try:
                    append(_request(), timeout=TIMEOUT_S, metadata=_metadata(user, random.token_hex(12)))
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1
                i += 1
    workers = [threading.Thread(target=one_thread) for _ in range(threads)]
    for w in workers:
        w.start()
    deadline.append(time.monotonic() + seconds)
    ready.wait(TIMEOUT_S)
    results.put("flooding")
    for w in workers:
        w.join(seconds + TIMEOUT_S)
    results.put(codes)


def _latencies(append, calls: int, until: float) -> list[float]:
    out = []
    while len(out) < calls and time.monotonic() < until:
        t0 = time.perf_counter()
        append(_request(), timeout=TIMEOUT_S, metadata=_metadata(USER, SECRET))
        out.append(time.perf_counter() - t0)
    return out


def measure(cfg: dict, work: pathlib.Path) -> dict:
    url = f"sqlite:///{work / 'auth.db'}"
    store = AuthStore(url, SystemClock())
    try:
        admin = AccessAdmin(store)
        admin.create_user(USER, NORMAL, SECRET)
        admin.add_rule(USER, TOPIC, TOPIC_NAME, frozenset({PUB}), ALLOW)
    finally:
        store.close()
    server = GrpcServer.commitlog(work / "log", "ASYNC", extra=("--auth", "--auth-url", url, "--metrics-port", "0"))
    server.env = {**(server.env or os.environ), "MQSTORE_INTERNAL_TOKEN": INTERNAL}
    server.start()
    try:
        metrics_port = server.events("server.started")[0]["metrics_port"]
        pid = server.pid
        options = [("grpc.max_send_message_length", 2 * cfg["body_mib"] * MiB)]
        with grpc.insecure_channel(server.target, options=options) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=TOPIC_NAME, queue_count=1), timeout=TIMEOUT_S,
                             metadata=_metadata("service", INTERNAL))
            _latencies(stub.Append, 20, time.monotonic() + TIMEOUT_S)  # the first call hashes; then cached
            unloaded = _latencies(stub.Append, cfg["unloaded_calls"], time.monotonic() + TIMEOUT_S)
            rss_before = _mib(pid)["VmRSS"]
            hashed_before = _metric(metrics_port, "mqstore_auth_secret_verifications_total")
            _reset_peak(pid)

            spawn = multiprocessing.get_context("spawn")
            results = spawn.Queue()
            attacker = spawn.Process(target=attack, args=(server.target, cfg["seconds"], cfg["threads"], results),
                                     daemon=True)
            attacker.start()
            try:
                if results.get(timeout=120) != "flooding":
                    raise BenchError("the attackers did not start")
                flooded = _latencies(stub.Append, 10**9, time.monotonic() + cfg["seconds"] * 0.9)
                codes = results.get(timeout=cfg["seconds"] + 2 * TIMEOUT_S)
            finally:
                attacker.join(TIMEOUT_S)
                if attacker.is_alive():
                    attacker.kill()
            flood_peak = _mib(pid)["VmHWM"]
            hashed = _metric(metrics_port, "mqstore_auth_secret_verifications_total") - hashed_before
            throttled = _metric(metrics_port, "mqstore_auth_throttled_total")

            rss_bodies = _mib(pid)["VmRSS"]
            _reset_peak(pid)
            big = _request(os.urandom(cfg["body_mib"] * MiB))
            refused: dict[str, int] = {}
            for metadata in ((), _metadata("nobody", "wrong-secret-0001")):
                def send(metadata=metadata) -> None:
                    try:
                        stub.Append(big, timeout=TIMEOUT_S, metadata=metadata)
                        code = "OK"
                    except grpc.RpcError as exc:
                        code = exc.code().name
                    refused[code] = refused.get(code, 0) + 1
                senders = [threading.Thread(target=send) for _ in range(cfg["bodies"])]
                for t in senders:
                    t.start()
                for t in senders:
                    t.join(2 * TIMEOUT_S)
            bodies_peak = _mib(pid)["VmHWM"]
    finally:
        server.stop()
    p50, p50_flood = statistics.median(unloaded) * 1e3, statistics.median(flooded) * 1e3
    return {"p50_ms": p50, "p50_flood_ms": p50_flood, "p50_ratio": p50_flood / p50, "flood_calls": len(flooded),
            "rss_mib": rss_before, "flood_peak_mib": flood_peak, "rss_ratio": flood_peak / rss_before,
            "verifications": hashed, "throttled": throttled, "attackers": codes,
            "attack_calls_per_s": sum(codes.values()) / cfg["seconds"],
            "bodies_rss_mib": rss_bodies, "bodies_peak_mib": bodies_peak, "bodies_refused": refused}


def markdown(rows: list[dict], meta: dict) -> str:
    r = rows[0]
    return "\n".join([
        "# Failed authentication under a flood (bench/auth_flood.py)", "",
        f"{meta['when']}, {meta['machine']}, {meta['mode']}, {meta['git']}", "",
        "| figure | value | target |", "|---|---|---|",
        f"| alice's p50, unloaded -> under {meta['threads']} attacker threads | {r['p50_ms']:.2f} -> "
        f"{r['p50_flood_ms']:.2f} ms ({r['p50_ratio']:.2f}x) | 3x |",
        f"| server RSS -> peak during the flood | {r['rss_mib']:.0f} -> {r['flood_peak_mib']:.0f} MiB "
        f"({r['rss_ratio']:.2f}x) | 1.2x |",
        f"| scrypt verifications during the flood | {r['verifications']:.0f} "
        f"(attackers' calls: {r['attack_calls_per_s']:,.0f}/s, {r['attackers']}) | bounded |",
        f"| {meta['bodies']} x {meta['body_mib']} MiB unauthenticated Appends, twice: RSS -> peak | "
        f"{r['bodies_rss_mib']:.0f} -> {r['bodies_peak_mib']:.0f} MiB ({r['bodies_refused']}) | not read |", ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (to bench/results/scratch/)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = BENCH_DIR / "results" / ("scratch" if args.quick else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="mqstore-auth-flood-") as work:
            row = measure(cfg, pathlib.Path(work))
    finally:
        stop_all()
    meta = run_meta("quick" if args.quick else "full", **cfg)
    write_table(out_dir, "auth_flood", meta, [row], row, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
