"""The compactor's heavy round on Spark: ``python -m mqstore_spark.round_job <request.json>``.

The compactor (holding the queue's round lock, so the sealed segments cannot change) writes the
request: the queue directory, its sealed segments' bases, the cleaned and next offsets, the round's
time (ms, the one clock of the round: tombstones are stamped and expired by it) and settings, a
staging directory and the Spark master. Nothing per key or per record crosses to the driver:

  1. the driver finds the dirty range in the sealed segments' index files, read in place (bisect over
     the files: O(segments) memory);
  2. each executor task reads sealed segments (mapInArrow over their bases): the entries from the ``.cq`` file
     as numpy columns, the key's digest (MD5, 16 bytes) of each record up to ``last`` from one call of the
     compiled codec per segment (rounds.segment_keys); per segment it keeps each key once, split into the keys
     with a record in (cleaned, last] in it and those with older records only, and ships per bucket of keys
     one row holding them as one binary (16 bytes a key): Spark's shuffle moves a few large values per
     segment, never a row per record or key. Partitioned by bucket (every row of a key in one task), a second
     mapInArrow finds each key's last segment with a dirty record (its latest dirty record is there): in every
     earlier segment all the key's records are superseded. Its rows, per segment: the digests so superseded
     (one binary) and how many keys' latest dirty record the segment holds; grouped into one row per segment;
  3. per segment's marks (on an executor, mapInArrow again; a task takes several segments, one at a
     time: two tasks per executor core) the executor walks the segment's keys again (the compiled walk is
     cheaper than shipping them), marks superseded the records of its keys that a later segment supersedes
     and those below the segment's own latest dirty record of their key (numpy on the digests and offsets),
     and decides its records with the rules every engine uses (mqstore.compaction.rounds.fate, on numpy
     columns: superseded -> dropped, a tombstone past seen-at + delete_retention_ms -> dropped, its key noted,
     a tombstone first seen stamped) and, when the segment changes (rounds.changes: a record dropped or a
     tombstone stamped), writes the survivors to ``staging/parts/``: ``<base>.log`` (their raw bytes, in log
     order), ``<base>.cq`` (their index entries in the sparse queue format, positions within the part) and
     ``<base>.removed`` (JSON: key -> offset of the tombstones removed); the driver collects one row per
     segment (its counters and whether it changed);
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
No Python object is made per record (the keys are hashed in C; a key that is not ASCII is decoded and
encoded as rounds.compaction_fields does, an object for that key only), and Spark's JVM handles no row per
record or key.
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


PAIRS_DTYPE = [("digest", "V16"), ("entry", "<i8")]  # offset_map.PAIR as numpy columns
DIGESTS = "bucket int, base long, dirty binary, clean binary"  # step 2a's rows: a segment's keys in a bucket
GONE = "base long, gone binary, keys long"  # step 2b's rows: a segment's keys that a later segment supersedes
PAIRS_PER_BUCKET = 1_000_000  # step 2b sorts one bucket's (key, segment) pairs at a time (~60 bytes each)


def _segment_keys(files, base: int, last: int):
    """A segment's index entries, its log's bytes, and its keyed records up to ``last``: their keys' digests
    (numpy ``S16``: 16 bytes, compared as bytes), entry numbers (int64) and queue offsets (int64), in log
    order, from one call of the compiled walk (rounds.segment_keys), and its keyed tombstones' entry numbers;
    no Python object per record."""
    import numpy as np
    from mqstore.compaction.rounds import segment_keys
    entries, data = read_index(files.index(base)), files.log(base)
    n = int(np.searchsorted(entries["queue_offset"], last, side="right"))
    positions = np.ascontiguousarray(entries["position"][:n], dtype=np.int64)
    sizes = np.ascontiguousarray(entries["size"][:n], dtype=np.int32)
    (pairs,), tombstones = segment_keys(memoryview(data), positions, sizes, base, 0, 1)
    columns = np.frombuffer(pairs, dtype=np.dtype(PAIRS_DTYPE))
    digests = np.ascontiguousarray(columns["digest"]).view("S16")
    numbers = columns["entry"].astype(np.int64)
    return entries, data, digests, numbers, entries["queue_offset"][numbers].astype(np.int64), \
        np.frombuffer(tombstones, dtype=np.int64)


def _bucket_of(keys, buckets: int):
    """The bucket of each digest (sorted ``S16``): (its first 4 bytes big-endian x buckets) >> 32, as
    rounds.segment_keys buckets them; non-decreasing for sorted digests."""
    import numpy as np
    first = np.frombuffer(keys.tobytes(), dtype=">u4").reshape(-1, 4)[:, 0].astype(np.uint64) if len(keys) else \
        np.zeros(0, dtype=np.uint64)
    return (first * np.uint64(buckets)) >> np.uint64(32)


def segment_digests(request: dict, cleaned: int, last: int, buckets: int):
    """(On an executor, mapInArrow over the segments' bases.) Per segment and bucket, one row: the sorted,
    distinct digests of the keys that have a record in (cleaned, last] in the segment (``dirty``) and of those
    that have records only at or below ``cleaned`` in it (``clean``), each a binary of 16 bytes per key: what
    crosses Spark's shuffle is a few large values per segment, never a row per record or key."""
    def digests(batches):
        with files_of(request) as files:
            for batch in batches:
                for base in batch.column("base").to_pylist():
                    _, _, keys, _, offsets, _ = _segment_keys(files, base, last)
                    yield digest_rows(base, keys, offsets, cleaned, buckets)
    return digests


def _by_key(keys, offsets):
    """A segment's keyed records grouped by key: the order that sorts them by (key, offset), and in that order
    each key's last (latest) record's index and each key's record count."""
    import numpy as np
    order = np.lexsort((offsets, keys))
    ordered = keys[order]
    ends = np.append(np.flatnonzero(ordered[1:] != ordered[:-1]), len(ordered) - 1) if len(ordered) else \
        np.zeros(0, dtype=np.int64)
    return order, ends, np.diff(np.concatenate(([-1], ends)))


def digest_rows(base: int, keys, offsets, cleaned: int, buckets: int):
    """:func:`segment_digests`' Arrow batch for one segment's keyed records (``keys`` S16, ``offsets``)."""
    import pyarrow as pa
    import numpy as np
    order, ends, _ = _by_key(keys, offsets)
    distinct, latest = keys[order[ends]], offsets[order[ends]]  # sorted
    dirty, clean = distinct[latest > cleaned], distinct[latest <= cleaned]
    cuts = [np.searchsorted(_bucket_of(k, buckets), np.arange(buckets + 1)) for k in (dirty, clean)]
    rows = [b for b in range(buckets) if cuts[0][b] < cuts[0][b + 1] or cuts[1][b] < cuts[1][b + 1]]
    return pa.RecordBatch.from_arrays(
        [pa.array(rows, type=pa.int32()), pa.array([base] * len(rows), type=pa.int64())]
        + [pa.array([k[c[b]:c[b + 1]].tobytes() for b in rows], type=pa.binary())
           for k, c in ((dirty, cuts[0]), (clean, cuts[1]))],
        names=["bucket", "base", "dirty", "clean"])


def superseded_keys(batches):
    """(On an executor, mapInArrow over step 2a's rows, partitioned by bucket: every row of a key is in one
    task.) A key's latest dirty record is in the last segment with a dirty record of it: in every earlier
    segment all its records are superseded. One row per segment: the digests of its keys so superseded
    (sorted, 16 bytes each) and how many keys' latest dirty record it holds (their sum is the round's keys
    mapped); a batch per bucket, one bucket's arrays in memory at a time."""
    rows: dict[int, list] = {}  # bucket -> (base, binary of digests, dirty) of its rows: 16 bytes a key
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in ("bucket", "base", "dirty", "clean")]
        for bucket, base, dirty, clean in zip(*columns, strict=True):
            rows.setdefault(bucket, []).extend(((base, dirty, True), (base, clean, False)))
    for bucket in sorted(rows):  # one bucket's arrays at a time
        yield _superseded_in_bucket(rows.pop(bucket))


def _superseded_in_bucket(rows: list):
    import numpy as np
    import pyarrow as pa
    found = [np.frombuffer(blob, dtype="S16") for _, blob, _ in rows]
    keys = np.concatenate(found)
    bases = np.repeat(np.array([base for base, _, _ in rows], dtype=np.int64), [len(f) for f in found])
    dirty = np.repeat(np.array([flag for _, _, flag in rows], dtype=bool), [len(f) for f in found])
    order = np.lexsort((bases, keys))
    keys, bases, dirty = keys[order], bases[order], dirty[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    latest = np.maximum.reduceat(np.where(dirty, bases, -1), starts)  # each key's last segment with a dirty record
    latest = np.repeat(latest, np.diff(np.append(starts, len(keys))))
    gone, holds = bases < latest, dirty & (bases == latest)
    order = np.argsort(bases[gone], kind="stable")  # by segment, each segment's digests still sorted
    gone_keys, gone_bases = keys[gone][order], bases[gone][order]
    held_bases, held = np.unique(bases[holds], return_counts=True)
    out = np.union1d(np.unique(gone_bases), held_bases)
    cuts = np.searchsorted(gone_bases, np.append(out, np.iinfo(np.int64).max))
    counts = dict(zip(held_bases.tolist(), held.tolist(), strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(out, type=pa.int64()),
         pa.array([gone_keys[cuts[i]:cuts[i + 1]].tobytes() for i in range(len(out))], type=pa.binary()),
         pa.array([counts.get(b, 0) for b in out.tolist()], type=pa.int64())], names=["base", "gone", "keys"])


def segment_marks(spark, segments, request: dict, cleaned: int, last: int, buckets: int):
    """A DataFrame (base, gone, keys), one row per segment with keys in a later segment's dirty records or
    holding a key's latest dirty record: ``gone`` the digests (binaries of 16 bytes per key) of its keys that
    a later segment's dirty record supersedes, ``keys`` how many keys' latest dirty record it holds. Computed
    on the executors; the shuffle carries per segment a binary of digests per bucket."""
    from pyspark.sql import functions as F
    keys = map_in_arrow(segments.select("base"), segment_digests(request, cleaned, last, buckets), DIGESTS)
    return (map_in_arrow(keys.repartition(buckets, "bucket"), superseded_keys, GONE).groupBy("base")
            .agg(F.collect_list("gone").alias("gone"), F.sum("keys").alias("keys")))


def rewrite_segments(request: dict, cleaned: int, last: int):
    """(On an executor, mapInArrow over the segments' marks.) One row per segment: :func:`rewrite_segment`'s."""
    def rewrite(batches):
        with files_of(request) as files:
            for batch in batches:
                yield _rewritten(files, request, batch, cleaned, last)
    return rewrite


def _rewritten(files, request: dict, batch, cleaned: int, last: int):
    import pyarrow as pa
    rows = []
    for i, base in enumerate(batch.column("base").to_pylist()):
        gone = batch.column("gone")[i].as_py() or []
        keys = batch.column("keys")[i].as_py() or 0
        entries, data, digests, numbers, offsets, tombstones = _segment_keys(files, base, last)
        superseded = numbers[_superseded(digests, offsets, gone, cleaned)]
        rows.append({**rewrite_segment(files, request, base, superseded, tombstones, last, entries, data),
                     "keys": keys})
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([("base", pa.int64()), ("changed", pa.bool_())] + [
        (name, pa.int64()) for name in COUNTERS + ("keys",)] + [("part", pa.string())]))


def _superseded(digests, offsets, gone: list[bytes], cleaned: int):
    """Which of a segment's keyed records (``digests``, ``offsets``, in log order) a later record of their key
    in (cleaned, last] supersedes: those of a key in ``gone`` (a later segment holds such a record), and those
    below the segment's own latest dirty record of their key. A boolean mask."""
    import numpy as np
    mask = np.zeros(len(digests), dtype=bool)
    if not len(digests):
        return mask
    order, ends, counts = _by_key(digests, offsets)
    ordered = offsets[order]
    latest = np.repeat(ordered[ends], counts)
    superseded = (ordered < latest) & (latest > cleaned)
    later = np.sort(np.concatenate([np.frombuffer(blob, dtype="S16") for blob in gone])) if gone else []
    if len(later):
        distinct = digests[order[ends]]
        at = np.minimum(np.searchsorted(later, distinct), len(later) - 1)
        superseded |= np.repeat(later[at] == distinct, counts)
    mask[order[superseded]] = True
    return mask


def rewrite_segment(files, request: dict, base: int, superseded, tombstones, last: int, entries=None,
                    data: bytes | None = None) -> dict:
    """(On an executor.) Decide one sealed segment's records by their marks (entry numbers: ``superseded``, and
    its keyed ``tombstones`` at or below ``last``) with the rules of rounds.fate on numpy columns; if it
    changes, write its part (round_files: ``staging/parts/`` or the tier's ``parts/``); its counters and
    whether it changed. ``entries`` and ``data``: the segment's index entries and log, when already read."""
    import numpy as np
    config = CompactionConfig(**request["config"])
    now_ms = request["now_ms"]
    entries = read_index(files.index(base)) if entries is None else entries
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
        data = files.log(base) if data is None else data
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
    buckets = max(tasks, -(-len(index) // PAIRS_PER_BUCKET))  # one task's share of the (key, segment) pairs
    marks = segments.join(segment_marks(spark, segments, request, cleaned, last, buckets), "base", "left")
    rows = [row.asDict() for row in map_in_arrow(marks.repartition(tasks), rewrite_segments(request, cleaned, last),
                                                 SEGMENT).collect()]  # O(segments) rows
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
