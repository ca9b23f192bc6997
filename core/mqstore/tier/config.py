"""Configuration of the object storage tier (frozen, validated; built once in the commit log's main()).

The URL, the upload interval and the per-call deadline are flags (``--tier-url``, ...); the S3 endpoint and
region are flags too, and fall back to the standard ``AWS_ENDPOINT_URL`` and ``AWS_REGION`` /
``AWS_DEFAULT_REGION``; credentials come only from ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
``AWS_SESSION_TOKEN`` (never a flag: a command line is visible to every user of the machine), read by main()
(:meth:`TierConfig.with_env`) and kept out of the logged config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, TypeVar

from mqstore.errors import InvalidArgument


@dataclass(frozen=True)
class Credentials:
    access_key_id: str = ""
    secret_access_key: str = ""
    session_token: str = ""

    def __repr__(self) -> str:
        return f"Credentials(access_key_id={self.access_key_id!r}, secret hidden)"


@dataclass(frozen=True)
class TierConfig:
    # Where sealed commit log segments go: "" = no tier; file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX].
    tier_url: str = ""
    # How often the leader looks for sealed segments not yet uploaded (and for an upload left half done).
    tier_upload_interval_ms: int = 10_000
    # The deadline of one call to the object store (a segment's PUT included): then UNAVAILABLE naming the tier.
    tier_call_timeout_ms: int = 60_000
    # s3:// only: the endpoint of an S3-compatible store (http://127.0.0.1:9000 for MinIO); "" = AWS_ENDPOINT_URL,
    # else AWS itself.
    tier_endpoint: str = ""
    # s3:// only: the region; "" = AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1.
    tier_region: str = ""
    # Local retention (mqstore.tier.local_retention): a sealed segment whose upload FINISHED is deleted from the
    # local disk once older than this (0: age alone deletes none); reads of it then go to the tier.
    local_retention_ms: int = dataclasses.field(default=0, metadata={"help": (
        "delete a sealed commit log segment from the local disk once its upload to --tier-url FINISHED and it is "
        "older than this (0 = never by age); at most --retention-ms; its messages are then read from the tier. In a "
        "replication group every node needs the tier and local retention: a new replica copies only the leader's "
        "local tail and reads the rest from the tier, and one without them is refused")})
    # ... or once the local log holds more than this many bytes of such segments (0: size alone deletes none).
    local_retention_bytes: int = dataclasses.field(default=0, metadata={"help": (
        "delete the oldest uploaded sealed segments from the local disk while the local commit log is larger "
        "than this (0 = never by size); never a segment whose upload has not FINISHED")})
    # A read of a segment that is only in the tier GETs whole aligned blocks of this size (the read-ahead).
    tier_read_ahead_bytes: int = dataclasses.field(default=4 << 20, metadata={"help": (
        "a read of data only in the tier GETs the requested span rounded up to aligned blocks of this size")})
    # The blocks read from the tier are kept in a cache of at most this many bytes (least recently used go).
    tier_cache_bytes: int = dataclasses.field(default=64 << 20, metadata={"help": (
        "bytes of blocks read from the tier kept in memory (least recently used evicted first)")})
    # s3:// only: a segment larger than this is uploaded as a multipart upload in parts of this size (S3: >= 5 MiB).
    tier_multipart_bytes: int = dataclasses.field(default=16 << 20, metadata={"help": (
        "s3:// only: upload a sealed segment larger than this as a multipart upload in parts of this size "
        "(at least 5 MiB, S3's smallest part; 4 parts in flight)")})
    # The upload quota (mqstore.tier.quota; Kafka's copy quota, KIP-956): the uploader sends at most this many bytes a
    # second, unless its lag needs more (the floor: lag / 60 s), so uploads never take more than a bounded share of
    # the store's CPU and NIC from the appends (~0.4-0.6 CPU s per GB: 64 MiB/s is ~0.04 of a core) yet keep up.
    tier_upload_max_bytes_per_second: int = dataclasses.field(default=64 << 20, metadata={"help": (
        "upload sealed files to --tier-url at most this many bytes a second (0 = no limit), unless the upload lag "
        "needs more: the rate is never below the lag over 60 s, so a log that grows faster than this is still "
        "uploaded, about 60 s of its growth behind")})
    credentials: Credentials = dataclasses.field(default_factory=Credentials, repr=False)

    def __post_init__(self) -> None:
        for name in ("tier_upload_interval_ms", "tier_call_timeout_ms", "tier_read_ahead_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("local_retention_ms", "local_retention_bytes", "tier_cache_bytes",
                     "tier_upload_max_bytes_per_second"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be 0 or more, not {getattr(self, name)}")
        check_multipart_bytes(self.tier_multipart_bytes)
        if self.local_retention and not self.tier_url:
            raise InvalidArgument("local_retention_ms and local_retention_bytes delete segments uploaded to the "
                                  "tier: give --tier-url too")
        if self.tier_url and not self.tier_url.startswith(("file://", "s3://")):
            raise InvalidArgument(f"tier_url must be file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX], not "
                                  f"{self.tier_url!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.tier_url)

    @property
    def local_retention(self) -> bool:
        return bool(self.local_retention_ms or self.local_retention_bytes)

    def check_against(self, retention_ms: int) -> None:
        """Refuse a local retention longer than the store's total retention (``--retention-ms``): the local
        copy is the recent part of what the store keeps, never more (Kafka's local.retention.ms rule)."""
        if self.local_retention_ms > retention_ms:
            raise InvalidArgument(f"local_retention_ms {self.local_retention_ms} is longer than the total retention "
                                  f"retention_ms {retention_ms}: the local log keeps a part of what the store keeps; "
                                  f"give --local-retention-ms <= --retention-ms")

    def with_env(self, env: Mapping[str, str]) -> TierConfig:
        """The endpoint, region and credentials the flags left out, from the standard AWS variables."""
        return with_aws_env(self, env)

    def described(self) -> dict:
        """For the logged config: every field but the credentials."""
        return described(self)


C = TypeVar("C")


def with_aws_env(config: C, env: Mapping[str, str]) -> C:
    """``config`` (a dataclass with ``tier_endpoint``, ``tier_region`` and ``credentials``: the commit log's
    and the Index's tier settings) with the endpoint, region and credentials its flags left out taken from
    the standard AWS variables."""
    return dataclasses.replace(
        config, tier_endpoint=config.tier_endpoint or env.get("AWS_ENDPOINT_URL", ""),
        tier_region=config.tier_region or env.get("AWS_REGION", "") or env.get("AWS_DEFAULT_REGION", ""),
        credentials=Credentials(env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", ""),
                                env.get("AWS_SESSION_TOKEN", "")))


def check_multipart_bytes(value: int) -> None:
    """``tier_multipart_bytes`` (the commit log's and the Index's): at least S3's smallest part."""
    if value < 5 << 20:
        raise InvalidArgument(f"tier_multipart_bytes must be at least 5 MiB ({5 << 20}, S3's smallest part), not "
                              f"{value}")


def described(config) -> dict:
    """For the logged config: every field of ``config`` but the credentials."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "credentials"}
