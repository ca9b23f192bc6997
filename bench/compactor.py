"""Compactor benchmark (``make bench`` runs it): writes bench/results/compactor.json and .md.

Groups (``--only compactor-round,compactor-scale,compactor-spark,compactor-reads``; default all):

  compactor-round  A local round (engine=local, in a child process of its own) over a compaction log of
                   1x, 4x and 16x ``base_mib`` of 1 KiB records over ``keys`` keys (so 16x holds 16 times
                   the versions of the same keys), all segments sealed. Comparison point in the same
                   run: one pass of the project's record reader (record_reader.records, CRC checked)
                   over the same segment files, in a child process too. Reported: MB/s of input for
                   both and their ratio (target: round >= 0.3x the reader pass), and the peak RSS of the
                   round's process per size (target: 16x within 1.2x of 1x).
  compactor-scale  A local round at a fixed offset map budget (``scale_budget_keys`` keys) over N
                   records of 1 KiB over K keys, then over 4N records over 4K keys (K many times the
                   budget, so the map fills many times): the round time of each and their ratio
                   (target: <= 5x; rounds that rewrite every segment per map filling take 13-18x).
  compactor-spark  Inputs of ``spark_records`` records (``spark_body_bytes`` bodies over records / 4 keys; up
                   to 4M records, so that the per-record cost outweighs the noise of the job's ~30 CPU-s
                   fixed cost) through the Spark job (mqstore_spark.round_job as the compactor runs it: a
                   child process with its own SparkSession on local[2]), wall time including the session
                   start, against a local round of the same input, ``spark_repeats`` times each alternating
                   (MQSTORE_BENCH_SPARK_REPEATS overrides). A line per engine (fixed seconds + microseconds
                   per record, least squares through every run, with each run's residual, the residuals'
                   s.d. and the slope's standard error) gives the round size where Spark overtakes the local
                   engine, or, when Spark's per-record cost is the higher on this machine, how many executor
                   cores would match it and the crossover with twice that many (the extrapolation), and
                   Spark's cost per record per core (2 x its us/record on local[2]) over the local
                   engine's (target: <= 3); the same per record in CPU time (the Spark job's processes
                   by RUSAGE_CHILDREN, plus the Python workers' as sampled from /proc: pyspark's daemon
                   ignores SIGCHLD, so no RUSAGE counts them; the local round's process_time), which a
                   loaded machine moves less than wall time, and the job's CPU split by process (JVM,
                   Python workers, pyspark's daemon, driver Python: sampled from /proc, approximate).
  compactor-reads  Real processes (CommitLog, Compactor) on 127.0.0.1: a COMPACTION topic of ``kv_keys``
                   keys x ``kv_versions`` versions of 1 KiB values, compacted. BatchGetLatest with 100
                   random keys per call, sequential, for ``duration_s`` (keys/s), against NATS JetStream
                   KV get when a NATS server and client are available (else the row says why not); Scan
                   of every live key against replaying the raw topic from offset 0 with CommitLog.Pull
                   (target: Scan <= 0.2x the replay time).

``--quick`` runs tiny sizes and writes to bench/results/scratch/. Every process started is stopped.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
import traceback

import diskuse
import grpc
import groups
from mqstore import defaults
from procs import PYTHON, GrpcServer

GROUPS = ("compactor-round", "compactor-scale", "compactor-spark", "compactor-reads")
MiB = 1 << 20
FULL = {"base_mib": 16, "factors": (1, 4, 16), "keys": 4000,
        "spark_records": (500_000, 1_000_000, 2_000_000, 4_000_000), "spark_repeats": 3, "spark_body_bytes": 100,
        "segment_mib": 8,
        "kv_keys": 10_000, "kv_versions": 5, "duration_s": 5.0,
        "scale_records": 40_000, "scale_keys": 20_000, "scale_budget_keys": 2_000}
QUICK = {"base_mib": 1, "factors": (1, 4, 16), "keys": 300,
         "spark_records": (10_000, 40_000), "spark_repeats": 1, "spark_body_bytes": 100,
         "segment_mib": 1,
         "kv_keys": 500, "kv_versions": 3, "duration_s": 1.0,
         "scale_records": 4_000, "scale_keys": 2_000, "scale_budget_keys": 200}
_T0 = time.monotonic()


# ---- children (one process per measurement: its peak RSS is its own) ------------------------------------

def _child(spec: dict) -> dict:
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    if spec["kind"] == "generate":
        return _generate(pathlib.Path(spec["dir"]), spec["bytes"], spec["keys"], spec["segment_bytes"],
                         spec.get("records"), spec.get("body_bytes", 1024))
    if spec["kind"] == "reader":
        from mqstore.format import record_reader
        started, count, total = time.perf_counter(), 0, 0
        for path in sorted(pathlib.Path(spec["dir"]).rglob("*.log")):
            data = path.read_bytes()
            for view in record_reader.records(data):
                count += 1
                total += view.size
        return {"seconds": time.perf_counter() - started, "records": count, "bytes": total, "rss_kib": _rss()}
    from mqstore.clock import SystemClock
    from mqstore.compaction.policy import CompactionConfig
    from mqstore.compaction.qlog import QueueLog
    from mqstore.compaction.rounds import run_round
    from mqstore.compaction.offset_map import ENTRY_COST_BYTES
    budget = spec.get("budget_keys")
    config = CompactionConfig(segment_size_bytes=spec["segment_bytes"],
                              **({"offset_map_memory_bytes": budget * ENTRY_COST_BYTES} if budget else {}))
    qlog = QueueLog(pathlib.Path(spec["dir"]) / "kv" / "0", spec["segment_bytes"], "kv", 0)
    started, cpu = time.perf_counter(), time.process_time()
    stats = run_round(qlog, config, SystemClock().now_ms())
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    qlog.close()
    return {"seconds": seconds, "cpu_s": cpu, "passes": stats.passes, "records_in": stats.records_in,
            "records_out": stats.records_out, "rss_kib": _rss()}


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _generate(directory: pathlib.Path, total_bytes: int, keys: int, segment_bytes: int,
              records: int | None = None, body_bytes: int = 1024) -> dict:
    """``total_bytes`` of records (or ``records`` of them) with keys drawn at random from ``keys``, bodies of
    ``body_bytes``."""
    from mqstore.compaction.qlog import QueueLog
    from mqstore.format import record
    qlog = QueueLog(directory / "kv" / "0", segment_bytes, "kv", 0)
    topic, written, offset, rng = record.topic_part(b"kv"), 0, 0, random.Random(7)
    body = b"v" * body_bytes
    while written < total_bytes if records is None else offset < records:
        key = f"key-{rng.randrange(keys):06d}"
        parts: list[bytes] = []
        record.encode_parts(parts, topic, body, record.encode_properties({"KEYS": key}), 0, 0, 0, 1,
                            b"\x7f\0\0\1", 1, b"\x7f\0\0\1", 2, 0)
        raw = bytearray(b"".join(parts))
        record.stamp(raw, 0, offset, 0, 1_700_000_000_000 + offset)
        qlog.append(bytes(raw), offset, 0, 1_700_000_000_000 + offset, key)
        written, offset = written + len(raw), offset + 1
    qlog.seal_active()
    qlog.close()
    return {"bytes": written, "records": offset}


def _run_child(spec: dict, timeout_s: float = 3600) -> dict:
    done = subprocess.run([PYTHON, str(pathlib.Path(__file__)), "--child", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {spec['kind']} failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- groups -----------------------------------------------------------------------------------------------

def _inputs(work: pathlib.Path, cfg: dict, factor: int) -> tuple[pathlib.Path, int]:
    """A generated input of factor x base (reused by the groups); a fresh copy per round."""
    source = work / f"input-{factor}x"
    if not source.exists():
        made = _run_child({"kind": "generate", "dir": str(source), "bytes": factor * cfg["base_mib"] * MiB,
                           "keys": cfg["keys"], "segment_bytes": cfg["segment_mib"] * MiB})
        (work / f"input-{factor}x.json").write_text(json.dumps(made))
    copy = work / f"round-{factor}x"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    return copy, sum(p.stat().st_size for p in (source / "kv" / "0").glob("*.log"))


def run_round(work: pathlib.Path, cfg: dict) -> dict:
    rows = []
    for factor in cfg["factors"]:
        directory, size = _inputs(work, cfg, factor)
        reader = _run_child({"kind": "reader", "dir": str(directory)})
        local = _run_child({"kind": "round", "dir": str(directory), "segment_bytes": cfg["segment_mib"] * MiB})
        rows.append({"factor": factor, "input_bytes": size, "reader_s": reader["seconds"], "round_s": local["seconds"],
                     "reader_mb_s": size / 1e6 / reader["seconds"], "round_mb_s": size / 1e6 / local["seconds"],
                     "round_rss_kib": local["rss_kib"], "reader_rss_kib": reader["rss_kib"], "passes": local["passes"],
                     "records_in": local["records_in"], "records_out": local["records_out"]})
        print(f"compactor bench: round {factor}x {rows[-1]}", flush=True)
    return {"rows": rows}


def run_scale(work: pathlib.Path, cfg: dict) -> dict:
    rows = []
    for factor in (1, 4):
        source = work / f"scale-{factor}x"
        if not source.exists():
            _run_child({"kind": "generate", "dir": str(source), "bytes": 0, "records": factor * cfg["scale_records"],
                        "keys": factor * cfg["scale_keys"], "segment_bytes": cfg["segment_mib"] * MiB})
        copy = work / f"scale-round-{factor}x"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
        local = _run_child({"kind": "round", "dir": str(copy), "segment_bytes": cfg["segment_mib"] * MiB,
                            "budget_keys": cfg["scale_budget_keys"]})
        shutil.rmtree(copy)
        rows.append({"factor": factor, "records": factor * cfg["scale_records"], "keys": factor * cfg["scale_keys"],
                     "budget_keys": cfg["scale_budget_keys"], "round_s": local["seconds"], "passes": local["passes"],
                     "records_out": local["records_out"], "rss_kib": local["rss_kib"]})
        print(f"compactor bench: scale {factor}x {rows[-1]}", flush=True)
    return {"rows": rows, "ratio": rows[1]["round_s"] / rows[0]["round_s"]}


def _spark_inputs(work: pathlib.Path, cfg: dict, records: int) -> tuple[pathlib.Path, int]:
    """A generated input of ``records`` records of ``spark_body_bytes`` over records / 4 keys (each key four
    versions, as bench/spark_compose.py's), reused across repeats; a fresh copy per round."""
    source = work / f"spark-input-{records}"
    if not source.exists():
        made = _run_child({"kind": "generate", "dir": str(source), "bytes": 0, "records": records,
                           "keys": max(1, records // 4), "segment_bytes": cfg["segment_mib"] * MiB,
                           "body_bytes": cfg["spark_body_bytes"]})
        (work / f"spark-input-{records}.json").write_text(json.dumps(made))
    copy = work / "spark-round"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    return copy, sum(p.stat().st_size for p in (source / "kv" / "0").glob("*.log"))


def run_spark(work: pathlib.Path, cfg: dict) -> dict:
    """The Spark job (local[2], a child process as the compactor runs it) and the local round on the same
    inputs of growing size, alternating, ``spark_repeats`` times; a line per engine through every run (not
    only the medians) with its residuals, and the crossover."""
    rows = []
    repeats = int(os.environ.get("MQSTORE_BENCH_SPARK_REPEATS", cfg.get("spark_repeats", 1)))
    for records in cfg["spark_records"]:
        runs: dict[str, list] = {"local_s": [], "spark_s": [], "local_cpu_s": [], "spark_cpu_s": [], "spark_split": []}
        for _ in range(repeats):  # alternating: a local round, then the Spark job, on fresh copies
            directory, size = _spark_inputs(work, cfg, records)
            local = _run_child({"kind": "round", "dir": str(directory), "segment_bytes": cfg["segment_mib"] * MiB})
            records_in = local["records_in"]
            runs["local_s"].append(local["seconds"])
            runs["local_cpu_s"].append(local["cpu_s"])
            directory, _ = _spark_inputs(work, cfg, records)  # a fresh copy for the Spark job
            seconds, cpu, split = _spark_job(work, cfg, directory)
            runs["spark_s"].append(seconds)
            runs["spark_cpu_s"].append(cpu)
            runs["spark_split"].append(split)
        rows.append({"records": records, "records_in": records_in, "input_bytes": size,
                     "local_passes": local["passes"], "spark_split": runs.pop("spark_split"),
                     **{name: statistics.median(values) for name, values in runs.items()},
                     **{_runs(name): values for name, values in runs.items()}})
        print(f"compactor bench: spark {records:,} records {rows[-1]}", flush=True)
    shutil.rmtree(work / "spark-round", ignore_errors=True)
    return {"rows": rows, "fit": crossover(rows)}


def _runs(name: str) -> str:
    """The row's key of every run's value of a median's key: spark_cpu_s -> spark_cpu_runs_s."""
    return name[:-2] + "_runs_s"


def _spark_job(work: pathlib.Path, cfg: dict, directory: pathlib.Path) -> tuple[float, float, dict]:
    """Seconds of one Spark job (mqstore_spark.round_job in a child process, its session included) over the
    sealed segments of ``directory``'s queue, the CPU seconds of all its processes, and that CPU split by
    process kind as sampled from /proc while the job ran (:class:`_TreeSampler`). The total: RUSAGE_CHILDREN
    (the driver's Python, spark-submit, the JVM, pyspark's daemon; this process is their subreaper, so the
    JVM, which the job's Python leaves to exit on its own, is reaped here and counted) plus the Python
    workers' as sampled: pyspark's daemon ignores SIGCHLD, so its workers are reaped by the kernel and no
    RUSAGE holds their CPU (before this the bench left them out)."""
    import dataclasses
    from mqstore.compaction.policy import CompactionConfig
    qdir = directory / "kv" / "0"
    bases = sorted(int(p.name[:20]) for p in qdir.glob("*.log"))[:-1]
    config = CompactionConfig(segment_size_bytes=cfg["segment_mib"] * MiB)
    request = {"queue_dir": str(qdir), "bases": bases, "cleaned_offset": -1, "next_offset": 1 << 40,
               "now_ms": int(time.time() * 1000), "config": dataclasses.asdict(config),
               "staging": str(qdir / "staging"), "master": "local[2]"}
    path = work / "spark-request.json"
    path.write_text(json.dumps(request))
    env = {**os.environ, "PYSPARK_PYTHON": PYTHON, "SPARK_LOCAL_IP": "127.0.0.1"}
    _subreaper()
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    job = subprocess.Popen([PYTHON, "-m", "mqstore_spark.round_job", str(path)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    with _TreeSampler(job.pid) as sampler:
        try:
            _, stderr = job.communicate(timeout=3600)
        except subprocess.TimeoutExpired:
            job.kill()
            _, stderr = job.communicate()
        seconds = time.perf_counter() - started
        sampler.until_gone(deadline_s=120)
    _reap_orphans(deadline_s=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if job.returncode != 0:
        raise RuntimeError(f"spark job failed: {stderr[-1500:]}")
    reaped = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # pyspark's daemon ignores SIGCHLD, so the kernel reaps the workers it forks and their CPU reaches no
    # RUSAGE_CHILDREN: it is added as sampled (each worker at its last sample, up to an interval short)
    workers = sampler.split(reaped)["python_workers"]
    return seconds, reaped + workers, sampler.split(reaped + workers)


class _TreeSampler:
    """CPU seconds of a process tree by kind, from /proc every ``interval_s``: the root (the job's driver
    Python), ``java`` (the JVM and spark-submit's launcher), the Python below the JVM (pyspark's daemon), the
    processes the daemon forks (the Python workers, which run the tasks' functions) and the rest
    (spark-submit's shell); each process counted at its last sample (utime + stime), so a process that lives
    less than an interval can be missed: the split is approximate, its ``unsampled`` the total's part beyond
    it."""

    def __init__(self, root: int, interval_s: float = 0.2):
        import threading
        self.root, self.interval_s = root, interval_s
        self.known: dict[int, str] = {root: "driver_python"}
        self.cpu: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def until_gone(self, deadline_s: float) -> None:
        """Wait (up to ``deadline_s``) until no process of the tree is alive, sampling."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and self._sample():
            time.sleep(self.interval_s)

    def _loop(self) -> None:
        while not self.stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> int:
        """One pass over /proc; how many processes of the tree are alive."""
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    text = pathlib.Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                comm = text[text.index("(") + 1:text.rindex(")")]
                fields = text[text.rindex(")") + 2:].split()
                stats[int(entry)] = (comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / self.tick,
                                     fields[0])
        alive = 0
        for _ in range(4):  # parents before children, whatever the listing's order; a kind is the latest
            for pid, (comm, ppid, _cpu, state) in stats.items():  # sample's (spark-submit's shell execs java)
                if pid != self.root and (pid in self.known or ppid in self.known) and state != "Z":
                    parent = self.known.get(ppid)
                    self.known[pid] = ("jvm" if comm == "java" else
                                       "pyspark_daemon" if parent == "jvm" and "python" in comm else
                                       "python_workers" if parent in ("pyspark_daemon", "python_workers") else
                                       self.known.get(pid, "other"))
        for pid, (_comm, _ppid, cpu, state) in stats.items():
            if pid in self.known and state != "Z":
                self.cpu[pid] = max(cpu, self.cpu.get(pid, 0.0))
                alive += 1
            elif pid in self.known:
                self.cpu[pid] = max(cpu, self.cpu.get(pid, 0.0))
        return alive

    def processes(self) -> list[tuple[int, str, float]]:
        return sorted((pid, self.known[pid], cpu) for pid, cpu in self.cpu.items())

    def split(self, total_cpu_s: float) -> dict:
        out = {"driver_python": 0.0, "jvm": 0.0, "pyspark_daemon": 0.0, "python_workers": 0.0, "other": 0.0}
        for pid, cpu in self.cpu.items():
            out[self.known[pid]] += cpu
        out["unsampled"] = total_cpu_s - sum(out.values())
        return {name: round(value, 2) for name, value in out.items()}


def _subreaper() -> None:
    """Become the reaper of this process's orphaned descendants (Linux PR_SET_CHILD_SUBREAPER)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def _reap_orphans(deadline_s: float) -> None:
    """Wait for the descendants left to this process (the Spark job's JVM exits once its Python has), up to
    ``deadline_s``; any still running then is killed and reaped."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                subprocess.run(["pkill", "-KILL", "-P", str(os.getpid())], check=False)
            time.sleep(0.05)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if n > 1 and sxx else 0.0
    return my - b * mx, b


def fit(xs: list[float], ys: list[float]) -> dict:
    """The least squares line y = fixed + per_x * x through the points, each point's residual, the residuals'
    standard deviation and the slope's standard error (None with fewer than 3 points or one x)."""
    fixed, per_x = _line(xs, ys)
    residuals = [y - fixed - per_x * x for x, y in zip(xs, ys, strict=True)]
    n, mx = len(xs), sum(xs) / len(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    sd = (sum(r * r for r in residuals) / (n - 2)) ** 0.5 if n > 2 else None
    return {"fixed": fixed, "per_x": per_x, "residuals": residuals, "residual_sd": sd,
            "per_x_se": sd / sxx ** 0.5 if sd is not None and sxx else None}


def crossover(rows: list[dict]) -> dict:
    """Each engine's fixed cost (s) and cost per record (us) from a line through all its measured rounds
    (every repeat a point: ``*_runs_s`` when the rows have them, else their medians), with residuals; the
    round size (records) where Spark's line falls below the local one, measured on local[2] or, when its
    per-record cost is the higher, the executor cores it would need (its per-record cost divided among
    them, the fixed cost as measured) and the round size where that many cores overtake the local engine."""
    if len(rows) < 2:
        return {"skipped": "one round size: no line to fit"}

    def points(name: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for r in rows:
            values = r.get(_runs(name)) or [r[name]]
            xs += [r["records"]] * len(values)
            ys += values
        return xs, ys

    lines = {name: fit(*points(name)) for name in ("local_s", "spark_s", "local_cpu_s", "spark_cpu_s")
             if all(name in r for r in rows)}
    a_local, b_local = lines["local_s"]["fixed"], lines["local_s"]["per_x"]
    a_spark, b_spark = lines["spark_s"]["fixed"], lines["spark_s"]["per_x"]
    out = {"local_fixed_s": a_local, "local_us_per_record": b_local * 1e6, "spark_fixed_s": a_spark,
           "spark_us_per_record": b_spark * 1e6, "measured_on": "local[2]",
           "per_core_ratio": 2 * b_spark / b_local if b_local > 0 else None,  # core-us per record, Spark / local
           "lines": lines}
    if "spark_cpu_s" in lines and "local_cpu_s" in lines:  # CPU: what a record costs the cores, whatever the load
        b_local_cpu, b_spark_cpu = lines["local_cpu_s"]["per_x"], lines["spark_cpu_s"]["per_x"]
        out.update(local_cpu_us_per_record=b_local_cpu * 1e6, spark_cpu_us_per_record=b_spark_cpu * 1e6,
                   spark_cpu_fixed_s=lines["spark_cpu_s"]["fixed"],
                   cpu_ratio=b_spark_cpu / b_local_cpu if b_local_cpu > 0 else None)
        se = lines["spark_cpu_s"]["per_x_se"]
        if se is not None:
            out["spark_cpu_us_per_record_se"] = se * 1e6
    if b_spark < b_local:
        out["crossover_records"] = max(0.0, (a_spark - a_local) / (b_local - b_spark))
        return out
    cores = 2 * b_spark / b_local  # local[2]: its per-record cost is what 2 cores give
    out["cores_to_match"] = cores
    cores_used = 2 * int(cores) + 2  # twice the break-even count: a crossover at a finite size
    per_record = b_spark * 2 / cores_used
    out["extrapolated_cores"] = cores_used
    out["extrapolated_crossover_records"] = max(0.0, (a_spark - a_local) / (b_local - per_record))
    return out


def run_reads(work: pathlib.Path, cfg: dict) -> dict:
    from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, commitlog_pb2_grpc, common_pb2
    from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
    log_server = GrpcServer.commitlog(work / "kv-log", "ASYNC").start()
    args = [PYTHON, "-m", "compactor_service.main", "--data-dir", str(work / "kv-compactor"), "--port", "0",
            "--commitlog", log_server.target, "--spark-master", "", "--round-interval-ms", "3600000"]
    compactor = GrpcServer("compactor", args, work / "kv-compactor.log").start()
    options = [("grpc.max_receive_message_length", defaults.MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(log_server.target, options) as lc, \
            grpc.insecure_channel(compactor.target, options) as cc:
        log, comp = commitlog_pb2_grpc.CommitLogStub(lc), compactor_pb2_grpc.CompactorStub(cc)
        log.CreateTopic(clpb.CreateTopicRequest(name="kv", queue_count=4, kind=common_pb2.TOPIC_KIND_COMPACTION))
        keys = [f"key-{i:07d}" for i in range(cfg["kv_keys"])]
        value = b"v" * 1024
        for _ in range(cfg["kv_versions"]):
            for first in range(0, len(keys), 500):
                log.Append(clpb.AppendRequest(topic="kv", messages=[common_pb2.MessageInput(body=value, keys=[k])
                                                                   for k in keys[first:first + 500]]), timeout=60)
        total = len(keys) * cfg["kv_versions"]
        deadline = time.monotonic() + 300
        while comp.Stats(pb.CompactorStatsRequest(), timeout=10).records_applied < total:
            if time.monotonic() > deadline:
                raise RuntimeError("the compactor did not apply the topic within 300 s")
            time.sleep(0.05)
        comp.Compact(pb.CompactRequest(topic="kv", seal_active=True), timeout=600)
        rng, calls, got = random.Random(1), 0, 0
        started = time.perf_counter()
        while time.perf_counter() - started < cfg["duration_s"]:
            response = comp.BatchGetLatest(pb.BatchGetLatestRequest(topic="kv", keys=rng.sample(keys, 100)), timeout=10)
            got += sum(v.found for v in response.values)
            calls += 1
        batch_s = time.perf_counter() - started
        started = time.perf_counter()
        scanned = sum(len(page.values) for page in comp.Scan(pb.ScanRequest(topic="kv", page_size=1000), timeout=600))
        scan_s = time.perf_counter() - started
        started, replayed = time.perf_counter(), 0
        for queue_id in range(4):
            offset = 0
            while True:
                page = log.Pull(clpb.PullRequest(topic="kv", queue_id=queue_id, offset=offset, max_messages=1000),
                                timeout=60)
                if not page.messages:
                    break
                replayed += len(page.messages)
                offset = page.next_offset
        replay_s = time.perf_counter() - started
    compactor.stop()
    log_server.stop()
    out = {"keys": len(keys), "versions": cfg["kv_versions"], "batch_keys_per_s": calls * 100 / batch_s,
           "batch_found": got, "batch_calls": calls, "scan_s": scan_s, "scanned": scanned, "replay_s": replay_s,
           "replayed": replayed, "scan_over_replay": scan_s / replay_s}
    try:
        import nats_kv
        out["nats"] = nats_kv.measure(work, keys, value, cfg["duration_s"])
    except Exception as exc:  # noqa: BLE001 - the peer is optional: its row says why it did not run
        traceback.print_exc()
        out["nats"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    print(f"compactor bench: reads {out}", flush=True)
    return out


# ---- report ---------------------------------------------------------------------------------------------------

def build_rows(results: dict) -> list[dict]:
    rows = []
    local = {r["factor"]: r for r in results.get("compactor-round", {}).get("rows", [])}
    for r in local.values():
        rows.append({"what": f"local round {r['factor']}x ({r['input_bytes'] / MiB:.0f} MiB)",
                     "value": f"{r['round_mb_s']:.1f} MB/s", "comparison": f"reader pass {r['reader_mb_s']:.1f} MB/s",
                     "ratio": r["round_mb_s"] / r["reader_mb_s"], "target": ">= 0.3"})
    if local:
        first, last = local[min(local)], local[max(local)]
        rows.append({"what": f"peak RSS of a round, {max(local)}x vs {min(local)}x",
                     "value": f"{last['round_rss_kib'] / 1024:.0f} MiB",
                     "comparison": f"{first['round_rss_kib'] / 1024:.0f} MiB",
                     "ratio": last["round_rss_kib"] / first["round_rss_kib"], "target": "<= 1.2"})
    scale = results.get("compactor-scale", {})
    if "ratio" in scale:
        small, big = scale["rows"]
        rows.append({"what": f"local round, {big['records']:,} records / {big['keys']:,} keys vs "
                             f"{small['records']:,} / {small['keys']:,}, map budget {big['budget_keys']:,} keys",
                     "value": f"{big['round_s']:.2f} s ({big['passes']} map fillings)",
                     "comparison": f"{small['round_s']:.2f} s ({small['passes']} map fillings)",
                     "ratio": scale["ratio"], "target": "<= 5"})
    spark = results.get("compactor-spark", {})
    fit = spark.get("fit", {})
    cpu_line = fit.get("lines", {}).get("spark_cpu_s")
    for n, r in enumerate(spark.get("rows", [])):
        runs = len(r.get("spark_runs_s", [])) or 1
        split = r.get("spark_split") or []
        parts = ", ".join(f"{name} {statistics.median(s.get(name, 0.0) for s in split):.1f}"
                          for name in ("jvm", "python_workers", "pyspark_daemon", "driver_python", "other",
                                       "unsampled")) if split else ""
        residuals = (", residuals of the CPU fit " + " / ".join(f"{x:+.1f}" for x in
                                                              cpu_line["residuals"][n * runs:(n + 1) * runs])
                     + " CPU-s") if cpu_line and len(cpu_line["residuals"]) == runs * len(spark["rows"]) else ""
        rows.append({"what": f"Spark round (local[2]) {r['records']:,} records ({r['input_bytes'] / MiB:.0f} MiB), "
                             f"session included, median of {runs}",
                     "value": f"{r['spark_s']:.1f} s, {r['spark_cpu_s']:.1f} CPU-s ({parts}){residuals}",
                     "comparison": f"local {r['local_s']:.2f} s, {r['local_cpu_s']:.2f} CPU-s",
                     "ratio": r["spark_s"] / r["local_s"], "target": "< 1 = Spark faster"})
    if "spark_us_per_record" in fit:
        if "crossover_records" in fit:
            where = f"Spark faster above {fit['crossover_records']:,.0f} records on local[2]"
        else:
            where = (f"never on local[2]; Spark needs {fit['cores_to_match']:.1f} cores to match the local "
                     f"per-record cost; with {fit['extrapolated_cores']} cores it would win above "
                     f"{fit['extrapolated_crossover_records']:,.0f} records")
        if fit.get("per_core_ratio") is not None:
            rows.append({"what": "Spark cost per record per core (local[2]: 2 x its us/record) vs the local engine",
                         "value": f"{2 * fit['spark_us_per_record']:.1f} core-us/record",
                         "comparison": f"local {fit['local_us_per_record']:.1f} us/record",
                         "ratio": fit["per_core_ratio"], "target": "<= 3"})
        if fit.get("cpu_ratio") is not None:
            rows.append({"what": "CPU per record (linear fit): the Spark job's processes (driver, JVM, Python workers) "
                                 "vs the local round",
                         "value": f"{fit['spark_cpu_us_per_record']:.1f} CPU-us/record"
                                  + (f" (+- {fit['spark_cpu_us_per_record_se']:.1f} s.e.; residual s.d. "
                                     f"{cpu_line['residual_sd']:.1f} CPU-s; fixed {fit['spark_cpu_fixed_s']:.1f} CPU-s)"
                                     if "spark_cpu_us_per_record_se" in fit else ""),
                         "comparison": f"local {fit['local_cpu_us_per_record']:.1f} CPU-us/record",
                         "ratio": fit["cpu_ratio"], "target": "<= 3"})
        rows.append({"what": "crossover (linear fit: fixed s + us/record)",
                     "value": f"Spark {fit['spark_fixed_s']:.1f} s + {fit['spark_us_per_record']:.1f} us/record",
                     "comparison": f"local {fit['local_fixed_s']:.2f} s + {fit['local_us_per_record']:.1f} us/record",
                     "ratio": None, "target": where})
    reads = results.get("compactor-reads", {})
    if "batch_keys_per_s" in reads:
        nats = reads.get("nats", {})
        rate = nats.get("get_keys_per_s")
        rows.append({"what": "BatchGetLatest, 100 keys a call", "value": f"{reads['batch_keys_per_s']:,.0f} keys/s",
                     "comparison": f"NATS KV get {rate:,.0f} keys/s" if rate else f"NATS KV: {nats.get('skipped')}",
                     "ratio": reads["batch_keys_per_s"] / rate if rate else None, "target": ">= 1.0"})
        rows.append({"what": f"Scan of {reads['scanned']:,} live keys", "value": f"{reads['scan_s']:.2f} s",
                     "comparison": f"replay of {reads['replayed']:,} records from offset 0: {reads['replay_s']:.2f} s",
                     "ratio": reads["scan_over_replay"], "target": "<= 0.2"})
    return rows


def markdown(rows: list[dict], meta: dict, results: dict) -> str:
    lines = ["# Compactor benchmark", "",
             f"{meta['started']}, {meta['mode']} run, {meta['machine']}, git {meta['git']}.",
             "Workloads: see bench/compactor.py's docstring. Ratios are measured in one run. "
             + diskuse.describe(meta), "",
             "| what | mqstore | comparison | ratio | target |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['what']} | {r['value']} | {r['comparison']} | {ratio} | {r['target']} |")
    for name, result in results.items():
        if isinstance(result, dict) and result.get("error"):
            lines.append(f"\n{name} failed: {result['error']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = groups.parse("mqstore Compactor benchmark", GROUPS, "child", argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    if not args.groups:
        print(f"compactor bench: nothing to do for --only {args.only}", flush=True)
        return 0
    cfg = QUICK if args.quick else FULL
    started = groups.now()
    results = groups.run("compactor", (("compactor-round", run_round), ("compactor-scale", run_scale),
                                       ("compactor-spark", run_spark),
                                       ("compactor-reads", run_reads)), args, cfg)
    return groups.write("compactor", args, cfg, started, time.monotonic() - _T0, results, build_rows(results),
                        markdown)


if __name__ == "__main__":
    sys.exit(main())
