"""The append group: mqstore (ASYNC and SYNC) against the no-op gRPC server and Redis Streams.

All servers run at once and every configuration is measured back to back on each of them (no-op,
mqstore ASYNC, mqstore SYNC, then for batched appends Redis everysec and always at the same
concurrency), so that noise from other work on the machine falls on a configuration and its
comparison points alike. Server memory is read at the end, after every append workload.
"""

from __future__ import annotations

import pathlib
import statistics
import time

import grpc

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from procs import CODEC_COMPILED, CODEC_PYTHON, PY_SUFFIX, BenchError, GrpcServer, cpu_seconds, run_loadgen
from redis_peer import RedisServer

TOPIC = "bench"
QUEUES = 8
BODY_BYTES = 1024
SHAPES = {
    "unary-1": {"kind": "unary", "batch": 1, "items": 1, "label": "Append, 1 msg/call"},
    "unary-100": {"kind": "unary", "batch": 100, "items": 1, "label": "Append, 100 msgs/call"},
    "stream-10x100": {"kind": "stream", "batch": 100, "items": 10, "label": "AppendStream, 10 items x 100 msgs"},
}
PRODUCERS = (1, 8, 32)
EXTRA = (("unary-100", 16),)  # the configuration the targets name


def create_topic(target: str, name: str = TOPIC, queues: int = QUEUES) -> None:
    with grpc.insecure_channel(target) as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
            commitlog_pb2.CreateTopicRequest(name=name, queue_count=queues), timeout=30)


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def measure(server: GrpcServer, shape: str, producers: int, timing: dict, client_procs: int) -> dict:
    """One closed-loop run; msgs/s over the window, latency per call (one Append or one stream)."""
    s = SHAPES[shape]
    spec = {"kind": s["kind"], "target": server.target, "topic": TOPIC, "batch": s["batch"], "items": s["items"],
            "body_bytes": BODY_BYTES, "concurrency": producers, "channels": timing["channels"], "start_at": 0,
            "warmup_s": timing["warmup_s"], "duration_s": timing["duration_s"], "max_calls": 10_000_000}
    cpu0, wall0 = cpu_seconds(server.pid), time.perf_counter()
    results = run_loadgen(spec, client_procs, timeout_s=timing["warmup_s"] + timing["duration_s"] + 60)
    server_cores = (cpu_seconds(server.pid) - cpu0) / (time.perf_counter() - wall0)
    latencies = sorted(v for r in results for v in r["latencies_ms"])
    messages = sum(r["messages"] for r in results)
    errors: dict[str, int] = {}
    durability: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
        for k, v in r["durability"].items():
            durability[k] = durability.get(k, 0) + v
    return {"server": server.name, "shape": shape, "producers": producers,
            "msgs_per_s": messages / timing["duration_s"],
            "calls": sum(r["calls"] for r in results), "p50_ms": percentile(latencies, 0.50),
            "p99_ms": percentile(latencies, 0.99), "mean_ms": statistics.fmean(latencies) if latencies else None,
            "errors": errors, "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
            "durability_checked": durability, "server_cores": server_cores,
            "client_cores": sum(r["client_cores"] for r in results), "client_procs": len(results)}


def configurations() -> list[tuple[str, int]]:
    return [(shape, n) for shape in SHAPES for n in PRODUCERS] + list(EXTRA)


def start_servers(work: pathlib.Path, codecs: tuple[str, ...]) -> dict[str, GrpcServer]:
    """The no-op server and mqstore ASYNC and SYNC on each codec: "ASYNC" / "SYNC" compiled,
    "ASYNC-py" / "SYNC-py" pure Python (MQSTORE_PURE_PYTHON=1)."""
    servers = {"noop": GrpcServer.noop(work).start()}
    for codec in codecs:
        suffix = PY_SUFFIX if codec == CODEC_PYTHON else ""
        for mode in ("ASYNC", "SYNC"):
            servers[mode + suffix] = GrpcServer.commitlog(work / f"append-{mode.lower()}{suffix}", mode,
                                                          codec=codec).start().check_codec()
    return servers


def run(work: pathlib.Path, timing: dict, redis_note: str | None, client_procs: int, log,
        codecs: tuple[str, ...] = (CODEC_COMPILED, CODEC_PYTHON)) -> dict:
    """Returns {"runs": [...], "redis": [...], "memory": {...}, "servers": {...}}."""
    servers = start_servers(work, codecs)
    redis: dict[str, RedisServer] = {}
    try:
        for key, server in servers.items():
            if key != "noop":
                create_topic(server.target)
        if redis_note is not None:
            redis = {"everysec": RedisServer(work, "everysec").start(), "always": RedisServer(work, "always").start()}
        runs, redis_runs = [], []
        for shape, producers in sorted(configurations(), key=lambda c: (c[0], c[1])):
            for key, server in servers.items():
                run_ = measure(server, shape, producers, timing, client_procs)
                run_["mode"] = key
                runs.append(run_)
                log("append", f"{key:8} {shape:14} {producers:2}p", run_)
            if shape == "unary-100":
                for fsync, server in redis.items():
                    result = server.measure(producers, timing["duration_s"], timing["redis_probe"])
                    result.update(fsync=fsync, producers=producers)
                    redis_runs.append(result)
                    log("append", f"redis {fsync:8} {producers:2}c", result)
        memory = {key: server.memory_kib() for key, server in servers.items()}
        memory.update({f"redis-{fsync}": server.memory_kib() for fsync, server in redis.items()})
    finally:
        for server in redis.values():
            server.stop()
        exits = {key: server.stop() for key, server in servers.items()}
    bad = {key: status for key, status in exits.items() if status != 0}
    if bad:
        raise BenchError(f"servers exited uncleanly after the append group: {bad}; see the logs in {work}")
    return {"runs": runs, "redis": redis_runs, "memory_kib": memory, "redis_note": redis_note}
