"""The Spark engine: the data source reads the record format, and a Spark round gives byte-identical
files to the local engine's (multi-pass, tiny budget) on the same input."""

from __future__ import annotations

import filecmp
import pathlib
import shutil

import pytest

from compactor_service.spark_runner import SparkRunner, install_output
from mqstore.clock import FakeClock
from mqstore.compaction import reads
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore_spark import round_job
from tests.support.compaction import BASE_MS, put
from tests.support.hashkeys import seeded_random

pytestmark = pytest.mark.slow
CONFIG = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=2 * ENTRY_COST_BYTES,
                          delete_retention_ms=5_000)


def _fill(directory: pathlib.Path, clock: FakeClock, rng) -> int:
    store = CompactionStore(directory, CONFIG, clock)
    for offset in range(400):
        key = f"key-{rng.randint(0, 30)}"
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


def test_spark_and_local_rounds_give_byte_identical_files(spark, tmp_path):
    rng, seed = seeded_random("spark_identical")
    clock = FakeClock(BASE_MS)
    _fill(tmp_path / "local", clock, rng)
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    clock.advance(6_000)  # some tombstones stamped by the first round are past their retention now
    local = CompactionStore(tmp_path / "local", CONFIG, clock)
    info = local.compact(local.slot("kv", 0))
    assert info.stats.passes > 1  # the local engine needed several passes for its budget
    expected = {v.key: v.stored.raw for v in reads.scan(local, "kv", 0, 0, 1000).items}
    local.close()
    other = CompactionStore(tmp_path / "spark", CONFIG, clock)
    slot = other.slot("kv", 0)

    def spark_round(qlog, now_ms):
        request = SparkRunner(CONFIG, "local[2]", 600).request(qlog, now_ms)
        round_job.run(spark, request)  # the job, in this process on the shared session
        return install_output(qlog, request["bases"], pathlib.Path(request["staging"]))

    other.compact(slot, engine="spark", runner=spark_round)
    assert not (slot.qlog.directory / "staging").exists()  # the round's staging folder goes with it
    assert {v.key: v.stored.raw for v in reads.scan(other, "kv", 0, 0, 1000).items} == expected
    other.close()
    names = _files(tmp_path / "local")
    assert names == _files(tmp_path / "spark")
    mismatch = filecmp.cmpfiles(tmp_path / "local", tmp_path / "spark", names, shallow=False)[1:]
    assert mismatch == ([], []), f"seed {seed}: files differ: {mismatch}"
