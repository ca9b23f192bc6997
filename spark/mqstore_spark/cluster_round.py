"""A round larger than an executor on a Spark cluster, checked against the local engine:
``python -m mqstore_spark.cluster_round --dir DIR --records N --keys K [--key-bytes B] [--master URL]``.

``make compose-check-spark`` runs it in compose's compactor container (the driver), on the standalone
cluster (spark-master, spark-worker-1 and -2, executors of spark.executor.memory each), through the
compactor's tier (``--tier-url``, default MQSTORE_SPARK_TIER_URL; compose: file:///tier, a volume the
workers mount instead of the compactor's data), as the compactor's rounds go (mqstore.compaction.tier_round:
the sealed segments put under a fresh prefix, the output fetched back, the prefix deleted); without a tier
URL, over a queue the executors find at the driver's paths:

  1. generate a sealed compaction log of N records over K keys of B bytes each (small bodies; a key is
     ``key-<10 digits>`` padded with the hex of its SHAKE-128, so Spark's compressed shuffle and spill
     files carry the keys' full size), every tenth record of a key after its first a tombstone;
  2. copy it; run the local engine's round (mqstore.compaction.rounds.run_round with a map budget that
     holds every key, 32 B each; it still splits the records into ceil(1.25 x records / keys) buckets, a
     map filling each: ``local_passes``) on one copy, and the Spark job (``python -m
     mqstore_spark.round_job``, as the compactor runs it) on the other, then install its output as the
     compactor does (mqstore.compaction.staged.install_output);
  3. compare every file of the two queue directories byte for byte (the consume-queue files included);
  4. print one JSON line: records, keys, key bytes, input bytes, both engines' seconds and CPU seconds
     (``local_cpu_s``: the local round's process time; ``local_cgroup_cpu_s`` and ``spark_cgroup_cpu_s``:
     what the cgroup this process runs in used during each engine's round, i.e. inside a container the
     whole container's CPU, the Spark driver's JVM and Python included; null where no cgroup CPU counter is
     readable), and what one executor would hold to find the latest offset per key by itself (every key's
     bytes and an 8-byte offset each) against the executor's whole heap (``--executor-memory``), and
     whether the files are identical.
Exits 1 when they are not (or the job fails). The work directory is removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import hashlib
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

from mqstore.compaction import tier_round
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.qlog import QueueLog
from mqstore.compaction.qlog_files import STAGING
from mqstore.compaction.rounds import run_round
from mqstore.compaction.staged import install_output
from mqstore.format import record
from mqstore.tier.config import TierConfig
from mqstore.tier.urls import open_store

MiB = 1 << 20
BASE_MS = 1_700_000_000_000
OFFSET_BYTES = 8  # what one executor would keep per key beside the key itself: its latest offset
KEY_PREFIX_BYTES = len("key-0000000000")
MEMORY_UNITS = {"k": 1 << 10, "m": MiB, "g": 1 << 30}
# The CPU counter of the cgroup this process is in, as a container sees its own: cgroup v1's cpuacct.usage
# (nanoseconds) or v2's cpu.stat usage_usec. On a host these are the root's (the whole machine's).
CGROUP_CPU_FILES = ("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage",
                    "/sys/fs/cgroup/cpu.stat")


def key_name(k: int, key_bytes: int) -> str:
    """Key number ``k``, ``key_bytes`` long: ``key-<10 digits>``, then the hex of its SHAKE-128 (filler
    that a compressed shuffle cannot shrink, unlike a run of one character)."""
    prefix = f"key-{k:010d}"
    pad = key_bytes - len(prefix)
    return prefix + hashlib.shake_128(prefix.encode()).hexdigest((pad + 1) // 2)[:pad] if pad > 0 else prefix


def generate(queue_dir: pathlib.Path, records: int, keys: int, segment_bytes: int, key_bytes: int = KEY_PREFIX_BYTES,
             body_bytes: int = 16, seed: int = 7) -> int:
    """A sealed compaction log of ``records`` records over ``keys`` keys of ``key_bytes`` bytes (each key at
    least once while records >= keys); its size in bytes."""
    qlog = QueueLog(queue_dir, segment_bytes, "kv", 0)
    topic, rng, written = record.topic_part(b"kv"), random.Random(seed), 0
    body = b"v" * body_bytes
    for offset in range(records):
        k = offset if offset < keys else rng.randrange(keys)
        key = key_name(k, key_bytes)
        tombstone = offset >= keys and offset % 10 == 0
        parts: list[bytes] = []
        record.encode_parts(parts, topic, b"" if tombstone else body, record.encode_properties({"KEYS": key}),
                            0, 0, 0, 1, b"\x7f\0\0\1", 1, b"\x7f\0\0\1", 2, 0)
        raw = bytearray(b"".join(parts))
        record.stamp(raw, 0, offset, 0, BASE_MS + offset)
        qlog.append(bytes(raw), offset, 0, BASE_MS + offset, key)
        written += len(raw)
        if len(qlog.latest) >= 65536:
            qlog.latest.clear()  # nothing reads it here; whole, 2.6M keys of 256 B would take ~1 GB
    qlog.seal_active()
    qlog.close()
    return written


def cgroup_cpu_s(files: tuple[str, ...] = CGROUP_CPU_FILES) -> float | None:
    """CPU seconds the cgroup of ``files`` (the first readable) has used so far; None when none is readable."""
    for name in files:
        try:
            text = pathlib.Path(name).read_text()
        except OSError:
            continue
        if name.endswith("cpu.stat"):
            usec = next((line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")), None)
            if usec is not None:
                return int(usec) / 1e6
            continue
        return int(text.strip()) / 1e9
    return None


def _delta(before: float | None, after: float | None) -> float | None:
    return round(after - before, 2) if before is not None and after is not None else None


def spark_round(queue_dir: pathlib.Path, config: CompactionConfig, master: str, now_ms: int,
                tier_url: str = "") -> float:
    """The Spark job as the compactor runs it (a child process), its output installed; its seconds (with a
    tier, the inputs' PUTs and the output's GETs included)."""
    qlog = QueueLog(queue_dir, config.segment_size_bytes, "kv", 0)
    tier_config = TierConfig(tier_url=tier_url).with_env(os.environ) if tier_url else None
    store = open_store(tier_url, timeout_ms=tier_config.tier_call_timeout_ms, endpoint=tier_config.tier_endpoint,
                       region=tier_config.tier_region, credentials=tier_config.credentials) if tier_url else None
    try:
        bases, _ = qlog.sealed()
        request = {"bases": bases, "cleaned_offset": qlog.cleaned_offset, "next_offset": qlog.next_offset(),
                   "now_ms": now_ms, "config": dataclasses.asdict(config), "master": master}
        if store is None:
            request.update(queue_dir=str(queue_dir), staging=str(queue_dir / STAGING))
        else:
            request["tier"] = tier_round.request_part(tier_config, tier_round.new_prefix(), bases)
        path = queue_dir.parent / ".0.spark-request.json"
        path.write_text(json.dumps(request))
        started = time.perf_counter()
        try:
            if store is not None:
                tier_round.upload_inputs(store, request["tier"], queue_dir)
            done = subprocess.run([sys.executable, "-m", "mqstore_spark.round_job", str(path)], capture_output=True,
                                  text=True, check=False, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
            if done.returncode != 0:
                raise RuntimeError(f"the Spark job failed (exit {done.returncode}): {done.stderr[-3000:]}")
            if store is not None:
                tier_round.download_output(store, request["tier"]["prefix"], queue_dir / STAGING)
            install_output(qlog, bases, queue_dir / STAGING)
        finally:
            if store is not None:
                tier_round.remove_round(store, request["tier"]["prefix"])
        path.unlink()
        return time.perf_counter() - started
    finally:
        qlog.close()
        if store is not None:
            store.close()


def local_round(queue_dir: pathlib.Path, config: CompactionConfig, now_ms: int) -> tuple[float, int, float]:
    """The local engine's round: its seconds, passes and CPU seconds (this process's)."""
    qlog = QueueLog(queue_dir, config.segment_size_bytes, "kv", 0)
    try:
        started, cpu = time.perf_counter(), time.process_time()
        stats = run_round(qlog, config, now_ms)
        return time.perf_counter() - started, stats.passes, time.process_time() - cpu
    finally:
        qlog.close()


def differing(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    other = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    if names != other:
        return sorted(set(names) ^ set(other))
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return mismatch + errors


def memory_bytes(text: str) -> int:
    """Spark's memory notation (``512m``, ``1g``, ``768k``) in bytes."""
    return int(text[:-1]) * MEMORY_UNITS[text[-1].lower()]


def memory_arg(text: str) -> str:
    if len(text) < 2 or text[-1].lower() not in MEMORY_UNITS or not text[:-1].isdigit():
        raise argparse.ArgumentTypeError(f"a memory size such as 512m or 1g, not {text[:20]!r}")
    return text


def key_bytes_arg(text: str) -> int:
    value = int(text)
    if not KEY_PREFIX_BYTES <= value <= 4096:
        raise argparse.ArgumentTypeError(f"--key-bytes must be in [{KEY_PREFIX_BYTES}, 4096], not {value}")
    return value


def figures(args: argparse.Namespace, config: CompactionConfig, size: int, seconds: dict, passes: int,
            diff: list[str]) -> dict:
    """The JSON line: what ran, both engines' seconds, and what one executor would hold by itself (every
    key's bytes and its latest offset) against its whole heap."""
    held = args.keys * (args.key_bytes + OFFSET_BYTES)
    memory = memory_bytes(args.executor_memory)
    return {"master": args.master, "tier_url": args.tier_url, "records": args.records, "keys": args.keys,
            "key_bytes": args.key_bytes,
            "input_bytes": size, "generate_s": round(seconds["generate"], 1), "local_s": round(seconds["local"], 1),
            "local_passes": passes, "local_cpu_s": round(seconds["local_cpu"], 2),
            "local_cgroup_cpu_s": seconds["local_cgroup_cpu"], "spark_cgroup_cpu_s": seconds["spark_cgroup_cpu"],
            "local_map_bytes": config.offset_map_memory_bytes,
            "spark_s": round(seconds["spark"], 1), "executor_memory": args.executor_memory,
            "executor_memory_bytes": memory, "keys_and_offsets_bytes": held,
            "keys_and_offsets_over_executor_memory": round(held / memory, 3),
            "identical": not diff, "differing": diff[:10]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=pathlib.Path)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--key-bytes", type=key_bytes_arg, default=KEY_PREFIX_BYTES,
                        help=f"each key's length (default {KEY_PREFIX_BYTES}: key-<10 digits>, no padding)")
    parser.add_argument("--master", default=os.environ.get("MQSTORE_SPARK_MASTER", "local[2]"))
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--tier-url", default=os.environ.get("MQSTORE_SPARK_TIER_URL", ""),
                        help="run the round through this tier (file:///DIR or s3://BUCKET[/PREFIX]; default "
                             "MQSTORE_SPARK_TIER_URL; empty: the executors read the queue by its path)")
    parser.add_argument("--executor-memory", type=memory_arg, default="512m",
                        help="what the executors were given (reported)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    try:
        config = CompactionConfig(segment_size_bytes=args.segment_mib * MiB,
                                  offset_map_memory_bytes=(args.keys + 1) * ENTRY_COST_BYTES)
        started = time.perf_counter()
        size = generate(args.dir / "local" / "kv" / "0", args.records, args.keys, config.segment_size_bytes,
                        args.key_bytes)
        seconds = {"generate": time.perf_counter() - started}
        shutil.copytree(args.dir / "local", args.dir / "spark")
        now_ms = BASE_MS + args.records + 1
        before = cgroup_cpu_s()
        seconds["local"], passes, seconds["local_cpu"] = local_round(args.dir / "local" / "kv" / "0", config, now_ms)
        middle = cgroup_cpu_s()
        seconds["spark"] = spark_round(args.dir / "spark" / "kv" / "0", config, args.master, now_ms, args.tier_url)
        seconds["local_cgroup_cpu"] = _delta(before, middle)
        seconds["spark_cgroup_cpu"] = _delta(middle, cgroup_cpu_s())
        diff = differing(args.dir / "local", args.dir / "spark")
        print(json.dumps(figures(args, config, size, seconds, passes, diff)), flush=True)
        return 0 if not diff else 1
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
