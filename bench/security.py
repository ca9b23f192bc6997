"""What TLS and authentication cost: ``make bench`` runs ``bench/security.py`` (bench/README.md).

Workload: batched Append (100 x 1 KiB messages per call, 16 producers, ASYNC flush) on a CommitLog server
process, in these configurations measured in the same run, in alternating rounds (plain, TLS, auth,
TLS + auth, the TLS variants, then the same backward, and so on):

  plain       plaintext, authentication off (the comparison point of both ratios)
  tls         the server serves TLS (a throwaway CA: mqstore_rpc.tls_certs); the clients check it
  auth        authentication on: every call carries ``authorization: Bearer user:secret`` and the server
              checks it (the caches of mqstore.auth.authority: two dict lookups per call, no hash, no
              database read; bench/auth_call.py measures the interceptor alone) and the user's PUB
              permission on the topic (a rule ``topic bench*``)
  tls+auth    both
  tls-*       TLS with one of grpc's knobs turned (VARIANTS: a cipher suite forced through
              GRPC_SSL_CIPHER_SUITES on both sides, client channel arguments that change write framing
              and flow control), to see whether any of them moves the cost of TLS

Figures per configuration: the median over its rounds of msgs/s (and its spread, min-max), of the
per-round ratio to the plain run of the same round (rounds follow each other within ~a minute, so
noise from other work on the machine falls on both), and of the CPU time per message of the server and
of the load generator (CPU time moves less than the rate when other work shares the machine; both
processes share the 2 cores, so both pay for TLS). The CPU ratio (plain's server + client CPU per
message over the configuration's) is the rate ratio a CPU-bound machine would give. The 1-minute load
average is recorded before every measurement.

Targets: tls / plain at least 0.85x and auth / plain at least 0.95x, judged on the median per-round
rate ratio and, separately, on the CPU ratio (on a loaded machine the rate follows the scheduler more
than the code: a round's plain rate moved 5x in one run at load 30 on 2 cores). Servers run one at a
time (each its own data directory), so that they do not share the 2 cores. Speed is measured here,
never asserted in tests.

A full run writes bench/results/security.json and .md; ``--quick`` writes to bench/results/scratch/.
``--configs plain,tls`` measures only those configurations (plain is always measured).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import threading
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
# TLS with one knob turned: (environment of both processes, the load generator's extra channel arguments).
VARIANTS = {
    # TLS 1.2 suites only: BoringSSL negotiates TLS 1.3 (TLS_AES_128_GCM_SHA256 where AES-NI is present),
    # whose suites this variable does not select; measured to show that it changes nothing.
    "tls-chacha": ({"GRPC_SSL_CIPHER_SUITES": "ECDHE-RSA-CHACHA20-POLY1305"}, ()),
    # Larger HTTP/2 frames and windows from the client: fewer frames (and TLS records) per 100 KiB call.
    "tls-bigframes": ({}, (("grpc.http2.max_frame_size", 1 << 20), ("grpc.http2.lookahead_bytes", 4 << 20),
                           ("grpc.http2.write_buffer_size", 1 << 20), ("grpc.http2.bdp_probe", 0))),
}
ALL_CONFIGS = CONFIGS + tuple(VARIANTS)
BATCH, BODY_BYTES, PRODUCERS = 100, 1024, 16
FULL = {"warmup_s": 1.0, "duration_s": 4.0, "rounds": 5}
QUICK = {"warmup_s": 0.5, "duration_s": 2.0, "rounds": 1}
LEAD_S = 5.0  # from spawning the load generator to its agreed start: its imports and connection on a loaded machine
_T0 = time.monotonic()


def _certs(work: pathlib.Path) -> pathlib.Path:
    done = subprocess.run([PYTHON, "-m", "mqstore_rpc.tls_certs", str(work / "tls")], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"tls_certs failed: {done.stderr}")
    return work / "tls"


def _server(work: pathlib.Path, config: str, certs: pathlib.Path, round_no: int) -> GrpcServer:
    extra: list[str] = []
    env = {"MQSTORE_INTERNAL_TOKEN": TOKEN, **VARIANTS.get(config, ({}, ()))[0]}
    if "tls" in config:
        extra += ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    if "auth" in config:
        extra += ["--auth", "on"]
    data = _data_dir(work, config, round_no)
    server = GrpcServer.commitlog(data, "ASYNC", extra=tuple(extra), log_name=f"{data.name}.log")
    server.env = {**(server.env or os.environ), **env}
    return server


def _data_dir(work: pathlib.Path, config: str, round_no: int) -> pathlib.Path:
    return work / f"{config.replace('+', '-')}-{round_no}"


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
    env, options = VARIANTS.get(config, ({}, ()))
    spec = {"kind": "unary", "target": f"localhost:{server.port}", "topic": TOPIC, "batch": BATCH, "items": 1,
            "body_bytes": BODY_BYTES, "concurrency": PRODUCERS, "channels": 1, "start_at": 0,
            "warmup_s": cfg["warmup_s"], "duration_s": cfg["duration_s"], "max_calls": 10_000_000,
            "channel_options": [list(o) for o in options]}
    if "tls" in config:
        spec["tls_ca"] = str(certs / "ca.pem")
    if "auth" in config:
        spec["authorization"] = f"Bearer {USER}:{SECRET}"
    load = os.getloadavg()[0]
    # The window is fixed in wall-clock time, so that the server's CPU is read at its edges like the
    # client's: the first calls' scrypt check and the connection set-up fall outside it.
    spec["start_at"] = time.time() + LEAD_S
    window = (spec["start_at"] + cfg["warmup_s"], spec["start_at"] + cfg["warmup_s"] + cfg["duration_s"])
    server_cpu: list[float] = []
    sampler = threading.Thread(target=_sample_cpu, args=(server.pid, window, server_cpu), name="cpu-sampler")
    sampler.start()
    try:
        result = run_loadgen(spec, 1, timeout_s=LEAD_S + cfg["warmup_s"] + cfg["duration_s"] + 60, env=env)[0]
    finally:
        sampler.join(LEAD_S + cfg["warmup_s"] + cfg["duration_s"] + 60)
    if len(server_cpu) != 2:
        raise BenchError(f"{config}: the server's CPU time was not read at both edges of the window")
    server_cores = (server_cpu[1] - server_cpu[0]) / cfg["duration_s"]
    if result["errors"]:
        raise BenchError(f"{config}: failed calls {result['errors']}, first: {result['first_error']}")
    latencies = sorted(result["latencies_ms"])
    if not latencies:
        raise BenchError(f"{config}: no call completed inside the {cfg['duration_s']} s window")
    rate = result["messages"] / result["window_s"]
    return {"msgs_per_s": rate, "calls": result["calls"],
            "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "server_cores": server_cores, "client_cores": result["window_client_cores"],
            "server_us_per_msg": server_cores / rate * 1e6,
            "client_us_per_msg": result["window_client_cores"] / rate * 1e6,
            "load_1min": load}


def _sample_cpu(pid: int, window: tuple[float, float], out: list[float]) -> None:
    """The CPU time of process ``pid`` at the two wall-clock times of ``window``."""
    for edge in window:
        time.sleep(max(0.0, edge - time.time()))
        out.append(cpu_seconds(pid))


FIGURES = ("msgs_per_s", "p50_ms", "p99_ms", "server_cores", "client_cores", "server_us_per_msg",
           "client_us_per_msg", "load_1min")


def _configs() -> tuple[str, ...]:
    """The configurations asked for with ``--configs`` (plain always), in their order; all by default."""
    asked = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--configs=")), "")
    if not asked and "--configs" in sys.argv[:-1]:
        asked = sys.argv[sys.argv.index("--configs") + 1]
    if not asked:
        return ALL_CONFIGS
    names = {c.strip() for c in asked.split(",")} | {"plain"}
    unknown = names - set(ALL_CONFIGS)
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(sorted(unknown))}; one of {', '.join(ALL_CONFIGS)}")
    return tuple(c for c in ALL_CONFIGS if c in names)


def run_security(work: pathlib.Path, cfg: dict) -> dict:
    certs = _certs(work)
    configs = cfg.get("configs", ALL_CONFIGS)
    rounds: dict[str, list[dict]] = {c: [] for c in configs}
    for round_no in range(cfg["rounds"]):
        # Forward, then backward, then forward...: a load that drifts during a round falls on the first and
        # the last configurations alike over two rounds.
        for config in configs if round_no % 2 == 0 else configs[::-1]:
            server = _start(_server(work, config, certs, round_no), config, certs)
            try:
                _prepare(server, config, certs)
                figures = _measure(server, config, certs, cfg)
            finally:
                server.stop()
                # ~1.3 GiB each (a preallocated segment and the window's writes): 30 of them filled the disk
                shutil.rmtree(_data_dir(work, config, round_no))
            rounds[config].append(figures)
            print(f"[{time.monotonic() - _T0:6.1f}s] security round {round_no + 1} {config:13} "
                  f"{figures['msgs_per_s']:,.0f} msgs/s p99 {figures['p99_ms']:.2f} ms, CPU us/msg server "
                  f"{figures['server_us_per_msg']:.1f} client {figures['client_us_per_msg']:.1f}, "
                  f"load {figures['load_1min']:.1f}", flush=True)
    for measured in rounds.values():  # each round against the plain run of the same round
        for own, plain in zip(measured, rounds["plain"], strict=True):
            own["ratio"] = own["msgs_per_s"] / plain["msgs_per_s"]
    return {"medians": {c: summarise(rs, rounds["plain"]) for c, rs in rounds.items()}, "rounds": rounds}


def summarise(measured: list[dict], plain: list[dict]) -> dict:
    """Medians of every figure, the spread of the rate and of the per-round ratio, and the CPU ratio."""
    out = {k: statistics.median(r[k] for r in measured) for k in FIGURES}
    rates, ratios = [r["msgs_per_s"] for r in measured], [r["ratio"] for r in measured]
    out.update(msgs_per_s_min=min(rates), msgs_per_s_max=max(rates), ratio=statistics.median(ratios),
               ratio_min=min(ratios), ratio_max=max(ratios),
               ratio_of_medians=out["msgs_per_s"] / statistics.median(r["msgs_per_s"] for r in plain))
    out["cpu_us_per_msg"] = out["server_us_per_msg"] + out["client_us_per_msg"]
    plain_cpu = statistics.median(r["server_us_per_msg"] for r in plain) + \
        statistics.median(r["client_us_per_msg"] for r in plain)
    out["cpu_ratio"] = plain_cpu / out["cpu_us_per_msg"]
    return out


def build_rows(results: dict) -> list[dict]:
    found = results.get("security", {})
    if "medians" not in found:
        return []
    return [{"config": c, **found["medians"][c]} for c in ALL_CONFIGS if c in found["medians"]]


TARGETS = {"tls": 0.85, "auth": 0.95}


def markdown(rows: list[dict], meta: dict, results: dict) -> str:
    loads = [r["load_1min"] for row in rows for r in results["security"]["rounds"][row["config"]]] if rows else []
    lines = [f"# TLS and authentication: batched Append ({BATCH} x {BODY_BYTES // 1024} KiB, {PRODUCERS} producers, "
             f"ASYNC)", "", f"{meta['started']}, git {meta['git']}, {meta['machine']}; medians of "
             f"{meta['config']['rounds']} alternating rounds of {meta['config']['duration_s']} s"
             + (f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
                if loads else "") + ".", "",
             "Rate ratio: the median over the rounds of (configuration / plain of the same round), with its "
             "spread. CPU us/msg: the server's and the load generator's CPU time per "
             "message (they share the 2 cores); CPU ratio: plain's total over the configuration's. Targets are "
             "judged on both ratios.", "",
             "| configuration | msgs/s (min-max) | rate ratio (min-max) | server CPU us/msg | client CPU us/msg | "
             "CPU ratio | p50 ms | p99 ms | target |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        target = TARGETS.get(row["config"])
        verdict = "" if target is None else (f">= {target}x: by rate {'met' if row['ratio'] >= target else 'MISSED'}, "
                                             f"by CPU {'met' if row['cpu_ratio'] >= target else 'MISSED'}")
        lines.append(f"| {row['config']} | {row['msgs_per_s']:,.0f} ({row['msgs_per_s_min']:,.0f}-"
                     f"{row['msgs_per_s_max']:,.0f}) | {row['ratio']:.2f}x ({row['ratio_min']:.2f}-"
                     f"{row['ratio_max']:.2f}) | {row['server_us_per_msg']:.1f} | {row['client_us_per_msg']:.1f} | "
                     f"{row['cpu_ratio']:.2f}x | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {verdict} |")
    if results.get("security", {}).get("error"):
        lines.append(f"\nfailed: {results['security']['error']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = groups.parse("mqstore TLS and authentication benchmark", GROUPS, "unused", argv)
    if not args.groups:
        return 0
    cfg = {**(QUICK if args.quick else FULL), "configs": _configs()}
    args.partial = args.partial or cfg["configs"] != ALL_CONFIGS  # a subset goes to scratch/
    started = groups.now()
    results = groups.run("security", (("security", run_security),), args, cfg)
    return groups.write("security", args, cfg, started, time.monotonic() - _T0, results, build_rows(results),
                        markdown)


if __name__ == "__main__":
    sys.exit(main())
