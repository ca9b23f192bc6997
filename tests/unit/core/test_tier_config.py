"""The commit log's tier settings (mqstore.tier.config): flags and MQSTORE_* variables, the S3 endpoint,
region and credentials from the standard AWS_* variables, bad values refused, and no secret in the logged
config."""

from __future__ import annotations

import json

import pytest

from commitlog_service.main import build_arg_parser, describe, parse_config
from mqstore.errors import InvalidArgument


def test_tier_flags_variables_and_the_aws_environment(tmp_path):
    base = ["--data-dir", str(tmp_path)]
    assert not parse_config(base, {}).tier.enabled  # off by default
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_DEFAULT_REGION": "eu-west-1",
           "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "very-secret",
           "MQSTORE_TIER_CALL_TIMEOUT_MS": "5000"}
    config = parse_config([*base, "--tier-url", "s3://bucket/prefix", "--tier-upload-interval-ms", "250"], env)
    tier = config.tier
    assert (tier.tier_url, tier.tier_upload_interval_ms, tier.tier_call_timeout_ms) == ("s3://bucket/prefix", 250, 5000)
    assert (tier.tier_endpoint, tier.tier_region) == ("http://127.0.0.1:9000", "eu-west-1")
    assert (tier.credentials.access_key_id, tier.credentials.secret_access_key) == ("AKIDEXAMPLE", "very-secret")
    flags = parse_config([*base, "--tier-url", "file:///x", "--tier-endpoint", "http://h:1", "--tier-region", "r"], env)
    assert (flags.tier.tier_endpoint, flags.tier.tier_region) == ("http://h:1", "r")  # flags win
    logged = json.dumps(describe(config, 1), default=str)
    assert "s3://bucket/prefix" in logged and "very-secret" not in logged and "AKIDEXAMPLE" not in logged
    assert "very-secret" not in repr(config)


@pytest.mark.parametrize("argv", [["--tier-url", "ftp://x"], ["--tier-upload-interval-ms", "0"],
                                  ["--tier-call-timeout-ms", "-1"],
                                  ["--tier-multipart-bytes", str(1 << 20)]])
def test_bad_tier_settings_are_refused(tmp_path, argv):
    with pytest.raises(InvalidArgument):
        parse_config(["--data-dir", str(tmp_path), *argv], {})


def test_every_tier_flag_has_help_and_no_credential_is_a_flag():
    text = build_arg_parser().format_help()
    for flag in ("--tier-url", "--tier-upload-interval-ms", "--tier-call-timeout-ms", "--tier-endpoint",
                 "--tier-region"):
        assert flag in text
    assert not any(flag in text for flag in ("--credentials", "--access-key", "--secret-access-key", "--tier-secret"))


def test_local_retention_longer_than_the_total_is_refused_at_start_naming_both_flags(tmp_path):
    with pytest.raises(InvalidArgument, match="local_retention_ms 7200000 is longer than the total retention "
                                              "retention_ms 3600000.*--local-retention-ms <= --retention-ms"):
        parse_config(["--data-dir", str(tmp_path), "--tier-url", "file:///x", "--retention-ms", "3600000",
                      "--local-retention-ms", "7200000"], {})
    config = parse_config(["--data-dir", str(tmp_path), "--tier-url", "file:///x", "--retention-ms", "3600000",
                           "--local-retention-ms", "3600000", "--local-retention-bytes", "1048576",
                           "--tier-read-ahead-bytes", "65536", "--tier-cache-bytes", "0"], {})
    assert (config.tier.local_retention_ms, config.tier.local_retention_bytes, config.tier.tier_read_ahead_bytes,
            config.tier.tier_cache_bytes) == (3_600_000, 1 << 20, 65536, 0)
    text = build_arg_parser().format_help()
    for flag in ("--local-retention-ms", "--local-retention-bytes", "--tier-read-ahead-bytes", "--tier-cache-bytes"):
        assert flag in text
