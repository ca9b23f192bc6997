"""The compactor's heavy round on Spark: ``python -m mqstore_spark.round_job <request.json>``.

The compactor (holding the queue's round lock, so the sealed segments cannot change) writes the
request: the queue directory, its sealed segments' bases, the cleaned and next offsets, the round's
time (ms, the one clock of the round: tombstones are stamped and expired by it) and settings, a
staging directory and the Spark master. Nothing per key or per record crosses to the driver:

  1. the driver finds the dirty range in the sealed segments' index files, read in place (bisect over
     the files: O(segments) memory);
  2. each executor task reads sealed segments (mapInArrow over their bases, ``keyed_records``): the
     entries from the ``.cq`` file as numpy columns, the key's digest and tombstone flag of each record up
     to ``last`` from one call of the compiled codec per segment (rounds.segment_keys), and ships an Arrow
     batch per segment of fixed-width columns (entry number int32, queue offset int64, the key's MD5
     digest as 16 bytes, the tombstone flag); Spark marks a record *superseded* when a later record of
     its key lies in the dirty range: the latest offset per digest is a window aggregate over the dirty
     records, computed on the executors (shuffled and spilled by Spark, never held by one process), and
     each segment's marks (superseded and tombstone entry numbers, the keys it holds the latest record
     of) are collected into one row per segment;
  3. per segment's marks (on an executor, mapInArrow again; a task takes several segments, one at a
     time: two tasks per executor core) the executor decides its records with the rules
     every engine uses (mqstore.compaction.rounds.fate, on numpy columns: superseded -> dropped, a
     tombstone past seen-at + delete_retention_ms -> dropped, its key noted, a tombstone first seen
     stamped) and, when the segment changes (rounds.changes: a record dropped or a tombstone stamped),
     writes the survivors to ``staging/parts/``: ``<base>.log`` (their raw bytes, in log order), ``<base>.cq``
     (their index entries in the sparse queue format, positions within the part) and ``<base>.removed``
     (JSON: key -> offset of the tombstones removed); the driver collects one row per segment (its
     counters and whether it changed);
  4. as the local engine, the round rewrites from the first segment that changes (``rewritten_from``,
     its base; the segments below are kept as they are): the driver streams, in segment order and one
     at a time, the part of each changed segment and the records of each unchanged one (read from the
     sealed segment itself: its part would be the same) through the project's one round writer
     (mqstore.compaction.writer.RoundWriter: positions, blank records and the index depend on the
     whole sequence; a run of records per output segment, packed and relocated on numpy columns by
     RoundWriter.add's rule: ``add_relocated``), so its files are byte-identical to the local engine's, then
     writes ``round.manifest`` (inputs, ``rewritten_from``, outputs with sizes and CRC32s, a SHA-256 digest,
     the new round state, the keys whose tombstones it removed, its counters) and prints the Spark
     application's id as the last line of its stdout (the compactor logs it).
No Python object is made per record (step 2's keys are hashed in C; a key that is not ASCII is decoded and
encoded as rounds.compaction_fields does, an object for that key only).
The compactor validates the manifest against the staged files and installs them in place of the sealed
segments from ``rewritten_from`` on with its usual swap.
Where the segments, parts and output are is the request's choice (mqstore_spark.round_files): with
``queue_dir`` and ``staging`` the executors need the staging directory at the same path as the driver (a
shared volume); with ``tier`` (the compactor's --spark-tier-url) the sealed segments are objects under the
round's prefix, read by range GETs, and the executors' parts and the driver's output and manifest are
objects under it too (mqstore.compaction.tier_round): no directory is shared.
"""

from __future__ import annotations

import bisect
import json
import os
import pathlib
import sys
import warnings

from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.rounds import RoundStats, dirty_range, key_and_tombstone
from mqstore.compaction import tier_round
from mqstore.compaction.writer import MANIFEST, RoundWriter, write_manifest
from mqstore.errors import invariant
from mqstore.format import sparse_queue
from mqstore.format.record import PHYSICAL_OFFSET_AT

from .round_files import files_of

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
    """The sealed segments' index entries, read in place from their ``.cq`` files or objects (one pread or
    range GET per entry asked for): ``offsets`` and ``store_ms`` are sequences for :func:`rounds.dirty_range`'s
    bisects, so the driver never loads the index (O(records)) into memory."""

    def __init__(self, files, bases: list[int]):
        self.files, self.bases = files, bases
        self.starts = [0]  # entry number of each file's first entry
        for base in bases:
            self.starts.append(self.starts[-1] + files.index_size(base) // sparse_queue.ENTRY_SIZE)
        self.offsets, self.store_ms = _Column(self, 4), _Column(self, 3)

    def __len__(self) -> int:
        return self.starts[-1]

    def field(self, i: int, field: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(i)
        n = bisect.bisect_right(self.starts, i) - 1
        data = self.files.index_entry(self.bases[n], i - self.starts[n])
        return sparse_queue.ENTRY.unpack(data)[field]


class _Column:
    def __init__(self, index: OnDiskIndex, field: int):
        self.index, self.field = index, field

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> int:
        return self.index.field(i, self.field)


ENTRY_DTYPE = [("position", ">i8"), ("size", ">i4"), ("tag_code", ">i8"), ("store_ms", ">i8"), ("queue_offset", ">i8"),
               ("batch", ">i2"), ("seen", ">i8")]  # mqstore.format.sparse_queue.ENTRY as a numpy record (46 bytes)
KEYED = "base long, entry int, queue_offset long, digest binary, tombstone boolean"
SEGMENT = ("base long, changed boolean, " + ", ".join(f"{name} long" for name in COUNTERS) + ", keys long, "
           "part string")  # part: the attempt that wrote the segment's part (round_files.new_attempt)
_SECONDS_MASK = 0xFFFF_FFFF
TASKS_PER_CORE = 2


def read_index(source: pathlib.Path | bytes):
    """The valid entries of one ``.cq`` file (or its bytes) as a numpy record array (ENTRY_DTYPE), seen-at in ms
    (layout 1's seconds converted): what sparse_queue.decode_all gives, as columns."""
    import numpy as np
    data = source.read_bytes() if isinstance(source, pathlib.Path) else source
    entries = np.frombuffer(data, dtype=np.dtype(ENTRY_DTYPE), count=len(data) // sparse_queue.ENTRY_SIZE)
    bad = np.flatnonzero((entries["position"] < 0) | (entries["size"] <= 0) | (entries["queue_offset"] < 0)
                         | (entries["batch"] != 1))
    entries = entries[:bad[0]].copy() if bad.size else entries.copy()
    old = entries["seen"] < 0
    if old.any():
        entries["seen"][old] = (entries["seen"][old] & _SECONDS_MASK) * 1000
    return entries


def map_in_arrow(frame, fn, schema: str):
    """``frame.mapInArrow(fn, schema)``, without the warning pyspark's pandas_udf gives for pandas >= 3 (on the
    driver, at planning): mapInArrow hands the function pyarrow batches and never uses pandas."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
        return frame.mapInArrow(fn, schema)


def keyed_records(request: dict, last: int):
    """(On an executor, mapInArrow over the segments' bases.) Arrow batches of a segment's keyed records at or
    below ``last``, one per segment: its base, the entry's number in the segment, the queue offset, the MD5
    digest of the key (16 bytes) and the tombstone flag; the keys from the compiled codec. The segments are
    read where the request says (round_files: paths, or range GETs of the tier's objects)."""
    def records(batches):
        with files_of(request) as files:
            for batch in batches:
                for base in batch.column("base").to_pylist():
                    yield _keyed_batch(files, base, last)
    return records


PAIRS_DTYPE = [("digest", "V16"), ("entry", "<i8")]  # offset_map.PAIR as numpy columns


def _keyed_batch(files, base: int, last: int):
    """One segment's keyed records up to ``last`` as one Arrow batch: the keys' digests and entry numbers from
    one call of the compiled walk (rounds.segment_keys), no Python object per record."""
    import numpy as np
    import pyarrow as pa
    from mqstore.compaction.rounds import segment_keys
    entries = read_index(files.index(base))
    n = int(np.searchsorted(entries["queue_offset"], last, side="right"))
    positions = np.ascontiguousarray(entries["position"][:n], dtype=np.int64)
    sizes = np.ascontiguousarray(entries["size"][:n], dtype=np.int32)
    (pairs,), tombstones = segment_keys(memoryview(files.log(base)), positions, sizes, base, 0, 1)
    columns = np.frombuffer(pairs, dtype=np.dtype(PAIRS_DTYPE))
    count, numbers = len(columns), columns["entry"]
    flags = np.zeros(count, dtype=bool)
    flags[np.searchsorted(numbers, np.frombuffer(tombstones, dtype=np.int64))] = True  # both in log order
    digests = pa.Array.from_buffers(pa.binary(), count, [
        None, pa.py_buffer(np.arange(0, 16 * count + 1, 16, dtype=np.int32)),
        pa.py_buffer(np.ascontiguousarray(columns["digest"]).view(np.uint8))])
    return pa.RecordBatch.from_arrays(
        [pa.array(np.full(count, base, dtype=np.int64)), pa.array(numbers.astype(np.int32)),
         pa.array(entries["queue_offset"][numbers].astype(np.int64)), digests, pa.array(flags)],
        names=["base", "entry", "queue_offset", "digest", "tombstone"])


def segment_marks(spark, segments, request: dict, cleaned: int, last: int):
    """A DataFrame (base, superseded, tombstones, keys), one row per segment with keyed records up to ``last``:
    the entry numbers of its records that a later record of their key in (cleaned, last] supersedes, of its
    keyed tombstones, and how many keys' latest dirty record it holds (their sum is the round's keys
    mapped). Computed on the executors, on fixed-width columns (the keys' digests, int64 offsets)."""
    from pyspark.sql import Window, functions as F
    offset, latest, entry = F.col("queue_offset"), F.col("latest"), F.col("entry")
    records = map_in_arrow(segments.select("base"), keyed_records(request, last), KEYED)
    dirty_latest = F.max(F.when(offset > cleaned, offset)).over(Window.partitionBy("digest"))
    return (records.withColumn("latest", dirty_latest).groupBy("base")
            .agg(F.collect_list(F.when(offset < latest, entry)).alias("superseded"),
                 F.collect_list(F.when(F.col("tombstone"), entry)).alias("tombstones"),
                 F.sum(F.when(offset == latest, 1).otherwise(0)).alias("keys")))


def rewrite_segments(request: dict, last: int):
    """(On an executor, mapInArrow over the segments' marks.) One row per segment: :func:`rewrite_segment`'s."""
    def rewrite(batches):
        with files_of(request) as files:
            for batch in batches:
                yield _rewritten(files, request, batch, last)
    return rewrite


def _rewritten(files, request: dict, batch, last: int):
    import numpy as np
    import pyarrow as pa
    rows = []
    for i, base in enumerate(batch.column("base").to_pylist()):
        marks = [np.asarray(batch.column(name)[i].values if batch.column(name)[i].is_valid else [],
                            dtype=np.int64) for name in ("superseded", "tombstones")]
        keys = batch.column("keys")[i].as_py() or 0
        rows.append({**rewrite_segment(files, request, base, *marks, last), "keys": keys})
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([("base", pa.int64()), ("changed", pa.bool_())] + [
        (name, pa.int64()) for name in COUNTERS + ("keys",)] + [("part", pa.string())]))


def rewrite_segment(files, request: dict, base: int, superseded, tombstones, last: int) -> dict:
    """(On an executor.) Decide one sealed segment's records by their marks (entry numbers: ``superseded``, and
    its keyed ``tombstones`` at or below ``last``) with the rules of rounds.fate on numpy columns; if it
    changes, write its part (round_files: ``staging/parts/`` or the tier's ``parts/``); its counters and
    whether it changed."""
    import numpy as np
    config = CompactionConfig(**request["config"])
    now_ms = request["now_ms"]
    entries = read_index(files.index(base))
    n = len(entries)
    removed, tombstone = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    removed[superseded] = True
    tombstone[tombstones] = True
    tombstone &= ~removed
    seen_before = entries["seen"].astype(np.int64)
    seen = np.where(tombstone & (seen_before == 0), now_ms, seen_before)  # stamped by the round that maps it
    expired = tombstone & (seen > 0) & (now_ms >= seen + config.delete_retention_ms)  # policy.tombstone_expired
    pending = tombstone & ~expired
    kept = ~(removed | expired)
    sizes = entries["size"].astype(np.int64)
    changed = bool(removed.any() or expired.any() or (pending & (seen_before == 0)).any())
    invariant(int(removed.sum()) == len(superseded), f"every superseded record of segment {base} is in its index")
    removed_keys: dict = {}
    stats = {"records_in": n, "records_out": int(kept.sum()), "records_removed": int(removed.sum()),
             "tombstones_removed": int(expired.sum()), "tombstones_pending": int(pending.sum()),
             "bytes_reclaimed": int(sizes[~kept].sum())}
    if changed:
        data = files.log(base)
        positions = entries["position"].astype(np.int64) - base
        for i in np.flatnonzero(expired).tolist():  # the keys of the tombstones removed, in log order
            removed_keys[key_and_tombstone(memoryview(data)[positions[i]:positions[i] + sizes[i]])[0]] = \
                int(entries["queue_offset"][i])
        survivors = entries[kept]
        survivors["seen"] = seen[kept]
        survivors["position"] = np.cumsum(sizes[kept]) - sizes[kept]  # positions within the part
        part = files.new_attempt()  # a task retried by Spark writes a part of its own, never over another's
        files.put_part(base, part, ".log", _gather(data, positions[kept], sizes[kept]))
        files.put_part(base, part, ".cq", survivors.tobytes())
        files.put_part(base, part, ".removed", json.dumps(removed_keys).encode())
    return {"base": base, "changed": changed, **stats, "part": part if changed else ""}


def _gather(data: bytes, starts, sizes) -> bytes:
    """The records at ``starts`` (``sizes`` each) of ``data``, concatenated: one copy per run of adjacent
    records."""
    import numpy as np
    if len(starts) == 0:
        return b""
    breaks = np.flatnonzero(starts[1:] != starts[:-1] + sizes[:-1]) + 1
    run_starts = np.concatenate(([0], breaks)).tolist()
    run_ends = np.concatenate((breaks, [len(starts)])).tolist()
    view = memoryview(data)
    return b"".join(view[starts[a]:starts[b - 1] + sizes[b - 1]] for a, b in zip(run_starts, run_ends, strict=True))


def run(spark, request: dict) -> dict:
    """One Spark pass over the request's sealed segments; the manifest (also written to staging, or put as the
    round's last output object in the tier)."""
    if "tier" in request:  # the tasks reach the tier with the job's credentials (never in the request file)
        request = {**request, "tier": tier_round.with_credentials(request["tier"], os.environ)}
    with files_of(request) as files:
        return _run(spark, request, files)


def _run(spark, request: dict, files) -> dict:
    config = CompactionConfig(**request["config"])
    bases, cleaned = request["bases"], request["cleaned_offset"]
    index = OnDiskIndex(files, bases)
    lo, hi = dirty_range(index, cleaned, request["now_ms"], config)
    last = index.offsets[hi - 1] if hi > lo else cleaned  # the new cleaned offset
    staging = files.start()
    # segments spread over TASKS_PER_CORE tasks per executor core, not a task per segment: a task costs the
    # executors a fixed share of CPU (scheduling, a Python worker's round trip, Arrow streams) that a task
    # per segment made grow with the round (each task still holds one segment at a time)
    tasks = max(1, min(len(bases), TASKS_PER_CORE * spark.sparkContext.defaultParallelism))
    segments = spark.createDataFrame([(b,) for b in bases], "base long").repartition(tasks)
    marks = segments.join(segment_marks(spark, segments, request, cleaned, last), "base", "left")
    rows = [row.asDict() for row in map_in_arrow(marks.repartition(tasks), rewrite_segments(request, last), SEGMENT)
            .collect()]  # O(segments) rows
    invariant(sorted(r["base"] for r in rows) == sorted(bases), "one row per input segment")
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
        _stream(writer, row, files, stats)
    _, manifest = writer.finish(state)
    files.drop_parts(bases)
    invariant(manifest["rewritten_from"] == start, "the writer starts where the first changed segment did")
    manifest.update(inputs=bases, state=state, removed_keys=stats.removed_keys,
                    stats={k: getattr(stats, k) for k in ("passes", "keys_mapped", "records_removed",
                                                          "tombstones_removed", "tombstones_pending",
                                                          "bytes_reclaimed", "records_rewritten",
                                                          "rewritten_from")})
    write_manifest(staging, manifest)
    files.publish([out["name"] for out in manifest["outputs"]] + [MANIFEST])
    return manifest


def _stream(writer: RoundWriter, row: dict, files, stats: RoundStats) -> None:
    """One segment's survivors into the writer: its part if it changed, else its own records (the same); packed
    and relocated on numpy columns, a run of records per output segment (RoundWriter.add's rule)."""
    import numpy as np
    base = row["base"]
    if row["changed"]:
        part = row["part"]
        log, shift, index = files.part(base, part, ".log"), 0, files.part(base, part, ".cq")
        stats.removed_keys.update(json.loads(files.part(base, part, ".removed")))
    else:
        log, shift, index = files.log(base), base, files.index(base)
    entries = read_index(index)
    sizes = entries["size"].astype(np.int64)
    starts = entries["position"].astype(np.int64) - shift
    ends = np.cumsum(sizes)  # of the records packed one after the other
    done, n = 0, len(entries)
    while done < n:
        taken = ends[done - 1] if done else 0
        k = int(np.searchsorted(ends[done:], taken + writer.room(), side="right"))
        if k == 0:
            if writer.position % writer.segment_size:
                writer.seal()
                continue
            k = 1  # larger than an empty segment: RoundWriter.add puts it there all the same
            raw = memoryview(log)[starts[done]:starts[done] + sizes[done]]
            e = entries[done]
            writer.add(raw, int(e["queue_offset"]), int(e["tag_code"]), int(e["store_ms"]), int(e["seen"]))
            done += 1
            continue
        run = entries[done:done + k].copy()
        local = ends[done:done + k] - sizes[done:done + k] - taken  # the records' starts within the run
        run["position"] = writer.position + local
        out = np.frombuffer(bytearray(_gather(log, starts[done:done + k], sizes[done:done + k])), dtype=np.uint8)
        at = (local + PHYSICAL_OFFSET_AT)[:, None] + np.arange(8)
        out[at] = run["position"].astype(">i8").view(np.uint8).reshape(-1, 8)  # cseg.relocate, per record
        writer.add_relocated(out.data, run.tobytes(), {
            "offsets": run["queue_offset"].astype(np.int64).tobytes(),
            "positions": run["position"].astype(np.int64).tobytes(),
            "store_ms": run["store_ms"].astype(np.int64).tobytes(), "sizes": run["size"].astype(np.int32).tobytes(),
            "tags": run["tag_code"].astype(np.int64).tobytes(), "seen": run["seen"].astype(np.int64).tobytes()})
        done += k


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
