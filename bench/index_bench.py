"""Index benchmark (``make bench`` runs it after bench/run.py): writes bench/results/index.json and .md.

Groups (``--only index-build,index-query``; default both; an --only naming only run.py's groups runs none):

  index-build  The index build rate while the CommitLog appends at full speed. Both servers run as
               processes (default index file sizes); a producer process appends batches of 100 x 1 KiB
               messages with 2 keys each (plus the UNIQ_KEY the server adds: 3 index entries a message)
               from 8 concurrent calls for ``build_s`` seconds. Sampled every 100 ms: the log's visible
               end and the index's resume offset. Reported: append rate, index rate, max and final lag in
               bytes, and the time to catch up after the producer stops. Comparison point: the append
               rate (index rate / append rate >= 1 and a bounded lag = the build keeps up).
  index-query  Query latency over a file set of ``entries`` entries (10 million in a full run), built
               directly through IndexStore.apply (the follower's write path, no gRPC), twice: as one file
               of 10 M entries and as four files of 2.5 M (slots = entries / 4, RocketMQ's ratio; one more
               message rolls a tiny fifth/second file so that the set is sealed). Each set is measured
               three times on the same entries: unsealed files, after conversion to the compact layout,
               after the move to a file:// tier. Each query is one IndexStore.query (newest first, max
               64, whole time range) for a random key: a unique key (1 match) or a key with 10 matches
               spread over the files. Only the index lookup is timed: verifying candidates against the
               log is the same work whatever finds them. Comparison point in the same run: SQLite
               (stdlib sqlite3, file on the same disk) with a table (key, store_time, physical_offset) and
               an index on (key, store_time), loaded with the same entries and asked for the same keys
               (``WHERE key = ? ORDER BY store_time DESC LIMIT 64``), each key alternately through both
               so that both see the same moments of a noisy machine. Page caches are warm for both.

``--quick`` runs tiny sizes and short windows and writes to bench/results/scratch/ (ignored by git), as
run.py does. Every process started is stopped at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time

import grpc
import structlog
import groups
import diskuse
from mqstore import defaults
from procs import PYTHON, GrpcServer, cpu_seconds, spawn, stop

GROUPS = ("index-build", "index-query")
MiB = 1 << 20

# file_entries: the query set is built once per file size (slots = entries / 4, RocketMQ's ratio).
FULL = {"build_s": 20.0, "entries": 10_000_000, "file_entries": (10_000_000, 2_500_000), "queries": 20_000,
        "catch_up_timeout_s": 300.0}
QUICK = {"build_s": 3.0, "entries": 200_000, "file_entries": (200_000, 50_000), "queries": 2_000,
         "catch_up_timeout_s": 60.0}
PRODUCER_CONCURRENCY = 8
BATCH = 100
BODY_BYTES = 1024
TOPIC = "ibench"
BASE_MS = 1_700_000_000_000
_T0 = time.monotonic()


def log(label: str, **fields) -> None:
    shown = " ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
    print(f"[{time.monotonic() - _T0:6.1f}s] index {label:34} {shown}", flush=True)


# ---- the producer process ------------------------------------------------------------------------------

def _requests(count: int) -> list[bytes]:
    from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2
    body = bytes((i * 131 + 7) & 0xFF for i in range(BODY_BYTES))
    out = []
    for r in range(count):
        request = commitlog_pb2.AppendRequest(topic=TOPIC)
        for i in range(BATCH):
            n = r * BATCH + i
            request.messages.append(common_pb2.MessageInput(body=body, keys=[f"order-{n}", f"user-{n % 50_000}"]))
        out.append(request.SerializeToString())
    return out


async def _produce(spec: dict) -> dict:
    requests = _requests(200)  # 20,000 distinct messages, cycled
    channel = grpc.aio.insecure_channel(spec["target"],
                                        options=[("grpc.max_send_message_length", defaults.MAX_MESSAGE_BYTES)])
    append = channel.unary_unary("/mqstore.v1.CommitLog/Append")
    deadline = time.monotonic() + spec["seconds"]
    counts = {"calls": 0, "errors": 0}

    async def task(offset: int) -> None:
        i = offset
        while time.monotonic() < deadline:
            try:
                await append(requests[i % len(requests)], timeout=30)
                counts["calls"] += 1
            except grpc.RpcError:
                counts["errors"] += 1
            i += PRODUCER_CONCURRENCY

    started = time.monotonic()
    await asyncio.gather(*(task(k) for k in range(PRODUCER_CONCURRENCY)))
    seconds = time.monotonic() - started
    await channel.close()
    return {"messages": counts["calls"] * BATCH, "errors": counts["errors"], "seconds": seconds}


# ---- group: build rate ---------------------------------------------------------------------------------

def _stubs(log_target: str, index_target: str):
    from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, index_pb2_grpc
    log_channel, index_channel = grpc.insecure_channel(log_target), grpc.insecure_channel(index_target)
    return (log_channel, index_channel, commitlog_pb2_grpc.CommitLogStub(log_channel),
            index_pb2_grpc.IndexStub(index_channel))


def _sample(log_stub, index_stub) -> dict:
    from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, index_pb2
    end = log_stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10).visible_physical_offset
    s = index_stub.Stats(index_pb2.IndexStatsRequest(), timeout=10)
    return {"t": time.monotonic(), "log_end": end, "indexed": s.indexed_physical_offset,
            "records": s.records_indexed, "lag": max(0, end - s.indexed_physical_offset)}


def run_build(work: pathlib.Path, cfg: dict) -> dict:
    from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2
    log_server = GrpcServer.commitlog(work / "log", "ASYNC", extra=("--segment-size-bytes", "256MiB"),
                                      log_name="build-commitlog.log").start()
    index_server = GrpcServer("index", [PYTHON, "-m", "index_service.main", "--data-dir", str(work / "index"),
                                        "--port", "0", "--commitlog", log_server.target],
                              work / "build-index.log").start()
    log_channel, index_channel, log_stub, index_stub = _stubs(log_server.target, index_server.target)
    try:
        log_stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=TOPIC, queue_count=8), timeout=10)
        spec = {"target": log_server.target, "seconds": cfg["build_s"]}
        cpu0 = {name: cpu_seconds(s.pid) for name, s in (("commitlog", log_server), ("index", index_server))}
        first = _sample(log_stub, index_stub)
        producer = spawn([PYTHON, str(pathlib.Path(__file__)), "--producer", json.dumps(spec)],
                         stdout=subprocess.PIPE)
        samples = [first]
        while producer.poll() is None:
            samples.append(_sample(log_stub, index_stub))
            time.sleep(0.1)  # the sampling period (a measurement, not synchronisation)
        produced = json.loads(producer.stdout.read())
        stop(producer)
        at_stop = _sample(log_stub, index_stub)
        cpu1 = {name: cpu_seconds(s.pid) for name, s in (("commitlog", log_server), ("index", index_server))}
        caught_up = _catch_up(log_stub, index_stub, at_stop, cfg["catch_up_timeout_s"])
        return _build_result(cfg, produced, first, samples + [at_stop], caught_up, cpu0, cpu1)
    finally:
        log_channel.close()
        index_channel.close()
        index_server.stop()
        log_server.stop()


def _catch_up(log_stub, index_stub, at_stop: dict, timeout_s: float) -> dict:
    deadline = at_stop["t"] + timeout_s
    while time.monotonic() < deadline:
        s = _sample(log_stub, index_stub)
        if s["indexed"] >= at_stop["log_end"]:
            return {"seconds": s["t"] - at_stop["t"], "records": s["records"], "t": s["t"]}
        time.sleep(0.05)
    return {"seconds": None, "records": None, "t": None}


def _build_result(cfg, produced, first, samples, caught_up, cpu0, cpu1) -> dict:
    window_s = samples[-1]["t"] - first["t"]
    indexed_records = samples[-1]["records"] - first["records"]
    # Both rates over the same sampled window (it spans the producer's whole life, start-up included):
    # the producer's own seconds leave its start-up out, which made an index that keeps up exactly
    # read producer_s / window_s (0.93-0.98) instead of 1.
    append_rate = produced["messages"] / window_s
    index_rate = indexed_records / window_s
    total_rate = (caught_up["records"] - first["records"]) / (caught_up["t"] - first["t"]) \
        if caught_up["t"] else None
    lags = [s["lag"] for s in samples]
    result = {
        "append_msgs_per_s": append_rate, "append_mib_per_s": append_rate * BODY_BYTES / MiB,
        "producer_msgs_per_s": produced["messages"] / produced["seconds"],
        "index_records_per_s_while_appending": index_rate, "index_records_per_s_overall": total_rate,
        "max_lag_bytes": max(lags), "final_lag_bytes": samples[-1]["lag"],
        "lag_p50_bytes": statistics.median(lags), "catch_up_s": caught_up["seconds"],
        "messages": produced["messages"], "producer_errors": produced["errors"], "window_s": window_s,
        "cores": {name: (cpu1[name] - cpu0[name]) / window_s for name in cpu0},
        "lag_series": [(round(s["t"] - first["t"], 2), s["lag"]) for s in samples[::5]],
    }
    log("build", append=append_rate, index=index_rate, max_lag_mib=max(lags) / MiB,
        final_lag_mib=samples[-1]["lag"] / MiB, catch_up_s=caught_up["seconds"] or -1.0)
    return result


# ---- group: query latency ------------------------------------------------------------------------------

def _records(first: int, count: int, user_keys: int):
    from mqstore.index.records import IndexRecord
    return [IndexRecord(n * 1200, BASE_MS + n // 5, TOPIC, (f"order-{n}", f"user-{n % user_keys}"))
            for n in range(first, first + count)]


def _build_index(root: pathlib.Path, messages: int, user_keys: int, file_entries: int):
    from mqstore.index.config import IndexConfig
    from mqstore.index.store import IndexStore
    from mqstore.index.tier import IndexTierConfig, dir_url, open_tier
    config = IndexConfig(root, slot_count=file_entries // 4, entry_count=file_entries + 1, max_keys_per_message=4,
                         checkpoint_interval_ms=10**9, tier_min_age_ms=0)
    (root / "tier").mkdir(parents=True, exist_ok=True)  # a file:// tier is a directory that exists (mqstore.tier)
    store = IndexStore(config, tier=open_tier(IndexTierConfig(tier_url=dir_url(root / "tier"))))
    store.start()
    started = time.perf_counter()
    for first in range(0, messages, 5_000):
        store.apply(_records(first, min(5_000, messages - first), user_keys), (first + 5_000) * 1200)
    # One more message rolls a new file, so that every file of the set is sealed (and convertible).
    store.apply(_records(messages, 1, user_keys), (messages + 1) * 1200)
    return store, time.perf_counter() - started


def _time_both(store, db: sqlite3.Connection, keys) -> tuple[dict, dict]:
    """Each key once through the index and once through SQLite, alternating, so that both see the
    same moments of a noisy machine."""
    sql = ("SELECT physical_offset, store_time FROM idx WHERE key = ? AND store_time BETWEEN ? AND ? "
           "ORDER BY store_time DESC LIMIT 64")
    index_ns, sqlite_ns, reads = [], [], 0
    for key in keys:
        t = time.perf_counter_ns()
        result = store.query(TOPIC, key, 0, 2**62, 64)
        t1 = time.perf_counter_ns()
        rows = db.execute(sql, (f"{TOPIC}#{key}", 0, 2**62)).fetchall()
        t2 = time.perf_counter_ns()
        index_ns.append(t1 - t)
        sqlite_ns.append(t2 - t1)
        reads += result.reads
        if len(rows) != len(result.locators):  # the index may hold more (hash collisions), never fewer
            assert len(rows) < len(result.locators), f"{key}: index {len(result.locators)}, SQLite {len(rows)}"
    s = store.stats()
    figures = _latency(index_ns) | {"reads_per_query": reads / len(keys), "max_reads_per_file": s.max_reads_per_file,
                                    "files": s.files_unsealed + s.files_compact_local + s.files_compact_tier}
    return figures, _latency(sqlite_ns)


def _latency(ns: list[int]) -> dict:
    ordered = sorted(ns)
    return {"p50_us": ordered[len(ordered) // 2] / 1000, "p99_us": ordered[int(len(ordered) * 0.99)] / 1000,
            "mean_us": sum(ordered) / len(ordered) / 1000, "queries": len(ordered)}


def _build_sqlite(path: pathlib.Path, messages: int, user_keys: int) -> tuple[sqlite3.Connection, float]:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE idx (key TEXT NOT NULL, store_time INTEGER NOT NULL, physical_offset INTEGER NOT NULL)")
    started = time.perf_counter()
    for first in range(0, messages + 1, 50_000):
        rows = []
        for n in range(first, min(first + 50_000, messages + 1)):
            ts = BASE_MS + n // 5
            rows += [(f"{TOPIC}#order-{n}", ts, n * 1200), (f"{TOPIC}#user-{n % user_keys}", ts, n * 1200)]
        db.executemany("INSERT INTO idx VALUES (?, ?, ?)", rows)
    db.execute("CREATE INDEX idx_key_time ON idx (key, store_time)")  # after the load: the fast way
    db.commit()
    return db, time.perf_counter() - started


def run_query(work: pathlib.Path, cfg: dict) -> dict:
    messages, user_keys = cfg["entries"] // 2, cfg["entries"] // 20  # each user key: 10 messages
    rng = random.Random(7)
    kinds = {"unique key (1 match)": [f"order-{rng.randrange(messages)}" for _ in range(cfg["queries"])],
             "key with 10 matches": [f"user-{rng.randrange(user_keys)}" for _ in range(cfg["queries"])]}
    db, sqlite_s = _build_sqlite(work / "sqlite.db", messages, user_keys)
    log("query: sqlite built", seconds=sqlite_s)
    result = {"entries": cfg["entries"], "build_sqlite_s": sqlite_s, "sets": {}}
    try:
        for file_entries in cfg["file_entries"]:
            files = -(-cfg["entries"] // file_entries)
            label = f"{files} file{'s' if files > 1 else ''} of {file_entries:,} entries"
            result["sets"][label] = _measure_set(work / f"q{file_entries}", messages, user_keys, file_entries,
                                                 db, kinds)
    finally:
        db.close()
    return result


def _measure_set(root: pathlib.Path, messages: int, user_keys: int, file_entries: int, db, kinds) -> dict:
    store, build_s = _build_index(root, messages, user_keys, file_entries)
    log("query: index built", entries=store.stats().entries, file_entries=file_entries, seconds=build_s)
    out = {"build_index_s": build_s, "layouts": {}, "sqlite": {}}
    try:
        for layout, prepare in (("unsealed", lambda: 0), ("compact", lambda: store.convert_sealed(10**6)),
                                ("tier", lambda: store.move_to_tier(10**6))):
            started = time.perf_counter()
            prepare()
            out[f"{layout}_prepare_s"] = time.perf_counter() - started
            store.counters.max_reads_per_file = 0  # per layout
            out["layouts"][layout], out["sqlite"][layout] = {}, {}
            for kind, keys in kinds.items():
                ours, theirs = _time_both(store, db, keys)
                out["layouts"][layout][kind], out["sqlite"][layout][kind] = ours, theirs
                log(f"query {layout}: {kind}", p50_us=ours["p50_us"], p99_us=ours["p99_us"],
                    reads=ours["reads_per_query"], sqlite_p50_us=theirs["p50_us"], sqlite_p99_us=theirs["p99_us"])
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


# ---- report --------------------------------------------------------------------------------------------

def _row(workload, figure, unit, comparison, comparison_figure, target=None, **extra) -> dict:
    ratio = figure / comparison_figure if figure is not None and comparison_figure else None
    met = None
    if target is not None and ratio is not None:
        op, bound = target
        met = ratio >= bound if op == ">=" else ratio <= bound
    return {"workload": workload, "figure": figure, "unit": unit, "comparison": comparison,
            "comparison_figure": comparison_figure, "ratio": ratio,
            "target": f"{target[0]} {target[1]}" if target else None, "met": met, **extra}


def build_rows(results: dict) -> list[dict]:
    rows = []
    b = results.get("index-build")
    if b and "error" not in b:
        rows.append(_row("index build while appending (records/s)", b["index_records_per_s_while_appending"],
                         "records/s", "append rate, same window (msgs/s)", b["append_msgs_per_s"], (">=", 1.0),
                         extra=f"max lag {b['max_lag_bytes'] / MiB:.1f} MiB, final {b['final_lag_bytes'] / MiB:.1f} "
                               f"MiB; caught up {_seconds(b['catch_up_s'])} after the producer stopped; "
                               f"{b['index_records_per_s_overall'] or 0:,.0f} records/s from start to caught up; "
                               f"the producer's own rate {b.get('producer_msgs_per_s', 0):,.0f} msgs/s"))
    q = results.get("index-query")
    if q and "error" not in q:
        for label, found in q["sets"].items():
            for layout, kinds in found["layouts"].items():
                for kind, f in kinds.items():
                    s = found["sqlite"][layout][kind]
                    rows.append(_row(f"query p99, {label}, {layout}, {kind}", f["p99_us"], "us",
                                     "SQLite p99, same keys, interleaved", s["p99_us"], ("<=", 1.0), p50=f["p50_us"],
                                     comparison_p50=s["p50_us"], extra=_reads_note(layout, f)))
    return rows


def _seconds(value) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _reads_note(layout: str, f: dict) -> str:
    if layout == "unsealed":
        return f"{f['files']} files, read through mmap (no ranged reads to count)"
    return (f"{f['reads_per_query']:.2f} ranged reads/query over {f['files']} files, "
            f"max {f['max_reads_per_file']} per file")


def _fmt(value, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"


def markdown(rows: list[dict], meta: dict, results: dict) -> str:
    out = [f"# Index benchmark — {meta['started']}", "",
           f"{meta['machine']}; {meta['mode']} run took {meta['elapsed_s']:.0f} s; git {meta['git']}. "
           "One run on a shared machine: read the ratios. Workloads: bench/index_bench.py's docstring. "
           + diskuse.describe(meta), "",
           "| workload | figure | p50 | comparison point (same run) | its figure | its p50 | ratio | target | notes |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        target = "" if r["target"] is None else f"{r['target']}: " + ("met" if r["met"] else "**missed**")
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        comparison_unit = r["unit"] if r["unit"] == "us" else "msgs/s"
        out.append(f"| {r['workload']} | {_fmt(r['figure'], r['unit'])} | {_fmt(r.get('p50'), r['unit'])} | "
                   f"{r['comparison']} | {_fmt(r['comparison_figure'], comparison_unit)} | "
                   f"{_fmt(r.get('comparison_p50'), r['unit'])} | {ratio} | {target} | {r.get('extra', '')} |")
    q = results.get("index-query") or {}
    for label, found in q.get("sets", {}).items():
        out += ["", f"Query set '{label}': {q['entries']:,} entries built in {found['build_index_s']:.0f} s through "
                    f"IndexStore.apply; conversion to compact {found['compact_prepare_s']:.0f} s, move to the tier "
                    f"{found['tier_prepare_s']:.0f} s."]
    if "build_sqlite_s" in q:
        out += ["", f"SQLite: the same entries loaded and indexed in {q['build_sqlite_s']:.0f} s."]
    b = results.get("index-build") or {}
    if "cores" in b:
        out += ["", "Build window: " + ", ".join(f"{k} used {v:.2f} cores" for k, v in b["cores"].items())
                + f"; {b['messages']:,} messages of {BODY_BYTES} B with 2 keys in {b['window_s']:.1f} s."]
    for group, value in results.items():
        if isinstance(value, dict) and value.get("error"):
            out.append(f"\ngroup {group} FAILED: {value['error']}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = groups.parse("mqstore Index benchmark", GROUPS, "producer", argv)  # --producer: the producer process
    if args.child:
        print(json.dumps(asyncio.run(_produce(json.loads(args.child)))))
        return 0
    if not args.groups:
        print(f"index bench: nothing to do for --only {args.only}", flush=True)
        return 0
    cfg = QUICK if args.quick else FULL
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # in-process IndexStore: quiet
    started = groups.now()
    results = groups.run("index", (("index-build", run_build), ("index-query", run_query)), args, cfg)
    return groups.write("index", args, cfg, started, time.monotonic() - _T0, results, build_rows(results),
                        markdown, f", SQLite {sqlite3.sqlite_version}, Linux {platform.release()}")


if __name__ == "__main__":
    sys.exit(main())
