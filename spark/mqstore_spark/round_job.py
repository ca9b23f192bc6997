"""The compactor's heavy round on Spark: ``python -m mqstore_spark.round_job <request.json>``.

The compactor (holding the queue's round lock, so the sealed segments cannot change) writes the
request: the queue directory, its sealed segments' bases, the cleaned and next offsets, the round's
time (ms, the one clock of the round: tombstones are stamped and expired by it) and settings, a
staging directory and the Spark master. Nothing per key or per record crosses to the driver:

  1. the driver finds the dirty range in the sealed segments' index files, read in place (bisect over
     the files: O(segments) memory);
  2. Spark reads the sealed segments (the mqstore data source, one partition per segment, only the
     columns the plan needs) and marks a record *superseded* when a later record of its key lies in the
     dirty range: the latest offset per key is a window aggregate over the dirty records, computed on
     the executors (shuffled and spilled by Spark, never held by one process);
  3. one task per input segment (on an executor) decides its records with the rules every engine uses
     (mqstore.compaction.rounds.fate: superseded -> dropped, a tombstone past seen-at +
     delete_retention_ms -> dropped, its key noted, a tombstone first seen stamped) and, when the
     segment changes (rounds.changes: a record dropped or a tombstone stamped), writes the survivors
     to ``staging/parts/``: ``<base>.log`` (their raw bytes, in log order), ``<base>.cq`` (their index
     entries in the sparse queue format, positions within the part) and ``<base>.removed`` (JSON: key
     -> offset of the tombstones removed); the driver collects one row per segment (its counters and
     whether it changed);
  4. as the local engine, the round rewrites from the first segment that changes (``rewritten_from``,
     its base; the segments below are kept as they are): the driver streams, in segment order and one
     at a time, the part of each changed segment and the records of each unchanged one (read from the
     sealed segment itself: its part would be the same) through the project's one round writer
     (mqstore.compaction.writer.RoundWriter: positions, blank records and the index depend on the
     whole sequence), so its files are byte-identical to the local engine's, then writes
     ``round.manifest`` (inputs, ``rewritten_from``, outputs with sizes and CRC32s, a SHA-256 digest,
     the new round state, the keys whose tombstones it removed, its counters) and prints the Spark
     application's id as the last line of its stdout (the compactor logs it).
The compactor validates the manifest against the staged files and installs them in place of the sealed
segments from ``rewritten_from`` on with its usual swap.
Executors need the staging directory at the same path as the driver (compose: the shared volume).
"""

from __future__ import annotations

import bisect
import json
import os
import pathlib
import shutil
import sys

from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.rounds import RoundStats, changes, count, dirty_range, fate, key_and_tombstone
from mqstore.compaction.writer import RoundWriter, write_manifest
from mqstore.errors import invariant
from mqstore.format import compaction_segment as cseg, sparse_queue
from mqstore.format.sparse_queue import SparseEntry

PARTS = "parts"
COUNTERS = ("records_in", "records_out", "records_removed", "tombstones_removed", "tombstones_pending",
            "bytes_reclaimed")


def session(master: str, app: str = "mqstore-compaction"):
    """A SparkSession whose executors run this Python (set in the environment before the session starts:
    the builder's spark.pyspark.python alone does not reach them) and bind loopback by default."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from .datasource import MqstoreDataSource
    spark = (SparkSession.builder.master(master).appName(app).config("spark.ui.enabled", "false")
             .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(MqstoreDataSource)
    return spark


class OnDiskIndex:
    """The sealed segments' index entries, read in place from their ``.cq`` files (one pread per entry
    asked for): ``offsets`` and ``store_ms`` are sequences for :func:`rounds.dirty_range`'s bisects, so the
    driver never loads the index (O(records)) into memory."""

    def __init__(self, queue_dir: pathlib.Path, bases: list[int]):
        self.paths = [queue_dir / cseg.index_name(b) for b in bases]
        self.starts = [0]  # entry number of each file's first entry
        for path in self.paths:
            self.starts.append(self.starts[-1] + path.stat().st_size // sparse_queue.ENTRY_SIZE)
        self.offsets, self.store_ms = _Column(self, 4), _Column(self, 3)

    def __len__(self) -> int:
        return self.starts[-1]

    def field(self, i: int, field: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(i)
        n = bisect.bisect_right(self.starts, i) - 1
        with open(self.paths[n], "rb") as f:
            data = os.pread(f.fileno(), sparse_queue.ENTRY_SIZE, (i - self.starts[n]) * sparse_queue.ENTRY_SIZE)
        return sparse_queue.ENTRY.unpack(data)[field]


class _Column:
    def __init__(self, index: OnDiskIndex, field: int):
        self.index, self.field = index, field

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> int:
        return self.index.field(i, self.field)


def superseded_positions(spark, queue_dir: pathlib.Path, bases: list[int], cleaned: int, last: int):
    """A DataFrame (file, positions, keys), one row per segment file with keyed records up to ``last``: the
    positions of its records that a later record of their key in (cleaned, last] supersedes, and how many
    keys' latest dirty record it holds (their sum is the round's keys mapped). Computed on the executors."""
    from pyspark.sql import Window, functions as F
    files = ",".join(str(queue_dir / cseg.log_name(b)) for b in bases)
    offset, key = F.col("queue_offset"), F.col("key")
    records = (spark.read.format("mqstore").schema("file string, position long, queue_offset long, key string")
               .option("files", files).load()
               .where(key.isNotNull() & (offset <= last)))
    dirty_latest = F.max(F.when(offset > cleaned, offset)).over(Window.partitionBy("key"))
    latest = F.col("latest")
    return (records.withColumn("latest", dirty_latest).where(latest.isNotNull())
            .groupBy("file").agg(F.collect_list(F.when(offset < latest, F.col("position"))).alias("positions"),
                                 F.sum(F.when(offset == latest, 1).otherwise(0)).alias("keys")))


def rewrite_segment(request: dict, base: int, superseded: list[int] | None, last: int) -> dict:
    """(On an executor.) Decide one sealed segment's records; if it changes, write its part into
    ``staging/parts/``; its counters and whether it changed."""
    config = CompactionConfig(**request["config"])
    queue_dir, parts = pathlib.Path(request["queue_dir"]), pathlib.Path(request["staging"]) / PARTS
    now_ms, drop = request["now_ms"], set(superseded or ())
    data = (queue_dir / cseg.log_name(base)).read_bytes()
    entries, _ = sparse_queue.decode_all((queue_dir / cseg.index_name(base)).read_bytes())
    stats, log, cq, changed = RoundStats(), bytearray(), bytearray(), False
    for entry in entries:
        at = entry.position - base
        raw = memoryview(data)[at:at + entry.size]
        key, tombstone = key_and_tombstone(raw)
        what, seen = fate(key is not None and entry.queue_offset <= last, entry.position in drop, tombstone,
                          entry.tombstone_seen_ms, now_ms, config)
        changed = changed or changes(what, entry.tombstone_seen_ms)
        if count(stats, what, entry.size, key, entry.queue_offset):
            cq += sparse_queue.encode(SparseEntry(len(log), entry.size, entry.tag_code, entry.store_timestamp_ms,
                                                  entry.queue_offset, seen))
            log += raw
    invariant(stats.records_removed == len(drop), f"every superseded record of segment {base} is in its index")
    if changed:
        for suffix, content in ((".log", log), (".cq", cq), (".removed", json.dumps(stats.removed_keys).encode())):
            (parts / f"{base:020d}{suffix}").write_bytes(content)
    return {"base": base, "changed": changed, **{k: getattr(stats, k) for k in COUNTERS}}


def run(spark, request: dict) -> dict:
    """One Spark pass over the request's sealed segments; the manifest (also written to staging)."""
    config = CompactionConfig(**request["config"])
    queue_dir, bases = pathlib.Path(request["queue_dir"]), request["bases"]
    cleaned, now_ms = request["cleaned_offset"], request["now_ms"]
    index = OnDiskIndex(queue_dir, bases)
    lo, hi = dirty_range(index, cleaned, now_ms, config)
    last = index.offsets[hi - 1] if hi > lo else cleaned  # the new cleaned offset
    staging = pathlib.Path(request["staging"])
    shutil.rmtree(staging, ignore_errors=True)
    (staging / PARTS).mkdir(parents=True)
    segments = spark.createDataFrame([(str(queue_dir / cseg.log_name(b)), b) for b in bases], "file string, base long")
    if hi > lo:
        segments = segments.join(superseded_positions(spark, queue_dir, bases, cleaned, last), "file", "left")
    else:
        segments = segments.selectExpr("file", "base", "CAST(NULL AS ARRAY<LONG>) AS positions", "0L AS keys")
    tasks = segments.select("base", "positions", "keys").repartition(max(1, len(bases)))
    rows = tasks.rdd.map(lambda row: {**rewrite_segment(request, row["base"], row["positions"], last),
                                      "keys": row["keys"] or 0}).collect()  # O(segments) rows
    invariant(sorted(r["base"] for r in rows) == sorted(bases), "one task per input segment")
    rows.sort(key=lambda r: r["base"])
    stats = RoundStats(passes=1, keys_mapped=sum(r["keys"] for r in rows))
    for row in rows:
        for name in COUNTERS:
            setattr(stats, name, getattr(stats, name) + row[name])
    first = next((n for n, row in enumerate(rows) if row["changed"]), len(rows))
    start = bases[first] if first < len(bases) else (bases[-1] + config.segment_size_bytes if bases else 0)
    stats.rewritten_from, stats.records_rewritten = start, sum(row["records_out"] for row in rows[first:])
    state = {"cleaned_offset": last, "next_offset": request["next_offset"]}
    writer = RoundWriter(staging, config.segment_size_bytes, start)
    for row in rows[first:]:  # in log order through the one writer, one segment in memory at a time
        _stream(writer, row, queue_dir, staging / PARTS / f"{row['base']:020d}", stats)
    _, manifest = writer.finish(state)
    shutil.rmtree(staging / PARTS)
    invariant(manifest["rewritten_from"] == start, "the writer starts where the first changed segment did")
    manifest.update(inputs=bases, state=state, removed_keys=stats.removed_keys,
                    stats={k: getattr(stats, k) for k in ("passes", "keys_mapped", "records_removed",
                                                          "tombstones_removed", "tombstones_pending",
                                                          "bytes_reclaimed", "records_rewritten",
                                                          "rewritten_from")})
    write_manifest(staging, manifest)
    return manifest


def _stream(writer: RoundWriter, row: dict, queue_dir: pathlib.Path, part: pathlib.Path, stats: RoundStats) -> None:
    """One segment's survivors into the writer: its part if it changed, else its own records (the same)."""
    if row["changed"]:
        log, shift = part.with_suffix(".log").read_bytes(), 0
        index = part.with_suffix(".cq").read_bytes()
        stats.removed_keys.update(json.loads(part.with_suffix(".removed").read_bytes()))
    else:
        log, shift = (queue_dir / cseg.log_name(row["base"])).read_bytes(), row["base"]
        index = (queue_dir / cseg.index_name(row["base"])).read_bytes()
    for entry in sparse_queue.decode_all(index)[0]:
        at = entry.position - shift
        writer.add(memoryview(log)[at:at + entry.size], entry.queue_offset, entry.tag_code,
                   entry.store_timestamp_ms, entry.tombstone_seen_ms)


def main(argv: list[str]) -> int:
    request = json.loads(pathlib.Path(argv[0]).read_text())
    spark = session(request["master"])
    try:
        from mqstore_spark.round_job import run as job  # by its module name: the tasks' functions are
        job(spark, request)                              # pickled by reference, not as __main__'s
        print(spark.sparkContext.applicationId, flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
