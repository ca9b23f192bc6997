"""The Spark round's crossover on compose's 2-worker standalone cluster (issue 37), against the local engine:
``.venv/bin/python bench/spark_compose.py [--sizes 50000,200000,800000] [--repeats 1]``.

Not part of ``make bench``: it needs a Docker engine (COMPOSE_ENGINE, default the private engine's script
/work/shared/tools/docker/engine.sh when present, as the compose checks; empty: the ambient DOCKER_HOST)
and takes minutes (the images' build, then a Spark application per round). What it does:

  1. builds compose's two images (``docker compose build commitlog compactor``, tag MQSTORE_IMAGE_TAG,
     default spark-bench; ``--no-build`` uses them as they are) and brings up docker-compose.yml's
     commitlog, compactor, spark-master, spark-worker-1 and spark-worker-2 once (project mqsparkbench),
     waiting until the master lists both workers ALIVE;
  2. measures what the four Spark-side containers (compactor, master, both workers) use idle, over
     ``--idle-s`` seconds;
  3. for each size, ``--repeats`` times, runs ``python -m mqstore_spark.cluster_round`` in the compactor's
     container (the driver, as make compose-check-spark does): a sealed compaction log of N records over
     N x ``--keys-per-record`` keys of ``--key-bytes`` bytes in ``--segment-mib`` segments, the local
     engine's round on one copy, the Spark job on the cluster (both workers, one core and a 512m executor
     each, through compose's file:///tier) on the other, every file compared byte for byte (a difference
     fails the bench). Wall seconds of each engine; CPU seconds: the local round's process time, and for
     Spark the compactor container's cgroup during the job (the driver's Python and JVM, the tier's PUTs
     and GETs, the install) plus what the master's and the workers' cgroups used over the whole call,
     less their idle rate over the generation and the local round;
  4. fits a line (fixed seconds + microseconds per record, least squares over the medians) per engine in
     wall time and in CPU time, and reports the smallest measured size where the cluster's wall time is
     below the local engine's, and the size where the fitted wall lines cross (or that they do not: the
     cluster's per-record cost is the higher);
  5. writes bench/results/spark_compose.json and .md (``--out DIR`` elsewhere), after each size (a run cut
     short keeps the sizes it measured, ``"complete": false``);
  6. always: ``docker compose down -v`` of the project, and the two images removed unless
     ``--keep-images``. The engine is left up.

Every container of the project shares this machine's cores: on 2 cores the "2-worker cluster" has the
same two cores as the local engine's one process, and the driver's JVM and the tier copies run on them
too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = "mqsparkbench"
SERVICES = ("commitlog", "compactor", "spark-master", "spark-worker-1", "spark-worker-2")
BUILD_SERVICES = ("commitlog", "compactor")
CPU_CONTAINERS = ("compactor", "spark-master", "spark-worker-1", "spark-worker-2")
CLUSTER_SIDE = ("spark-master", "spark-worker-1", "spark-worker-2")
MASTER = "spark://spark-master:7077"
DEFAULT_ENGINE = "/work/shared/tools/docker/engine.sh"
WORK_DIR = "/data/spark-compose-bench"
# What a container's cgroup has used so far, in CPU seconds (the reader of mqstore_spark.cluster_round's
# cgroup_cpu_s, inline: one exec, no imports of the package).
CGROUP_READER = """import pathlib
for name in ("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage",
             "/sys/fs/cgroup/cpu.stat"):
    try:
        text = pathlib.Path(name).read_text()
    except OSError:
        continue
    if name.endswith("cpu.stat"):
        print(int(next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec "))) / 1e6)
    else:
        print(int(text) / 1e9)
    break
else:
    print("nan")
"""


def say(text: str) -> None:
    print(f"[spark-compose {time.strftime('%H:%M:%S')}] {text}", flush=True)


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b); b = 0 with fewer than two distinct x."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if n > 1 and sxx else 0.0
    return my - b * mx, b


def fit(rows: list[dict]) -> dict:
    """Each engine's fixed seconds and microseconds per record, in wall and CPU time, from a line through
    the rows' medians; where the wall lines cross; the smallest measured size where the cluster won."""
    xs = [r["records"] for r in rows]
    out: dict = {}
    for what, local_key, spark_key in (("wall", "local_s", "spark_s"), ("cpu", "local_cpu_s", "spark_cpu_s")):
        a_local, b_local = line_fit(xs, [r[local_key] for r in rows])
        a_spark, b_spark = line_fit(xs, [r[spark_key] for r in rows])
        out[what] = {"local_fixed_s": round(a_local, 2), "local_us_per_record": round(b_local * 1e6, 2),
                     "spark_fixed_s": round(a_spark, 2), "spark_us_per_record": round(b_spark * 1e6, 2),
                     "spark_over_local_per_record": round(b_spark / b_local, 2) if b_local > 0 else None}
        if len(set(xs)) < 2:
            out[what]["crossover_records"] = None
            out[what]["crossover"] = "one round size: no line to fit"
        elif b_spark <= 0:
            out[what]["crossover_records"] = None
            out[what]["crossover"] = ("not measurable: the cluster's fitted cost per record is not positive (the "
                                      "noise of its fixed cost is larger than its per-record cost over these sizes)")
        elif b_spark < b_local:
            crossing = max(0.0, (a_spark - a_local) / (b_local - b_spark))
            out[what]["crossover_records"] = round(crossing)
            out[what]["crossover"] = f"the cluster's line is below the local engine's above {crossing:,.0f} records"
        else:
            out[what]["crossover_records"] = None
            out[what]["crossover"] = ("none: the cluster's cost per record is the higher, its line never falls "
                                      "below the local engine's")
    cpu = out["cpu"]
    # The cores the cluster's executors and driver would need, all busy, for a record to take it no longer than
    # the local engine's one process takes (its CPU per record over theirs); its fixed cost aside.
    cpu["cores_to_match_local_per_record"] = (round(cpu["spark_us_per_record"] / cpu["local_us_per_record"], 1)
                                              if cpu["local_us_per_record"] > 0 else None)
    won = [r["records"] for r in rows if r["spark_s"] < r["local_s"]]
    out["smallest_measured_size_cluster_wins"] = min(won) if won else None
    return out


class Compose:
    """docker compose -p PROJECT on the engine of DOCKER_HOST (set by ``start_engine``)."""

    def __init__(self, env: dict) -> None:
        self.env = env

    def run(self, *args: str, capture: bool = False, check: bool = True, timeout: float = 3600):
        return subprocess.run(["docker", "compose", "-p", PROJECT, *args], cwd=ROOT, env=self.env, check=check,
                              text=True, timeout=timeout, capture_output=capture)

    def python(self, service: str, code: str, timeout: float = 60) -> str:
        return self.run("exec", "-T", service, "python", "-c", code, capture=True, timeout=timeout).stdout

    def cpu(self) -> dict[str, float]:
        return {name: float(self.python(name, CGROUP_READER).strip()) for name in CPU_CONTAINERS}

    def alive_workers(self) -> int:
        try:
            text = self.python("spark-master", "import urllib.request as u; "
                               "print(u.urlopen('http://127.0.0.1:8080/json/', timeout=5).read().decode())")
            return int(json.loads(text)["aliveworkers"])
        except (subprocess.SubprocessError, ValueError, KeyError):
            return 0


def start_engine(engine: str, env: dict) -> None:
    if not engine:
        return
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    done = subprocess.run([engine, "up", "--base", base], capture_output=True, text=True, check=True)
    host = re.search(r"^export DOCKER_HOST=(\S+)", done.stdout, re.M)
    if host is None:
        raise RuntimeError(f"{engine} up printed no DOCKER_HOST: {done.stdout[-500:]}")
    env["DOCKER_HOST"] = host.group(1)


def one_round(compose: Compose, args: argparse.Namespace, records: int, idle_rate: dict[str, float]) -> dict:
    keys = max(1, int(records * args.keys_per_record))
    before = compose.cpu()
    started = time.perf_counter()
    done = compose.run("exec", "-T", "compactor", "python", "-m", "mqstore_spark.cluster_round", "--dir", WORK_DIR,
                       "--records", str(records), "--keys", str(keys), "--key-bytes", str(args.key_bytes),
                       "--segment-mib", str(args.segment_mib), "--master", MASTER, "--executor-memory", "512m",
                       capture=True, check=False)
    call_s = time.perf_counter() - started
    after = compose.cpu()
    if done.returncode != 0:
        raise RuntimeError(f"cluster_round failed (exit {done.returncode}): {done.stderr[-3000:]}{done.stdout[-1000:]}")
    line = json.loads(done.stdout.strip().splitlines()[-1])
    if not line["identical"]:
        raise RuntimeError(f"the engines' files differ: {line['differing']}")
    if line["spark_cgroup_cpu_s"] is None:
        raise RuntimeError("the compactor's container shows no cgroup CPU counter")
    # The master and workers over the whole call, less their idle use while only the driver worked.
    not_spark_s = line["generate_s"] + line["local_s"]
    cluster = {name: after[name] - before[name] - idle_rate[name] * not_spark_s for name in CLUSTER_SIDE}
    spark_cpu = line["spark_cgroup_cpu_s"] + sum(cluster.values())
    return {"records": records, "keys": keys, "input_bytes": line["input_bytes"], "local_s": line["local_s"],
            "local_cpu_s": line["local_cpu_s"], "spark_s": line["spark_s"], "spark_cpu_s": round(spark_cpu, 2),
            "spark_driver_container_cpu_s": line["spark_cgroup_cpu_s"],
            "spark_cluster_cpu_s": {k: round(v, 2) for k, v in cluster.items()},
            "local_passes": line["local_passes"], "generate_s": line["generate_s"], "call_s": round(call_s, 1),
            "identical": line["identical"]}


def write(out: pathlib.Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spark_compose.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "spark_compose.md").write_text(markdown(result))


def measure(compose: Compose, args: argparse.Namespace, meta: dict) -> dict:
    before, started = compose.cpu(), time.perf_counter()
    time.sleep(args.idle_s)  # a measurement window, not a wait for a condition
    after, elapsed = compose.cpu(), time.perf_counter() - started
    idle_rate = {name: max(0.0, (after[name] - before[name]) / elapsed) for name in CPU_CONTAINERS}
    say(f"idle CPU (cores): { {k: round(v, 4) for k, v in idle_rate.items()} }")
    rows = []
    for records in args.sizes:
        runs = []
        for repeat in range(args.repeats):
            runs.append(one_round(compose, args, records, idle_rate))
            say(f"{records:,} records, run {repeat + 1}: {runs[-1]}")
        row = {key: runs[0][key] for key in ("records", "keys", "input_bytes", "local_passes")}
        for key in ("local_s", "local_cpu_s", "spark_s", "spark_cpu_s"):
            row[key] = statistics.median(r[key] for r in runs)
        row["runs"] = runs
        rows.append(row)
        # after each size, so that a run cut short keeps what it measured ("complete": false)
        meta["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        write(args.out, {"meta": {**meta, "complete": len(rows) == len(args.sizes)}, "idle_cpu_cores": idle_rate,
                         "rows": rows, "fit": fit(rows)})
    return {"idle_cpu_cores": idle_rate, "rows": rows, "fit": fit(rows)}


def markdown(result: dict) -> str:
    meta, fitted = result["meta"], result["fit"]
    lines = ["# The Spark round on compose's 2-worker standalone cluster vs the local engine", "",
             f"{meta['when']}, {meta['cpus']} CPUs, git {meta['git']}, load average before {meta['load_before']}. "
             f"Command: `{meta['command']}`. Records of {meta['key_bytes']}-byte keys, 16-byte bodies, "
             f"{meta['keys_per_record']} keys per record, {meta['segment_mib']} MiB segments; the cluster: "
             "spark-master, spark-worker-1 and -2 (1 core, 1 GiB each; executors of 512m), the driver in the "
             "compactor's container, the round through compose's file:///tier. Every run's files byte-identical "
             "to the local engine's. Medians of "
             f"{meta['repeats']} run(s) per size. Load average after: {meta.get('load_after', '?')}."
             + ("" if meta.get("complete", True) else " Cut short: the sizes measured before it stopped."), "",
             "| records | input | local engine wall | cluster wall | cluster / local (wall) | local CPU | "
             "cluster CPU (driver container + master + workers) | cluster / local (CPU) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['records']:,} | {r['input_bytes'] / (1 << 20):.0f} MiB | {r['local_s']:.1f} s | "
                     f"{r['spark_s']:.1f} s | {r['spark_s'] / r['local_s']:.2f} | {r['local_cpu_s']:.1f} s | "
                     f"{r['spark_cpu_s']:.1f} s | {r['spark_cpu_s'] / r['local_cpu_s']:.2f} |")
    lines += ["", "| fit (least squares over the sizes) | local engine | 2-worker cluster | "
              "per record, cluster / local |", "|---|---|---|---|"]
    for what in ("wall", "cpu"):
        f = fitted[what]
        unit = "s" if what == "wall" else "CPU-s"
        lines.append(f"| {what} | {f['local_fixed_s']:.1f} {unit} + {f['local_us_per_record']:.1f} us/record | "
                     f"{f['spark_fixed_s']:.1f} {unit} + {f['spark_us_per_record']:.1f} us/record | "
                     f"{f['spark_over_local_per_record']} |")
    won = fitted["smallest_measured_size_cluster_wins"]
    cores = fitted["cpu"].get("cores_to_match_local_per_record")
    lines += ["", f"Crossover (wall): {fitted['wall']['crossover']}. Smallest measured size where the cluster "
              f"won: {f'{won:,} records' if won else 'none up to the largest size measured'}. In CPU time a "
              f"record costs the cluster {fitted['cpu']['spark_over_local_per_record']}x what it costs the local "
              f"engine: its executors and driver would need {cores} cores, all busy, to take no longer per record "
              "than the local engine's one process (its fixed cost aside).", ""]
    return "\n".join(lines)


def git_rev() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True, check=False).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


def sizes_arg(text: str) -> list[int]:
    sizes = sorted(int(part) for part in text.replace(",", " ").split())
    if not sizes or sizes[0] < 1000:
        raise argparse.ArgumentTypeError("sizes of at least 1000 records, e.g. 50000,200000,800000")
    return sizes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=sizes_arg, default=sizes_arg("50000,200000,800000"),
                        help="round sizes in records (default 50000,200000,800000)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per size (medians; default 1)")
    parser.add_argument("--keys-per-record", type=float, default=0.25, help="keys = records x this (default 0.25)")
    parser.add_argument("--key-bytes", type=int, default=14, help="each key's length (default 14: key-<10 digits>)")
    parser.add_argument("--segment-mib", type=int, default=8, help="segment size (default 8 MiB)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="the idle CPU window (default 10 s)")
    parser.add_argument("--engine", default=os.environ.get("COMPOSE_ENGINE", DEFAULT_ENGINE
                                                           if os.path.exists(DEFAULT_ENGINE) else ""),
                        help="the engine script (up --base IMAGE); empty: the ambient DOCKER_HOST")
    parser.add_argument("--no-build", action="store_true", help="use the images as they are")
    parser.add_argument("--keep-images", action="store_true", help="keep the two images at the end")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    env = {**os.environ, "MQSTORE_IMAGE_TAG": os.environ.get("MQSTORE_IMAGE_TAG", "spark-bench"),
           "MQSTORE_COMMITLOG_HOST_PORT": "53051", "MQSTORE_COMPACTOR_HOST_PORT": "53054"}
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(), "git": git_rev(), "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "python": platform.python_version(), "command": "bench/spark_compose.py " + " ".join(argv),
            "repeats": args.repeats, "keys_per_record": args.keys_per_record, "key_bytes": args.key_bytes,
            "segment_mib": args.segment_mib}
    start_engine(args.engine, env)
    compose = Compose(env)
    try:
        if not args.no_build:
            say("docker compose build commitlog compactor")
            compose.run("build", "--quiet", *BUILD_SERVICES)
        say(f"docker compose up {' '.join(SERVICES)}")
        # No --wait: on a loaded machine the master's JVM can miss its health check's start period and be
        # "unhealthy" for a while; what the rounds need is the master listing both workers.
        compose.run("up", "-d", *SERVICES)
        deadline = time.monotonic() + 300
        while compose.alive_workers() < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the master does not list 2 ALIVE workers after 300 s")
            time.sleep(1)
        say("the master lists 2 workers")
        result = {"meta": {**meta, "complete": True}, **measure(compose, args, meta)}
        say(f"wrote {args.out / 'spark_compose.md'}")
        print(markdown(result))
        return 0
    finally:
        say("docker compose down -v")
        compose.run("down", "-v", "--timeout", "30", check=False, capture=True)
        if not args.keep_images:
            images = compose.run("config", "--images", *BUILD_SERVICES, capture=True, check=False).stdout.split()
            subprocess.run(["docker", "image", "rm", *images], env=env, check=False, capture_output=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
