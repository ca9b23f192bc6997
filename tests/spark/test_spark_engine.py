"""The Spark engine: the data source reads the record format, a Spark round gives byte-identical files to
the local engine's (many map fillings, tiny budget) on the same input, rewriting from the same first
segment that changes, and what crosses to its driver is one row per segment, never a row per key or
record."""

from __future__ import annotations

import dataclasses
import filecmp
import pathlib
import shutil

import pytest

from compactor_service.spark_runner import SparkRunner, install_output
from mqstore.clock import FakeClock
from mqstore.compaction import reads
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import DAY_MS, CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore_spark import round_job
from tests.support.compaction import BASE_MS, put
from tests.support.hashkeys import seeded_random

pytestmark = pytest.mark.slow
CONFIG = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=2 * ENTRY_COST_BYTES,
                          delete_retention_ms=5_000)


def _fill(directory: pathlib.Path, clock: FakeClock, rng, keys: int = 30, config: CompactionConfig = CONFIG,
          fresh: bool = False) -> int:
    """400 records; ``fresh``: those after the first round have keys of their own (its segments stay)."""
    store = CompactionStore(directory, config, clock)
    for offset in range(400):
        key = f"key-{rng.randint(0, keys) + (keys + 1 if fresh and offset > 250 else 0)}"
        value = None if rng.random() < 0.1 else f"{key}={offset}".encode() * rng.randint(1, 6)
        put(store, key, value, offset, clock.now_ms())
        clock.advance(rng.randint(0, 40))
        if offset == 250:  # a first local round: later rounds meet cleaned, stamped and dirty records
            store.compact(store.slot("kv", 0), seal_active=True)
    store.slot("kv", 0).qlog.seal_active()
    store.close()
    return 400


def _files(directory: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_the_data_source_reads_every_record(spark, tmp_path):
    rng, _ = seeded_random("spark_data_source")
    _fill(tmp_path / "logs", FakeClock(BASE_MS), rng)
    store = CompactionStore(tmp_path / "logs", CONFIG, FakeClock(BASE_MS))
    held = [(s.entry.queue_offset, s.entry.position) for s in store.slot("kv", 0).qlog.read(0, 10_000)]
    store.close()
    df = spark.read.format("mqstore").load(str(tmp_path / "logs"))
    rows = df.select("queue_offset", "position", "topic", "key").orderBy("queue_offset").collect()
    assert [(r["queue_offset"], r["position"]) for r in rows] == held
    assert {r["topic"] for r in rows} == {"kv"} and all(r["key"].startswith("key-") for r in rows)


def _spark_round(spark, config: CompactionConfig):
    def spark_round(qlog, now_ms):
        request = SparkRunner(config, "local[2]", 600).request(qlog, now_ms)
        round_job.run(spark, request)  # the job, in this process on the shared session
        return install_output(qlog, request["bases"], pathlib.Path(request["staging"]))
    return spark_round


@pytest.mark.parametrize("config,fresh", [(CONFIG, False), (dataclasses.replace(CONFIG, min_compaction_lag_ms=3_000),
                                                             False),
                                          (dataclasses.replace(CONFIG, delete_retention_ms=DAY_MS), True)],
                         ids=["all-dirty", "lagging-tail", "first-segments-kept"])
def test_spark_and_local_rounds_give_byte_identical_files(spark, tmp_path, config, fresh):
    rng, seed = seeded_random("spark_identical")
    clock = FakeClock(BASE_MS)
    _fill(tmp_path / "local", clock, rng, config=config, fresh=fresh)
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    clock.advance(6_000)  # some tombstones stamped by the first round are past their retention now
    local = CompactionStore(tmp_path / "local", config, clock)
    info = local.compact(local.slot("kv", 0))
    assert info.stats.passes > 1  # the local engine needed several passes for its budget
    expected = {v.key: v.stored.raw for v in reads.scan(local, "kv", 0, 0, 1000).items}
    local.close()
    other = CompactionStore(tmp_path / "spark", config, clock)
    slot = other.slot("kv", 0)
    spark_info = other.compact(slot, engine="spark", runner=_spark_round(spark, config))
    assert spark_info.stats.passes == 1 and spark_info.stats.records_removed > 0
    assert (spark_info.stats.rewritten_from, spark_info.stats.records_rewritten) == \
        (info.stats.rewritten_from, info.stats.records_rewritten), f"seed {seed}"
    assert (info.stats.rewritten_from > 0) == fresh, f"seed {seed}: the first round's segments change only " \
        f"when later records share their keys or their tombstones expire"
    assert not (slot.qlog.directory / "staging").exists()  # the round's staging folder goes with it
    assert {v.key: v.stored.raw for v in reads.scan(other, "kv", 0, 0, 1000).items} == expected
    other.close()
    names = _files(tmp_path / "local")
    assert names == _files(tmp_path / "spark")
    mismatch = filecmp.cmpfiles(tmp_path / "local", tmp_path / "spark", names, shallow=False)[1:]
    assert mismatch == ([], []), f"seed {seed}: files differ: {mismatch}"


def test_only_one_row_per_segment_crosses_to_the_driver(spark, tmp_path, monkeypatch):
    """Every way a DataFrame or RDD hands rows to the driver is counted (the classic DataFrame overrides the
    base class's methods, so both are wrapped): a round over many more keys than segments collects one row
    per input segment (the old engine collected a row per key)."""
    from pyspark import RDD
    from pyspark.sql import DataFrame
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
    rng, seed = seeded_random("spark_collects")
    clock = FakeClock(BASE_MS)
    _fill(tmp_path / "logs", clock, rng, keys=1_000)
    store = CompactionStore(tmp_path / "logs", CONFIG, clock)
    slot = store.slot("kv", 0)
    segments, keys = len(slot.qlog.sealed()[0]), len(slot.qlog.latest)
    assert keys > 2 * segments, f"seed {seed}: the input must hold more keys ({keys}) than segments ({segments})"
    crossed: list[tuple[str, int]] = []

    def counting(cls, name):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if hasattr(result, "__len__"):
                crossed.append((f"{cls.__name__}.{name}", len(result)))
                return result
            rows = list(result)  # an iterator (toLocalIterator): counted as it is drained
            crossed.append((f"{cls.__name__}.{name}", len(rows)))
            return iter(rows)
        monkeypatch.setattr(cls, name, wrapper)

    frames = ("collect", "take", "head", "tail", "toLocalIterator", "toPandas", "toArrow")
    for cls, names in ((DataFrame, frames), (ClassicDataFrame, frames),
                       (RDD, ("collect", "take", "toLocalIterator", "collectAsMap", "countByKey", "countByValue"))):
        for name in names:
            if hasattr(cls, name):
                counting(cls, name)
    info = store.compact(slot, engine="spark", runner=_spark_round(spark, CONFIG))
    store.close()
    assert info.stats.keys_mapped > 2 * segments
    assert crossed and sum(n for _, n in crossed) <= segments, (
        f"seed {seed}: {segments} segments, {keys} keys; rows collected to the driver: {crossed}")
