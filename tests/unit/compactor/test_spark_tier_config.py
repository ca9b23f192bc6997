"""--spark-tier-url: the compactor's Spark rounds through the object storage tier; the S3 endpoint, region and
credentials come from the standard AWS_* variables (never a flag), and the described config has no secret.
--tier-url: the tier of compaction log segments (its flags; a Spark round's inputs from it)."""

from __future__ import annotations

import pytest

from compactor_service.main import describe, parse_config
from compactor_service.spark_runner import SparkRunner
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.tier.config import TierConfig
from mqstore.tier.objects import read_whole
from mqstore.tier.urls import open_store
from tests.support.compaction_tier import CONFIG, Rig, fill, sealed_files


def test_the_flag_and_the_aws_variables_make_the_rounds_tier():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "id",
           "AWS_SECRET_ACCESS_KEY": "very-secret"}
    config = parse_config(["--data-dir", "/tmp/x", "--spark-tier-url", "s3://bucket/mq"], env)
    tier = config.spark_tier
    assert (tier.tier_url, tier.tier_endpoint, tier.tier_region) == ("s3://bucket/mq", "http://127.0.0.1:9000",
                                                                     "eu-west-1")
    assert tier.credentials.secret_access_key == "very-secret"
    described = describe(config, 1)
    assert described["spark_tier_url"] == "s3://bucket/mq" and "very-secret" not in repr(described)
    assert "very-secret" not in repr(config)
    assert parse_config(["--data-dir", "/tmp/x"], {}).spark_tier.enabled is False
    assert parse_config(["--data-dir", "/tmp/x"], {"MQSTORE_SPARK_TIER_URL": "file:///t"}).spark_tier.tier_url == \
        "file:///t"


def test_a_tier_url_of_another_scheme_is_refused():
    with pytest.raises(InvalidArgument, match="tier_url"):
        parse_config(["--data-dir", "/tmp/x", "--spark-tier-url", "/just/a/path"], {})


def test_the_segments_tier_flags_and_the_aws_variables():
    """--tier-url and friends: the object storage tier of compaction log segments (mqstore.compaction.tier)."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_SECRET_ACCESS_KEY": "very-secret"}
    config = parse_config(["--data-dir", "/tmp/x", "--tier-url", "s3://bucket/mq", "--local-retention-bytes", "5",
                           "--local-retention-ms", "7", "--tier-upload-interval-ms", "300"], env)
    tier = config.tier
    assert (tier.tier_url, tier.tier_endpoint, tier.local_retention_bytes, tier.local_retention_ms,
            tier.tier_upload_interval_ms) == ("s3://bucket/mq", "http://127.0.0.1:9000", 5, 7, 300)
    assert tier.credentials.secret_access_key == "very-secret"
    described = describe(config, 1)
    assert described["tier"]["tier_url"] == "s3://bucket/mq" and "very-secret" not in repr(described)
    assert parse_config(["--data-dir", "/tmp/x"], {}).tier.enabled is False
    with pytest.raises(InvalidArgument, match="give --tier-url"):
        parse_config(["--data-dir", "/tmp/x", "--local-retention-ms", "5"], {})


def test_a_spark_round_takes_segments_only_in_the_compaction_tier_from_there(tmp_path):
    """Without --spark-tier-url the executors read the data dir, which lacks tiered segments: refused, naming
    the flag; with it, the round's input objects are the segments' bytes, read from the compaction tier."""
    rig = Rig(tmp_path, local_retention_bytes=1)
    fill(rig.open(), rig.clock)
    files = sealed_files(rig.store)
    rig.tier.run_pass(rig.store)
    spark_tier = TierConfig(tier_url=f"file://{tmp_path / 'tier'}")
    store = open_store(spark_tier.tier_url, timeout_ms=10_000)
    try:
        assert rig.qlog.tiered == set(files)
        with pytest.raises(FailedPrecondition, match="--spark-tier-url"):
            SparkRunner(CONFIG, "local[1]", 60).request(rig.qlog, rig.clock.now_ms())
        runner = SparkRunner(CONFIG, "local[1]", 60, tier=store, tier_config=spark_tier)
        request = runner.request(rig.qlog, rig.clock.now_ms())
        runner.upload_inputs(rig.qlog, request)
        inputs = request["tier"]["inputs"]
        assert {int(b): read_whole(store, keys["log"]) for b, keys in inputs.items()} == files
        runner.remove_round(rig.qlog, request)
    finally:
        store.close()
        rig.close()
