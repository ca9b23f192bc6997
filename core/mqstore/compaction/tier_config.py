"""The compactor's ``--tier-*`` settings (mqstore.compaction.tier): frozen, validated, built once in its main()."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from mqstore.errors import InvalidArgument
from mqstore.tier.config import Credentials, TierConfig, described, with_aws_env


@dataclass(frozen=True)
class CompactionTierConfig:
    """The compactor's ``--tier-*`` settings: the URL forms, endpoint, region and credentials (the standard
    AWS_* variables, never a flag) of the commit log's tier (mqstore.tier.config)."""

    tier_url: str = dataclasses.field(default="", metadata={"help": (
        "object storage for sealed compaction log segments: file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX] (objects "
        "under compaction/<instance id>/); the active compactor uploads them; empty = none")})
    tier_endpoint: str = dataclasses.field(default="", metadata={"help": (
        "s3:// only: endpoint of an S3-compatible store; empty = AWS_ENDPOINT_URL, else AWS")})
    tier_region: str = dataclasses.field(default="", metadata={"help": (
        "s3:// only: region; empty = AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1")})
    tier_upload_interval_ms: int = dataclasses.field(default=10_000, metadata={"help": (
        "how often the active compactor uploads sealed segments and applies local retention")})
    tier_call_timeout_ms: int = dataclasses.field(default=60_000, metadata={"help": (
        "deadline of one upload (a whole segment), manifest write, list or delete on the tier")})
    tier_read_timeout_ms: int = dataclasses.field(default=5_000, metadata={"help": (
        "deadline of one ranged read of a segment only in the tier; then the read fails UNAVAILABLE naming the "
        "tier (reads of local segments are not affected)")})
    local_retention_ms: int = dataclasses.field(default=0, metadata={"help": (
        "delete a sealed compaction segment's local .log once its upload to --tier-url FINISHED and its newest "
        "record is older than this (0 = never by age); it is then read from the tier")})
    local_retention_bytes: int = dataclasses.field(default=0, metadata={"help": (
        "delete the oldest uploaded sealed segments' local .log while a queue's local sealed segments hold more "
        "than this (0 = never by size); never a segment whose upload has not FINISHED")})
    tier_read_ahead_bytes: int = dataclasses.field(default=1 << 20, metadata={"help": (
        "a read of a segment only in the tier GETs the span rounded up to aligned blocks of this size")})
    tier_cache_bytes: int = dataclasses.field(default=TierConfig.tier_cache_bytes, metadata={"help": (
        "bytes of blocks read from the tier kept in memory (least recently used evicted first)")})
    credentials: Credentials = dataclasses.field(default_factory=Credentials, repr=False)

    def __post_init__(self) -> None:
        for name in ("tier_upload_interval_ms", "tier_call_timeout_ms", "tier_read_timeout_ms",
                     "tier_read_ahead_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("local_retention_ms", "local_retention_bytes", "tier_cache_bytes"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be 0 or more, not {getattr(self, name)}")
        if self.tier_url and not self.tier_url.startswith(("file://", "s3://")):
            raise InvalidArgument(f"tier_url must be file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX], not "
                                  f"{self.tier_url!r}")
        if (self.local_retention_ms or self.local_retention_bytes) and not self.tier_url:
            raise InvalidArgument("local_retention_ms and local_retention_bytes delete segments uploaded to the "
                                  "tier: give --tier-url too")

    @property
    def enabled(self) -> bool:
        return bool(self.tier_url)

    def with_env(self, env: Mapping[str, str]) -> CompactionTierConfig:
        return with_aws_env(self, env)

    def described(self) -> dict:
        return described(self)
