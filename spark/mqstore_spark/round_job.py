"""The compactor's heavy round on Spark: ``python -m mqstore_spark.round_job <request.json>``.

The compactor (holding the queue's round lock, so the sealed segments cannot change) writes the
request: the queue directory, its sealed segments' bases, the cleaned and next offsets, the round's
time and settings, a staging directory and the Spark master. The job:
  1. reads the sealed segments with the mqstore data source (one partition per segment), and computes
     the latest queue offset per compaction key over the dirty range (no memory budget: one pass);
  2. rewrites the survivors with the project's one round writer (mqstore.compaction.rounds.write_pass),
     so its files are byte-identical to the local engine's;
  3. writes ``round.manifest`` (inputs, outputs with sizes and CRC32s, a SHA-256 digest, the new round
     state, the keys whose tombstones it removed, its counters).
The compactor validates the manifest against the staged files and installs them with its usual swap.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from mqstore.compaction.offset_map import ENTRY_COST_BYTES, OffsetMap, digest
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.qlog import Entries
from mqstore.compaction.rounds import RoundStats, Sealed, dirty_range, write_pass
from mqstore.compaction.writer import write_manifest
from mqstore.format import compaction_segment as cseg, sparse_queue


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


def load_sealed(queue_dir: pathlib.Path, segment_size: int, bases: list[int]) -> Sealed:
    entries = Entries()
    for base in bases:
        for entry in sparse_queue.decode_all((queue_dir / cseg.index_name(base)).read_bytes())[0]:
            entries.add(entry)
    return Sealed(queue_dir, segment_size, bases, entries)


def spark_map(spark, src: Sealed, cleaned: int, last: int) -> OffsetMap:
    """key digest -> latest queue offset over (cleaned, last], computed by Spark."""
    from pyspark.sql import functions as F
    files = ",".join(str(src.directory / cseg.log_name(b)) for b in src.bases)
    rows = (spark.read.format("mqstore").option("files", files).load()
            .where((F.col("queue_offset") > cleaned) & (F.col("queue_offset") <= last) & F.col("key").isNotNull())
            .groupBy("key").agg(F.max("queue_offset").alias("latest")).collect())
    omap = OffsetMap((len(rows) + 1) * ENTRY_COST_BYTES)
    for row in rows:
        omap.put(digest(row["key"]), row["latest"])
    omap.last_offset = last
    return omap


def run(spark, request: dict) -> dict:
    """One Spark pass over the request's sealed segments; the manifest (also written to staging)."""
    config = CompactionConfig(**request["config"])
    src = load_sealed(pathlib.Path(request["queue_dir"]), config.segment_size_bytes, request["bases"])
    cleaned, now_ms = request["cleaned_offset"], request["now_ms"]
    lo, hi = dirty_range(src.entries, cleaned, now_ms, config)
    if hi > lo:
        omap = spark_map(spark, src, cleaned, src.entries.offsets[hi - 1])
    else:
        omap = OffsetMap(ENTRY_COST_BYTES)
    stats = RoundStats()
    staging = pathlib.Path(request["staging"])
    _, manifest = write_pass(src, lo, hi, cleaned, request["next_offset"], omap, now_ms, config, stats, staging)
    manifest.update(inputs=request["bases"], state=stats.last_state, removed_keys=stats.removed_keys,
                    stats={k: getattr(stats, k) for k in ("passes", "keys_mapped", "records_removed",
                                                          "tombstones_removed", "tombstones_pending",
                                                          "bytes_reclaimed")})
    write_manifest(staging, manifest)
    return manifest


def main(argv: list[str]) -> int:
    request = json.loads(pathlib.Path(argv[0]).read_text())
    spark = session(request["master"])
    try:
        run(spark, request)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
