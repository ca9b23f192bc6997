"""A round larger than an executor on a Spark cluster, checked against the local engine:
``python -m mqstore_spark.cluster_round --dir DIR --records N --keys K [--master URL]``.

``make compose-check-spark`` runs it in compose's compactor container (the driver), on the standalone
cluster (spark-master, spark-worker-1 and -2, executors of spark.executor.memory each), over a queue
under the shared volume so the executors find its segments and staging at the driver's paths:

  1. generate a sealed compaction log of N records over K keys (small bodies: many keys per byte), every
     tenth record of a key after its first a tombstone;
  2. copy it; run the local engine's round (mqstore.compaction.rounds.run_round, one pass: a map budget
     that holds every key) on one copy, and the Spark job (``python -m mqstore_spark.round_job``, as the
     compactor runs it) on the other, then install its output as the compactor does
     (mqstore.compaction.staged.install_output);
  3. compare every file of the two queue directories byte for byte (the consume-queue files included);
  4. print one JSON line: records, keys, input bytes, both engines' seconds, the keys' size at the
     local engine's cost per key against the executor memory, and whether the files are identical.
Exits 1 when they are not (or the job fails). The work directory is removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.qlog import QueueLog
from mqstore.compaction.qlog_files import STAGING
from mqstore.compaction.rounds import run_round
from mqstore.compaction.staged import install_output
from mqstore.format import record

MiB = 1 << 20
BASE_MS = 1_700_000_000_000


def generate(queue_dir: pathlib.Path, records: int, keys: int, segment_bytes: int, body_bytes: int = 16,
             seed: int = 7) -> int:
    """A sealed compaction log of ``records`` records over ``keys`` keys (each key at least once while
    records >= keys); its size in bytes."""
    qlog = QueueLog(queue_dir, segment_bytes, "kv", 0)
    topic, rng, written = record.topic_part(b"kv"), random.Random(seed), 0
    body = b"v" * body_bytes
    for offset in range(records):
        k = offset if offset < keys else rng.randrange(keys)
        key = f"key-{k:010d}"
        tombstone = offset >= keys and offset % 10 == 0
        parts: list[bytes] = []
        record.encode_parts(parts, topic, b"" if tombstone else body, record.encode_properties({"KEYS": key}),
                            0, 0, 0, 1, b"\x7f\0\0\1", 1, b"\x7f\0\0\1", 2, 0)
        raw = bytearray(b"".join(parts))
        record.stamp(raw, 0, offset, 0, BASE_MS + offset)
        qlog.append(bytes(raw), offset, 0, BASE_MS + offset, key)
        written += len(raw)
    qlog.seal_active()
    qlog.close()
    return written


def spark_round(queue_dir: pathlib.Path, config: CompactionConfig, master: str, now_ms: int) -> float:
    """The Spark job as the compactor runs it (a child process), its output installed; its seconds."""
    qlog = QueueLog(queue_dir, config.segment_size_bytes, "kv", 0)
    try:
        bases, _ = qlog.sealed()
        request = {"queue_dir": str(queue_dir), "bases": bases, "cleaned_offset": qlog.cleaned_offset,
                   "next_offset": qlog.next_offset(), "now_ms": now_ms, "config": dataclasses.asdict(config),
                   "staging": str(queue_dir / STAGING), "master": master}
        path = queue_dir.parent / ".0.spark-request.json"
        path.write_text(json.dumps(request))
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "mqstore_spark.round_job", str(path)], capture_output=True,
                              text=True, check=False, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
        if done.returncode != 0:
            raise RuntimeError(f"the Spark job failed (exit {done.returncode}): {done.stderr[-3000:]}")
        install_output(qlog, bases, queue_dir / STAGING)
        path.unlink()
        return time.perf_counter() - started
    finally:
        qlog.close()


def local_round(queue_dir: pathlib.Path, config: CompactionConfig, now_ms: int) -> tuple[float, int]:
    qlog = QueueLog(queue_dir, config.segment_size_bytes, "kv", 0)
    try:
        started = time.perf_counter()
        stats = run_round(qlog, config, now_ms)
        return time.perf_counter() - started, stats.passes
    finally:
        qlog.close()


def differing(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    other = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    if names != other:
        return sorted(set(names) ^ set(other))
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return mismatch + errors


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=pathlib.Path)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--master", default=os.environ.get("MQSTORE_SPARK_MASTER", "local[2]"))
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--executor-memory", default="512m", help="what the executors were given (reported)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    try:
        config = CompactionConfig(segment_size_bytes=args.segment_mib * MiB,
                                  offset_map_memory_bytes=(args.keys + 1) * ENTRY_COST_BYTES)
        started = time.perf_counter()
        size = generate(args.dir / "local" / "kv" / "0", args.records, args.keys, config.segment_size_bytes)
        generate_s = time.perf_counter() - started
        shutil.copytree(args.dir / "local", args.dir / "spark")
        now_ms = BASE_MS + args.records + 1
        local_s, passes = local_round(args.dir / "local" / "kv" / "0", config, now_ms)
        spark_s = spark_round(args.dir / "spark" / "kv" / "0", config, args.master, now_ms)
        diff = differing(args.dir / "local", args.dir / "spark")
        units = {"k": 1 << 10, "m": MiB, "g": 1 << 30}
        memory = int(args.executor_memory[:-1]) * units[args.executor_memory[-1].lower()]
        print(json.dumps({"master": args.master, "records": args.records, "keys": args.keys, "input_bytes": size,
                          "generate_s": round(generate_s, 1), "local_s": round(local_s, 1), "local_passes": passes,
                          "spark_s": round(spark_s, 1), "executor_memory": args.executor_memory,
                          "keys_at_local_map_cost_bytes": args.keys * ENTRY_COST_BYTES,
                          "keys_over_executor_memory": round(args.keys * ENTRY_COST_BYTES / memory, 2),
                          "identical": not diff, "differing": diff[:10]}), flush=True)
        return 0 if not diff else 1
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
