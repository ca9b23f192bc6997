"""The ObjectStore of a tier URL: file:///ABSOLUTE/DIR (mqstore.tier.local) or s3://BUCKET[/PREFIX]
(mqstore.tier.s3). Thread-safety: stateless."""

from __future__ import annotations

from mqstore.errors import InvalidArgument
from mqstore.tier.local import LocalBackend
from mqstore.tier.objects import DEFAULT_WORKERS, ObjectStore
from mqstore.tier.s3 import DEFAULT_MULTIPART_BYTES, S3Backend


def open_store(url: str, *, timeout_ms: int, endpoint: str = "", region: str = "", credentials=None,
               workers: int = DEFAULT_WORKERS, multipart_bytes: int = DEFAULT_MULTIPART_BYTES) -> ObjectStore:
    """The ObjectStore of ``url``: file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX] (endpoint, region and
    credentials and the multipart size for s3:// only; mqstore.tier.config)."""
    if url.startswith("file://"):
        return ObjectStore(url, LocalBackend.of_url(url), timeout_ms=timeout_ms, workers=workers)
    if url.startswith("s3://"):
        backend = S3Backend.of_url(url, endpoint=endpoint, region=region, credentials=credentials,
                                   timeout_ms=timeout_ms, multipart_bytes=multipart_bytes)
        return ObjectStore(url, backend, timeout_ms=timeout_ms, workers=workers)
    raise InvalidArgument(f"a tier URL is file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX], not {url!r}")
