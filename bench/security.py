"""What TLS and authentication cost: ``make bench`` runs ``bench/security.py`` (bench/README.md).

Workload: batched Append (100 x 1 KiB messages per call, 16 producers, ASYNC flush) on a CommitLog server
process, in four configurations measured in the same run, in alternating rounds (plain, TLS, auth, TLS +
auth, then again), each figure the median over its rounds:

  plain       plaintext, authentication off (the comparison point of both ratios)
  tls         the server serves TLS (a throwaway CA: mqstore_rpc.tls_certs); the clients check it
  auth        authentication on: every call carries ``authorization: Bearer user:secret`` and the server
              checks it (the cache of mqstore.auth.authority: a SHA-256 and a dict lookup per call, not a
              database read) and the user's PUB permission on the topic (a rule ``topic bench*``)
  tls+auth    both

Ratios: tls / plain (the target: at least 0.85x) and auth / plain (at least 0.95x); the server's CPU time
per message is reported too, as it moves less than the rate when other work shares the machine. Servers run one at a
time (each its own data directory), so that they do not share the 2 cores. Speed is measured here, never
asserted in tests.

A full run writes bench/results/security.json and .md; ``--quick`` writes to bench/results/scratch/.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import groups
from mqstore_rpc.gen.mqstore.v1 import access_pb2 as apb, access_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from procs import PYTHON, BenchError, GrpcServer, cpu_seconds, run_loadgen, spawn, wait_for_event

GROUPS = ("security",)
TOPIC = "bench-security"
TOKEN = "bench-internal-token-0123456789"
USER, SECRET = "producer", "producer-secret-0123456789"
CONFIGS = ("plain", "tls", "auth", "tls+auth")
BATCH, BODY_BYTES, PRODUCERS = 100, 1024, 16
FULL = {"warmup_s": 1.0, "duration_s": 4.0, "rounds": 5}
QUICK = {"warmup_s": 0.5, "duration_s": 2.0, "rounds": 1}
_T0 = time.monotonic()


def _certs(work: pathlib.Path) -> pathlib.Path:
    done = subprocess.run([PYTHON, "-m", "mqstore_rpc.tls_certs", str(work / "tls")], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"tls_certs failed: {done.stderr}")
    return work / "tls"


def _server(work: pathlib.Path, config: str, certs: pathlib.Path, round_no: int) -> GrpcServer:
    extra: list[str] = []
    env = {"MQSTORE_INTERNAL_TOKEN": TOKEN}
    if "tls" in config:
        extra += ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    if "auth" in config:
        extra += ["--auth", "on"]
    data = work / f"{config.replace('+', '-')}-{round_no}"
    server = GrpcServer.commitlog(data, "ASYNC", extra=tuple(extra), log_name=f"{data.name}.log")
    server.env = {**(server.env or os.environ), **env}
    return server


def _start(server: GrpcServer, config: str, certs: pathlib.Path, timeout_s: float = 120.0) -> GrpcServer:
    """GrpcServer.start with a health probe that speaks TLS when the server does."""
    server.proc = spawn(server.args, server.log_path, env=server.env)
    server.port = wait_for_event(server.proc, server.log_path, "server.started", timeout_s)["port"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with _channel(server, config, certs) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return server
            except grpc.RpcError:
                pass  # not serving yet
        time.sleep(0.05)
    raise BenchError(f"{server.name} not SERVING within {timeout_s} s")


def _channel(server: GrpcServer, config: str, certs: pathlib.Path) -> grpc.Channel:
    target = f"localhost:{server.port}"
    if "tls" in config:
        return grpc.secure_channel(target, grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes()))
    return grpc.insecure_channel(target)


def _prepare(server: GrpcServer, config: str, certs: pathlib.Path) -> None:
    """The topic, and with auth the user with PUB on it (made as the services' identity)."""
    metadata = (("authorization", f"Bearer service:{TOKEN}"),)
    with _channel(server, config, certs) as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
            commitlog_pb2.CreateTopicRequest(name=TOPIC, queue_count=8), timeout=30, metadata=metadata)
        if "auth" in config:
            access = access_pb2_grpc.AccessStub(channel)
            access.CreateUser(apb.CreateUserRequest(name=USER, secret=SECRET), timeout=30, metadata=metadata)
            access.AddRule(apb.AddRuleRequest(user=USER, resource_kind=apb.RESOURCE_KIND_TOPIC, pattern="bench*",
                                              actions=[apb.ACTION_PUB]), timeout=30, metadata=metadata)


def _measure(server: GrpcServer, config: str, certs: pathlib.Path, cfg: dict) -> dict:
    spec = {"kind": "unary", "target": f"localhost:{server.port}", "topic": TOPIC, "batch": BATCH, "items": 1,
            "body_bytes": BODY_BYTES, "concurrency": PRODUCERS, "channels": 1, "start_at": 0,
            "warmup_s": cfg["warmup_s"], "duration_s": cfg["duration_s"], "max_calls": 10_000_000}
    if "tls" in config:
        spec["tls_ca"] = str(certs / "ca.pem")
    if "auth" in config:
        spec["authorization"] = f"Bearer {USER}:{SECRET}"
    cpu0, wall0 = cpu_seconds(server.pid), time.perf_counter()
    result = run_loadgen(spec, 1, timeout_s=cfg["warmup_s"] + cfg["duration_s"] + 60)[0]
    server_cores = (cpu_seconds(server.pid) - cpu0) / (time.perf_counter() - wall0)
    if result["errors"]:
        raise BenchError(f"{config}: failed calls {result['errors']}, first: {result['first_error']}")
    latencies = sorted(result["latencies_ms"])
    if not latencies:
        raise BenchError(f"{config}: no call completed inside the {cfg['duration_s']} s window")
    return {"msgs_per_s": result["messages"] / result["window_s"], "calls": result["calls"],
            "p50_ms": latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
            "server_cores": server_cores,
            "server_us_per_msg": server_cores / (result["messages"] / result["window_s"]) * 1e6}


def run_security(work: pathlib.Path, cfg: dict) -> dict:
    certs = _certs(work)
    rounds: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for round_no in range(cfg["rounds"]):
        for config in CONFIGS:
            server = _start(_server(work, config, certs, round_no), config, certs)
            try:
                _prepare(server, config, certs)
                figures = _measure(server, config, certs, cfg)
            finally:
                server.stop()
            rounds[config].append(figures)
            print(f"[{time.monotonic() - _T0:6.1f}s] security round {round_no + 1} {config:9} "
                  f"{figures['msgs_per_s']:,.0f} msgs/s p99 {figures['p99_ms']:.2f} ms", flush=True)
    figures = ("msgs_per_s", "p50_ms", "p99_ms", "server_cores", "server_us_per_msg")
    medians = {c: {k: statistics.median(r[k] for r in rs) for k in figures} for c, rs in rounds.items()}
    base = medians["plain"]["msgs_per_s"]
    for figures in medians.values():
        figures["ratio"] = figures["msgs_per_s"] / base if base else None
    return {"medians": medians, "rounds": rounds}


def build_rows(results: dict) -> list[dict]:
    found = results.get("security", {})
    if "medians" not in found:
        return []
    return [{"config": c, **found["medians"][c]} for c in CONFIGS]


TARGETS = {"tls": 0.85, "auth": 0.95}


def markdown(rows: list[dict], meta: dict, results: dict) -> str:
    lines = [f"# TLS and authentication: batched Append ({BATCH} x {BODY_BYTES // 1024} KiB, {PRODUCERS} producers, "
             f"ASYNC)", "", f"{meta['started']}, git {meta['git']}, {meta['machine']}; medians of "
             f"{meta['config']['rounds']} alternating rounds of {meta['config']['duration_s']} s.", "",
             "| configuration | msgs/s | p50 ms | p99 ms | server cores | server CPU us/msg | vs plain | target |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        target = TARGETS.get(row["config"])
        verdict = "" if target is None else f">= {target}x: {'met' if row['ratio'] >= target else 'MISSED'}"
        lines.append(f"| {row['config']} | {row['msgs_per_s']:,.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                     f"{row['server_cores']:.2f} | {row['server_us_per_msg']:.1f} | {row['ratio']:.2f}x | {verdict} |")
    if results.get("security", {}).get("error"):
        lines.append(f"\nfailed: {results['security']['error']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = groups.parse("mqstore TLS and authentication benchmark", GROUPS, "unused", argv)
    if not args.groups:
        return 0
    cfg = QUICK if args.quick else FULL
    started = groups.now()
    results = groups.run("security", (("security", run_security),), args, cfg)
    return groups.write("security", args, cfg, started, time.monotonic() - _T0, results, build_rows(results),
                        markdown)


if __name__ == "__main__":
    sys.exit(main())
