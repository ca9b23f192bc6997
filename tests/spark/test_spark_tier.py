"""Spark on the object storage tier (issue 36, item 4), against moto's S3 server on 127.0.0.1: a round whose
sealed input the executors read only from the tier (the queue's directory is moved away while the job runs)
gives byte-identical files to the local engine's, its request names objects and no path, and its objects are
gone when it ends; the data source reads s3:// and file:// tier URLs, one partition per segment object."""

from __future__ import annotations

import filecmp
import json
import shutil

import pytest

from compactor_service.spark_runner import SparkRunner
from mqstore.clock import FakeClock
from mqstore.compaction import reads
from mqstore.compaction.store import CompactionStore
from mqstore.format import compaction_segment as cseg
from mqstore.tier.config import Credentials, TierConfig
from mqstore.tier.urls import open_store
from mqstore_spark import round_job
from mqstore_spark.datasource import tier_segments
from tests.spark.test_spark_engine import CONFIG, _files, _fill
from tests.support.compaction import BASE_MS
from tests.support.hashkeys import seeded_random
from tests.support.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, moto_s3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture
def tier(s3, monkeypatch):
    """A bucket of this test's, its TierConfig and ObjectStore (the job takes the credentials from the
    environment, as the compactor's child does)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    bucket = s3.bucket()
    config = TierConfig(tier_url=f"s3://{bucket}/mq", tier_call_timeout_ms=30_000, tier_endpoint=s3.endpoint,
                        tier_region=REGION, credentials=Credentials(ACCESS_KEY_ID, SECRET_ACCESS_KEY))
    store = open_store(config.tier_url, timeout_ms=config.tier_call_timeout_ms, endpoint=s3.endpoint, region=REGION,
                       credentials=config.credentials)
    yield bucket, config, store
    store.close()


def test_a_round_through_the_tier_reads_no_path_and_is_byte_identical_to_the_local_engine(spark, s3, tier, tmp_path):
    bucket, tier_config, store = tier
    rng, seed = seeded_random("spark_tier_identical")
    clock = FakeClock(BASE_MS)
    _fill(tmp_path / "local", clock, rng)
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    clock.advance(6_000)
    local = CompactionStore(tmp_path / "local", CONFIG, clock)
    info = local.compact(local.slot("kv", 0))
    expected = {v.key: v.stored.raw for v in reads.scan(local, "kv", 0, 0, 1000).items}
    local.close()
    runner = SparkRunner(CONFIG, "local[2]", 600, tier=store, tier_config=tier_config)
    seen: dict = {}

    def spark_round(qlog, now_ms):
        request = runner.request(qlog, now_ms)
        text = json.dumps(request)
        assert "queue_dir" not in request and "staging" not in request and str(tmp_path) not in text
        assert SECRET_ACCESS_KEY not in json.dumps(request["tier"].get("credentials", ""))  # none in the request
        runner.upload_inputs(qlog, request)
        prefix = request["tier"]["prefix"]
        seen["inputs"] = sorted(s3.objects(bucket, f"mq/{prefix}/input/"))
        hidden = qlog.directory.with_name("hidden")
        qlog.directory.rename(hidden)  # the job cannot read the queue's files by any path
        try:
            round_job.run(spark, request)  # the job, in this process on the shared session
        finally:
            hidden.rename(qlog.directory)
        seen["after_job"] = sorted(s3.objects(bucket, f"mq/{prefix}/"))
        try:
            return runner.install(qlog, request)
        finally:
            runner.remove_round(qlog, request)
            seen["after_round"] = s3.objects(bucket, "mq/")

    other = CompactionStore(tmp_path / "spark", CONFIG, clock)
    slot = other.slot("kv", 0)
    bases = slot.qlog.sealed()[0]
    spark_info = other.compact(slot, engine="spark", runner=spark_round)
    assert spark_info.stats.passes == 1 and spark_info.stats.records_removed > 0
    assert (spark_info.stats.rewritten_from, spark_info.stats.records_rewritten) == \
        (info.stats.rewritten_from, info.stats.records_rewritten), f"seed {seed}"
    assert {v.key: v.stored.raw for v in reads.scan(other, "kv", 0, 0, 1000).items} == expected
    other.close()
    assert len(seen["inputs"]) == 2 * len(bases) and all(k.rsplit("/", 1)[1] in {
        n for b in bases for n in (cseg.log_name(b), cseg.index_name(b))} for k in seen["inputs"])
    outputs = [k.rsplit("/", 1)[1] for k in seen["after_job"] if "/output/" in k]
    assert "round.manifest" in outputs and any(cseg.parse_log_name(name) is not None for name in outputs)
    assert not [k for k in seen["after_job"] if "/parts/" in k]  # the driver deleted the executors' parts
    assert seen["after_round"] == {}, "the round's prefix is deleted when it ends"
    names = _files(tmp_path / "local")
    assert names == _files(tmp_path / "spark")
    mismatch = filecmp.cmpfiles(tmp_path / "local", tmp_path / "spark", names, shallow=False)[1:]
    assert mismatch == ([], []), f"seed {seed}: files differ: {mismatch}"


def test_the_data_source_reads_s3_and_file_tier_urls(spark, s3, tier, tmp_path):
    bucket, _, store = tier
    rng, _ = seeded_random("spark_tier_source")
    _fill(tmp_path / "logs", FakeClock(BASE_MS), rng)
    segments = sorted((tmp_path / "logs").rglob("*.log"))
    for path in segments:  # as a compaction log's segments would be in the tier, beside files that are not
        store.put_if_absent(f"logs/kv/0/{path.name}", path.read_bytes())
        store.put_if_absent(f"logs/kv/0/{path.name[:-4]}.cq", b"not a segment")
    columns = ("queue_offset", "position", "key", "body")
    by_path = [tuple(r) for r in spark.read.format("mqstore").load(str(tmp_path / "logs")).select(*columns)
               .orderBy("queue_offset").collect()]
    s3_frame = (spark.read.format("mqstore").option("endpoint", s3.endpoint).option("region", REGION)
                .option("access_key_id", ACCESS_KEY_ID).option("secret_access_key", SECRET_ACCESS_KEY)
                .load(f"s3://{bucket}/mq/logs"))
    assert s3_frame.rdd.getNumPartitions() == len(segments)
    assert [tuple(r) for r in s3_frame.select(*columns).orderBy("queue_offset").collect()] == by_path
    files = {r["file"] for r in s3_frame.select("file").distinct().collect()}
    assert files and files <= {f"s3://{bucket}/mq/logs/kv/0/{p.name}" for p in segments}  # (the last may be empty)
    file_frame = spark.read.format("mqstore").load(f"file://{tmp_path / 'logs'}")
    assert [tuple(r) for r in file_frame.select(*columns).orderBy("queue_offset").collect()] == by_path


def test_tier_segments_takes_one_upload_per_commit_log_segment():
    first, second = "0" * 32, "f" * 32
    keys = [f"commitlog/{0:020d}/{second}", f"commitlog/{0:020d}/{first}", f"commitlog/{1024:020d}/{first}",
            f"kv/0/{0:020d}.log", f"kv/0/{0:020d}.cq", f"x/{2048:020d}", "spark-rounds/abc/parts/x.removed"]
    assert tier_segments(keys) == [(f"commitlog/{0:020d}/{first}", 0), (f"commitlog/{1024:020d}/{first}", 1024),
                                   (f"kv/0/{0:020d}.log", 0), (f"x/{2048:020d}", 2048)]


def test_a_retried_task_puts_parts_of_its_own(tmp_path):
    """Spark retries a task whose executor died after it put some parts: objects are written once, so each
    attempt's parts have keys of their own, and the driver reads those of the attempt its row names."""
    from mqstore_spark.round_files import TierFiles
    tier = {"url": f"file://{tmp_path}", "timeout_ms": 10_000, "prefix": "spark-rounds/r", "inputs": {}}
    files = TierFiles({"tier": tier})
    try:
        first, second = files.new_attempt(), files.new_attempt()
        files.put_part(0, first, ".log", b"first")
        files.put_part(0, second, ".log", b"second")  # no AlreadyExists: the retry goes on
        assert first != second and files.part(0, second, ".log") == b"second"
        files.drop_parts([0])
        assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    finally:
        files.close()
