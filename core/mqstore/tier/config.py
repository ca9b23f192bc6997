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
from typing import Mapping

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
    credentials: Credentials = dataclasses.field(default_factory=Credentials, repr=False)

    def __post_init__(self) -> None:
        for name in ("tier_upload_interval_ms", "tier_call_timeout_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.tier_url and not self.tier_url.startswith(("file://", "s3://")):
            raise InvalidArgument(f"tier_url must be file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX], not "
                                  f"{self.tier_url!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.tier_url)

    def with_env(self, env: Mapping[str, str]) -> TierConfig:
        """The endpoint, region and credentials the flags left out, from the standard AWS variables."""
        return dataclasses.replace(
            self, tier_endpoint=self.tier_endpoint or env.get("AWS_ENDPOINT_URL", ""),
            tier_region=self.tier_region or env.get("AWS_REGION", "") or env.get("AWS_DEFAULT_REGION", ""),
            credentials=Credentials(env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", ""),
                                    env.get("AWS_SESSION_TOKEN", "")))

    def described(self) -> dict:
        """For the logged config: every field but the credentials."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "credentials"}
