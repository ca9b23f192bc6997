"""--spark-tier-url: the compactor's Spark rounds through the object storage tier; the S3 endpoint, region and
credentials come from the standard AWS_* variables (never a flag), and the described config has no secret."""

from __future__ import annotations

import pytest

from compactor_service.main import describe, parse_config
from mqstore.errors import InvalidArgument


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
