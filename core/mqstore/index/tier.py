"""The Index's second storage tier for sealed compact index files, on the object storage tier's one
abstraction (mqstore.tier.objects.ObjectStore: ``file://`` and ``s3://``), queried with ranged reads.

Objects are immutable and every move is a fresh attempt with a key of its own,
``index/<file name>.<attempt id>`` (put with put-if-absent, S3's ``If-None-Match: *``), so a retried or
half-done move never overwrites or is mistaken for another. Which object holds a file is recorded in the
index directory's manifest (mqstore.index.tier_manifest) in two phases: STARTED before the put, FINISHED
after the object was read back and verified; the local file is deleted only after FINISHED is durable.
lifecycle.move_to_tier has the steps, recovery.py and lifecycle.tidy_tier what a crash between them leaves.

Two ObjectStores share the URL: ``writes`` (puts, the verifying read back, lists, deletes; deadline
``tier_call_timeout_ms``, one worker: a move is one file at a time) and ``reads`` (a query's ranged reads;
deadline ``tier_read_timeout_ms``), so a slow upload never holds the workers a query needs, and a stalled
store fails a query with UNAVAILABLE naming the tier within the read deadline while queries served by local
files answer as before (they never touch the tier).

Thread-safety: IndexTier and TierReader are thread-safe (the ObjectStore is; the counters take a lock).
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Mapping

from mqstore.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound
from mqstore.tier.config import Credentials, check_multipart_bytes, described, with_aws_env
from mqstore.tier.objects import ObjectStore, OpenObject
from mqstore.tier.s3 import DEFAULT_MULTIPART_BYTES
from mqstore.tier.urls import open_store

PREFIX = "index"
READ_WORKERS = 4


@dataclass(frozen=True)
class IndexTierConfig:
    """The Index service's ``--tier-*`` settings: the same URL forms, endpoint, region and credentials
    (the standard AWS_* variables, never a flag) as the commit log's tier (mqstore.tier.config)."""

    # Where sealed compact index files go: "" = no tier; file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX].
    tier_url: str = dataclasses.field(default="", metadata={"help": (
        "object storage for sealed compact index files: file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX] (objects "
        "under index/); empty = none. Each Index instance needs its own URL (a restart deletes objects under "
        "index/ that its manifest does not name)")})
    tier_endpoint: str = dataclasses.field(default="", metadata={"help": (
        "s3:// only: endpoint of an S3-compatible store (http://127.0.0.1:9000 for MinIO); empty = "
        "AWS_ENDPOINT_URL, else AWS")})
    tier_region: str = dataclasses.field(default="", metadata={"help": (
        "s3:// only: region; empty = AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1")})
    # The deadline of one upload, verifying read back, list or delete.
    tier_call_timeout_ms: int = dataclasses.field(default=60_000, metadata={"help": (
        "deadline of one upload (a whole compact file), list or delete on the tier; then UNAVAILABLE and the "
        "move is retried")})
    # The deadline of one ranged read of a query: then the query is UNAVAILABLE naming the tier.
    tier_read_timeout_ms: int = dataclasses.field(default=5_000, metadata={"help": (
        "deadline of one ranged read of a query on the tier; then the query fails UNAVAILABLE naming the tier "
        "(queries answered by local files are not affected)")})
    # s3:// only: a compact file larger than this goes as a multipart upload in parts of this size (the commit
    # log's --tier-multipart-bytes for its segments, the same put: mqstore.tier.s3).
    tier_multipart_bytes: int = dataclasses.field(default=DEFAULT_MULTIPART_BYTES, metadata={"help": (
        "s3:// only: upload a compact index file larger than this as a multipart upload in parts of this size "
        "(at least 5 MiB, S3's smallest part; 4 parts in flight); every file is streamed from a read-only memory "
        "map, never read whole into memory")})
    credentials: Credentials = dataclasses.field(default_factory=Credentials, repr=False)

    def __post_init__(self) -> None:
        for name in ("tier_call_timeout_ms", "tier_read_timeout_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        check_multipart_bytes(self.tier_multipart_bytes)
        if self.tier_url and not self.tier_url.startswith(("file://", "s3://")):
            raise InvalidArgument(f"tier_url must be file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX], not "
                                  f"{self.tier_url!r} (fsspec URLs are no longer taken)")

    def with_env(self, env: Mapping[str, str]) -> IndexTierConfig:
        """The endpoint, region and credentials the flags left out, from the standard AWS variables."""
        return with_aws_env(self, env)

    def described(self) -> dict:
        """For the logged config: every field but the credentials."""
        return described(self)


def dir_url(directory: pathlib.Path) -> str:
    """The file:// URL ``--tier-dir DIR`` stands for."""
    return f"file://{directory.resolve()}"


def check_no_old_layout(config: IndexTierConfig, index_dir: pathlib.Path) -> None:
    """Refuse a file:// tier directory that holds index files of the layout before the ObjectStore
    (``<name>.cidx`` at its top, named by no manifest): this version would not see them, and queries would
    miss their messages without an error."""
    if not config.tier_url.startswith("file://"):
        return
    root = pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(config.tier_url).path))
    old = sorted(p.name for p in root.glob("*.cidx")) if root.is_dir() else []
    if old:
        raise FailedPrecondition(
            f"the tier directory {root} holds {len(old)} index files of the old --tier-dir layout ({old[0]}, ...): "
            f"this version keeps them as objects under {root / PREFIX}/, named in {index_dir}/tier-manifest.*. "
            f"To migrate, stop the Index service, delete {index_dir} and {root}/*.cidx, and start it again: the "
            f"index is rebuilt from the commit log (it is derived data)")


class IndexTier:
    """The index's objects on a tier: put a local file under a fresh key, ranged reads, list, delete."""

    def __init__(self, writes: ObjectStore, reads: ObjectStore):
        self.writes, self.reads = writes, reads
        self.name = writes.url
        self._lock = threading.Lock()
        self.reads_total = 0
        self.read_bytes_total = 0

    def new_key(self, file_name: str) -> str:
        """A key no attempt used before: ``index/<file name>.<attempt id>``."""
        return f"{PREFIX}/{file_name}.{uuid.uuid4().hex}"

    def put(self, key: str, source: pathlib.Path) -> None:
        """Create the object ``key`` with the bytes of ``source``, a sealed file (never replaces one:
        AlreadyExists): streamed from a read-only memory map, a multipart upload above ``tier_multipart_bytes``
        on S3 (ObjectStore.put_file, as the commit log's segments), never read whole into memory."""
        self.writes.put_file(key, source, source.stat().st_size)

    def read(self, key: str, position: int, length_bytes: int, *, verifying: bool = False,
             opened: OpenObject | None = None) -> bytes:
        """A ranged read (of ``opened``, the object kept open, when given); DataLoss when the object is gone (a
        query must not answer NOT_FOUND for a key because a file's object was deleted behind the index's back),
        Unavailable naming the tier."""
        try:
            if opened is not None:
                data = opened.get_range(position, length_bytes)
            else:
                data = (self.writes if verifying else self.reads).get_range(key, position, length_bytes)
        except NotFound:
            raise self._missing(key) from None
        with self._lock:
            self.reads_total += 1
            self.read_bytes_total += len(data)
        return data

    def open(self, key: str) -> OpenObject | None:
        """The object kept open for reads (a file:// tier), or None (read by key); DataLoss when it is gone."""
        try:
            return self.reads.open_object(key)
        except NotFound:
            raise self._missing(key) from None

    def _missing(self, key: str) -> DataLoss:
        return DataLoss(f"index file object {key} is missing from the tier {self.name} (the manifest names "
                        f"it); to rebuild, stop the index, delete its directory and start it again")

    def keys(self) -> dict[str, int]:
        """Every object under ``index/``: key -> size."""
        return {info.key: info.size for info in self.writes.list(PREFIX)}

    def delete(self, key: str) -> None:
        self.writes.delete(key)

    def close(self) -> None:
        self.reads.close()
        self.writes.close()


def open_tier(config: IndexTierConfig) -> IndexTier | None:
    """The tier a deployment configured, or None."""
    if not config.tier_url:
        return None

    def store(timeout_ms: int, workers: int) -> ObjectStore:
        return open_store(config.tier_url, timeout_ms=timeout_ms, endpoint=config.tier_endpoint,
                          region=config.tier_region, credentials=config.credentials, workers=workers,
                          multipart_bytes=config.tier_multipart_bytes)
    return IndexTier(store(config.tier_call_timeout_ms, 1), store(config.tier_read_timeout_ms, READ_WORKERS))


class TierReader:
    """A compact_index.RangeReader over one object of the tier (the file's recorded size). On a file:// tier the
    object is opened at the first read and kept open until ``close`` (ObjectStore.open_object: a query's 2-8
    reads are preads, as the index's local files' are); on S3 every read is a ranged GET. ``verifying``: reads go
    through the writes store (the long deadline of a move's read back), nothing kept open. Thread-safe."""

    def __init__(self, tier: IndexTier, key: str, size_bytes: int, *, verifying: bool = False):
        self.tier = tier
        self.key = key
        self.name = f"{tier.name}/{key}"
        self.size_bytes = size_bytes
        self._verifying = verifying
        self._lock = threading.Lock()
        self._opened: OpenObject | None = None
        self._to_open = not verifying  # until the first read (or close): then read by ``_opened``, or by key

    def read(self, position: int, length_bytes: int) -> bytes:
        if self._to_open:
            self._open()
        return self.tier.read(self.key, position, length_bytes, verifying=self._verifying, opened=self._opened)

    def _open(self) -> None:
        with self._lock:
            if self._to_open:
                self._opened = self.tier.open(self.key)
                self._to_open = False

    def close(self) -> None:
        with self._lock:
            opened, self._opened, self._to_open = self._opened, None, False
        if opened is not None:
            opened.close()
