"""The append group: mqstore (ASYNC and SYNC) against the no-op gRPC server and Redis Streams.

All servers run at once and every configuration is measured back to back on each of them (the no-op,
mqstore ASYNC and SYNC, and for batched appends Redis everysec and always at the same concurrency), so
that noise from other work on the machine falls on a configuration and its comparison points alike.
Each target's pair is measured side by side, in an order that alternates from round to round
(round_order): an fsync-bound server measures lower right after one that left gigabytes of page cache
to write back, so each of SYNC and Redis always follows an ASYNC writer in one round and an fsync-bound
one in the next; the pure-Python servers come last.

The configurations the targets name (TARGET_CONFIGURATIONS) are measured in
``timing["rounds"]`` such rounds, one after the other, and more up to ``timing["max_rounds"]`` while one
round's ratio of a target's pair moves by more than 10% from the median of its rounds (unsettled); each
server's figures are the medians over its rounds (merge_rounds): one round's ratio swung by ±15% between
runs on this shared machine, as the noise of the moment fell on one side or the other. The pure-Python
servers, which no target names, run in the first round only. Server memory is read at the end, after
every append workload.
"""

from __future__ import annotations

import pathlib
import statistics
import time

import grpc

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
import diskuse
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
# Issue 10's targets: these are measured in several alternating rounds (the module's docstring), and the
# server pairs whose ratio each target names (a Redis server as "redis-<fsync>"): while one round's ratio
# of a pair is more than SETTLED off the median of its rounds, rounds are added up to timing["max_rounds"].
TARGET_PAIRS = {("unary-100", 16): (("ASYNC", "noop"), ("ASYNC", "redis-everysec")),
                ("unary-100", 32): (("SYNC", "redis-always"),),
                ("unary-1", 8): (("ASYNC", "noop"),)}
TARGET_CONFIGURATIONS = set(TARGET_PAIRS)
# The no-op server of the kind before (every handler in the handler pool, a loop -> thread -> loop hand-off a
# call), measured beside "noop" in the target configurations only: the figures reported before it was the
# comparison point, for continuity (bench/README.md, *The no-op server's kind*). No target names it.
NOOP_POOL = "noop-pool"
SETTLED = 0.10
_MEDIANS = ("msgs_per_s", "p50_ms", "p99_ms", "mean_ms", "client_cores")  # and server CPU per message
_SUMS = ("calls", "errors", "durability_checked")


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


def merge_rounds(results: list[dict]) -> dict:
    """One server's rounds of one configuration as one result: the median of each measured figure
    (server CPU per message as a median of its own, so that server_cores / msgs_per_s gives it),
    counts summed, the rest (the configuration) from the first round; ``rounds_msgs_per_s`` keeps
    each round's rate."""
    if len(results) == 1:
        return results[0]
    merged = dict(results[0])
    for key in _MEDIANS:
        values = [r.get(key) for r in results]
        if key in merged and None not in values:
            merged[key] = statistics.median(values)
    for key in _SUMS:
        if isinstance(merged.get(key), dict):
            names = set().union(*(r[key] for r in results))
            merged[key] = {k: sum(r[key].get(k, 0) for r in results) for k in names}
        elif key in merged:
            merged[key] = sum(r[key] for r in results)
    if "server_cores" in merged and merged["msgs_per_s"]:
        cpu_per_msg = statistics.median(r["server_cores"] / r["msgs_per_s"] for r in results if r["msgs_per_s"])
        merged["server_cores"] = cpu_per_msg * merged["msgs_per_s"]
    merged["rounds_msgs_per_s"] = [r["msgs_per_s"] for r in results]
    return merged


def unsettled(rounds_by_server: dict[str, list[dict]], pairs) -> bool:
    """Whether one round's ratio of a pair (figure over comparison, round by round) is more than SETTLED
    off the median of that pair's round ratios; pairs with a server not measured are skipped."""
    for ours, theirs in pairs:
        a, b = rounds_by_server.get(ours, []), rounds_by_server.get(theirs, [])
        ratios = [x["msgs_per_s"] / y["msgs_per_s"] for x, y in zip(a, b, strict=False) if y["msgs_per_s"]]
        if ratios and any(abs(r / statistics.median(ratios) - 1) > SETTLED for r in ratios):
            return True
    return False


def round_order(keys: list[str], fsyncs: list[str], round_: int) -> list[tuple[str, str]]:
    """The order of one round's measurements, as ("ours", server key) and ("redis", fsync) steps.

    The no-op first; then mqstore ASYNC beside Redis everysec and mqstore SYNC beside Redis always, the
    two of each pair swapped in odd rounds (even: ASYNC, everysec, SYNC, always; odd: everysec, ASYNC,
    always, SYNC), so that across two rounds each fsync-bound server follows a page-cache writer once
    and an fsync-bound one once; the rest (the pure-Python servers) last. ``fsyncs`` is empty where
    Redis is not measured."""
    pairs = [("ASYNC", "everysec"), ("SYNC", "always")]
    steps = [("ours", k) for k in keys if k == "noop"]
    for ours, theirs in pairs:
        pair = [("ours", ours)] if ours in keys else []
        if theirs in fsyncs:
            pair.insert(0 if round_ % 2 else len(pair), ("redis", theirs))
        steps += pair
    paired = {name for _, name in steps}
    steps += [("ours", k) for k in keys if k not in paired]
    steps += [("redis", f) for f in fsyncs if f not in paired]
    return steps


def configurations() -> list[tuple[str, int]]:
    return [(shape, n) for shape in SHAPES for n in PRODUCERS] + list(EXTRA)


def start_servers(work: pathlib.Path, codecs: tuple[str, ...]) -> dict[str, GrpcServer]:
    """The no-op servers and mqstore ASYNC and SYNC on each codec: "ASYNC" / "SYNC" compiled,
    "ASYNC-py" / "SYNC-py" pure Python (MQSTORE_PURE_PYTHON=1). "noop" is the comparison point: the same kind of
    server as the CommitLog port (noop_server.py's loop flavour: Append answered on the port's loop); "noop-pool"
    answers Append in the handler pool, as the comparison point did before (NOOP_POOL: the target configurations
    only, for continuity)."""
    servers = {"noop": GrpcServer.noop(work, flavour="loop"),
               NOOP_POOL: GrpcServer.noop(work, "noop-pool.log", flavour="sync", name=NOOP_POOL)}
    for server in servers.values():
        server.start()
    for codec in codecs:
        suffix = PY_SUFFIX if codec == CODEC_PYTHON else ""
        for mode in ("ASYNC", "SYNC"):
            servers[mode + suffix] = GrpcServer.commitlog(work / f"append-{mode.lower()}{suffix}", mode,
                                                          codec=codec).start().check_codec()
    return servers


def keep_within_budget(servers: dict[str, GrpcServer], log) -> None:
    """Between two measurements: a mqstore server whose data passed the budget starts again empty (its
    topic created again), so the group's disk use stays bounded (bench/diskuse.py)."""
    for key, server in servers.items():
        if server.data_dir is not None and diskuse.allocated_bytes(server.data_dir) > diskuse.SERVER_DATA_BUDGET_BYTES:
            server.restart_empty().check_codec()
            create_topic(server.target)
            log("append", f"{key:8} data reset", {})


def run(work: pathlib.Path, timing: dict, redis_note: str | None, client_procs: int, log,
        codecs: tuple[str, ...] = (CODEC_COMPILED, CODEC_PYTHON)) -> dict:
    """Returns {"runs": [...], "redis": [...], "memory": {...}, "servers": {...}}."""
    servers = start_servers(work, codecs)
    redis: dict[str, RedisServer] = {}
    try:
        for server in servers.values():
            if server.data_dir is not None:  # a mqstore server
                create_topic(server.target)
        if redis_note is not None:
            redis = {"everysec": RedisServer(work, "everysec").start(), "always": RedisServer(work, "always").start()}
        runs, redis_runs = [], []
        for shape, producers in sorted(configurations(), key=lambda c: (c[0], c[1])):
            target = (shape, producers) in TARGET_CONFIGURATIONS
            rounds = timing["rounds"] if target else 1
            ours: dict[str, list[dict]] = {key: [] for key in servers}
            theirs: dict[str, list[dict]] = {fsync: [] for fsync in redis}
            round_ = -1
            while (round_ := round_ + 1) < rounds or (
                    target and round_ < timing.get("max_rounds", rounds)
                    and unsettled(ours | {f"redis-{f}": r for f, r in theirs.items()}, TARGET_PAIRS[shape, producers])):
                tag = (f" round {round_ + 1}/{rounds}" if round_ < rounds else f" round {round_ + 1} (unsettled)") \
                    if rounds > 1 else ""
                keys = [key for key in servers if not (round_ and key.endswith(PY_SUFFIX))
                        and (target or key != NOOP_POOL)]
                fsyncs = list(redis) if shape == "unary-100" else []
                for side, name in round_order(keys, fsyncs, round_):
                    if side == "redis":
                        theirs[name].append(redis[name].measure(producers, timing["duration_s"], timing["redis_probe"]))
                        log("append", f"redis {name:8} {producers:2}c{tag}", theirs[name][-1])
                        continue
                    ours[name].append(measure(servers[name], shape, producers, timing, client_procs))
                    log("append", f"{name:8} {shape:14} {producers:2}p{tag}", ours[name][-1])
                    keep_within_budget({name: servers[name]}, log)
            runs += [dict(merge_rounds(results), mode=key) for key, results in ours.items() if results]
            redis_runs += [dict(merge_rounds(results), fsync=fsync, producers=producers)
                           for fsync, results in theirs.items() if results]
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
