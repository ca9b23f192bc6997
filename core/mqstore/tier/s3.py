"""The ``s3://bucket/prefix`` backend of the object storage tier (mqstore.tier.objects), for S3 and
S3-compatible stores (MinIO, moto's server, ...), through obstore (docs/DESIGN.md says why that client).

A put is a single PUT with ``If-None-Match: *`` (obstore's PutMode "create"): S3 answers 412 when the key
exists, which is AlreadyExists here, so two writers never replace each other's object. A file (a sealed
segment: :meth:`S3Backend.put_file`) is given to obstore as a read-only memory map of the file, never copied
into Python's memory; one larger than ``multipart_bytes`` (``--tier-multipart-bytes``) goes as a multipart upload in
parts of that size, at most MULTIPART_CONCURRENCY in flight (S3 takes parts of 5 MiB to 5 GiB and a single PUT
of at most 5 GiB). obstore 0.12 sends no ``If-None-Match`` on CompleteMultipartUpload (a mode other than
"overwrite" turns multipart off), so a multipart put checks with a HEAD that the key is absent, then uploads
without a condition. That keeps the tier's objects write-once because of how the uploader keys them
(mqstore.tier.uploader): every attempt puts under a key of its own (``commitlog/<base>/<fresh uuid4>``),
recorded in its STARTED record before the put, and no other attempt ever writes that key; the only writes
to one key are this attempt's (obstore's retries of a part, or a deposed leader's put landing late), all of
the same bytes, whose size and digest (CRC-64/NVME or SHA-256) the STARTED record holds. S3 checks each request's
body (a PUT's, an UploadPart's) against the CRC-64/NVME its ``x-amz-checksum-crc64nvme`` header carries and refuses
one that differs (400 BadDigest), which obstore computes from the memory map the bytes are sent from
(``checksum_algorithm`` "crc64nvme", S3's own default checksum; a multipart object's is the full object's
CRC-64/NVME, combined by S3 from the parts'). The payloads are not signed (``UNSIGNED-PAYLOAD``): a signed payload's
SHA-256 checks the same bytes at ~0.6 CPU s a GB against ~0.05-0.1 for the CRC (bench/README.md, *The tier
upload benchmark*). A put that lands
after its attempt was DISCARDED or DELETED is an orphan the sweep deletes. An upload that fails midway is
aborted by obstore (AbortMultipartUpload); one cut by a crash leaves invisible parts: a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` removes them (README, *Object storage tier*). Range reads are one
GET with a Range header (and a HEAD only for a range past the end); size is a HEAD; list is ListObjectsV2
under the prefix; delete is idempotent. The client's own timeout is the tier's call deadline, and it retries
at most twice inside it, so a stalled server frees the executor's worker too.

Thread-safety: obstore's store is thread-safe (one HTTP connection pool).
"""

from __future__ import annotations

import datetime
import mmap
import pathlib
import urllib.parse

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError, PreconditionError
from obstore.store import S3Store

from mqstore.errors import AlreadyExists, InvalidArgument, NotFound
from mqstore.tier.objects import ObjectInfo, Pace

DEFAULT_REGION = "us-east-1"
MAX_RETRIES = 2
MIN_PART_BYTES = 5 << 20  # S3's smallest part (but the last)
DEFAULT_MULTIPART_BYTES = 16 << 20
CHECKSUM_ALGORITHM = "crc64nvme"  # every PUT's and UploadPart's body checked by S3 against it (the module docstring)
MULTIPART_CONCURRENCY = 4  # parts in flight (each buffered: at most 4 x multipart_bytes of memory per upload)


class S3Backend:
    def __init__(self, store: S3Store, multipart_bytes: int = DEFAULT_MULTIPART_BYTES):
        if multipart_bytes < MIN_PART_BYTES:
            raise InvalidArgument(f"multipart_bytes must be at least {MIN_PART_BYTES} (S3's smallest part), "
                                  f"not {multipart_bytes}")
        self._store = store
        self.multipart_bytes = multipart_bytes
        self.multipart_puts = 0  # files put as multipart uploads (tests)

    @classmethod
    def of_url(cls, url: str, *, endpoint: str, region: str, credentials, timeout_ms: int,
               multipart_bytes: int = DEFAULT_MULTIPART_BYTES) -> S3Backend:
        parsed = urllib.parse.urlparse(url)
        if not parsed.netloc:
            raise InvalidArgument(f"an s3:// tier URL names its bucket (s3://BUCKET[/PREFIX]), not {url!r}")
        options = {"timeout": f"{timeout_ms}ms", "connect_timeout": f"{min(timeout_ms, 10_000)}ms",
                   "allow_http": endpoint.startswith("http://")}
        retry = {"max_retries": MAX_RETRIES, "retry_timeout": datetime.timedelta(milliseconds=timeout_ms),
                 "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                             "max_backoff": datetime.timedelta(seconds=2), "base": 2}}
        keys = {}
        if credentials is not None and credentials.access_key_id:
            keys = {"access_key_id": credentials.access_key_id, "secret_access_key": credentials.secret_access_key}
            if credentials.session_token:
                keys["session_token"] = credentials.session_token
        extra = {"endpoint": endpoint} if endpoint else {}
        # every request body with its CRC-64/NVME, which S3 checks (whatever AWS_CHECKSUM_ALGORITHM and
        # AWS_UNSIGNED_PAYLOAD say), so the uploader needs no read-back of a put that answered
        # (mqstore.tier.uploader); the payload unsigned: its SHA-256 would check the same bytes again, at 10x the CPU
        store = S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, region=region or DEFAULT_REGION,
                        client_options=options, retry_config=retry, checksum_algorithm=CHECKSUM_ALGORITHM,
                        unsigned_payload=True, **extra, **keys)
        return cls(store, multipart_bytes)

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            obstore.put(self._store, key, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            raise AlreadyExists(f"object {key} exists already (objects are written once)") from None

    def put_file(self, key: str, path: pathlib.Path, size: int, pace: Pace | None = None) -> None:
        """The file ``path`` of ``size`` bytes (a sealed segment: it no longer changes), handed to obstore as a
        read-only memory map: no copy in Python and none of obstore's own file reads, which cost 1.9-2.5 CPU s a GB
        against 0.8 for a buffer (bench/README.md, *The tier upload benchmark*). ``pace`` (the upload quota,
        mqstore.tier.quota): a single PUT takes its whole size first; a multipart upload is given the map as an
        iterator of part-sized views, each taken before obstore gets it (a part is sent as it comes: the quota
        spaces the parts, MULTIPART_CONCURRENCY still in flight at most)."""
        with open(path, "rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if len(mapped) != size:
                raise ValueError(f"{path} holds {len(mapped)} bytes, not the {size} recorded for {key}")
            with memoryview(mapped) as view:
                if size <= self.multipart_bytes:
                    if pace is not None:
                        pace.take(size)
                    try:
                        obstore.put(self._store, key, view, mode="create", use_multipart=False)
                    except (AlreadyExistsError, PreconditionError):
                        raise AlreadyExists(f"object {key} exists already (objects are written once)") from None
                    return
                if self.size(key) is not None:  # no condition on the multipart's completion: the module docstring
                    raise AlreadyExists(f"object {key} exists already (objects are written once)")
                parts = _paced_parts(view, self.multipart_bytes, pace) if pace is not None else None
                try:
                    obstore.put(self._store, key, view if parts is None else parts, use_multipart=True,
                                chunk_size=self.multipart_bytes, max_concurrency=MULTIPART_CONCURRENCY)
                finally:
                    if parts is not None:
                        parts.close()  # a put cut midway: its last part's view goes before the map closes
                self.multipart_puts += 1

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """One GET with a Range header (S3 answers fewer bytes at the object's end, and 416 from past it)."""
        try:
            return bytes(obstore.get_range(self._store, key, start=start, end=start + length))
        except (NotFoundError, FileNotFoundError):
            raise NotFound(f"object {key} does not exist") from None
        except BaseError as exc:
            if "416" not in str(exc):
                raise
        if self.size(key) is None:  # the range starts at or past the end: empty, if the object exists
            raise NotFound(f"object {key} does not exist")
        return b""

    def size(self, key: str) -> int | None:
        try:
            return int(obstore.head(self._store, key)["size"])
        except (NotFoundError, FileNotFoundError):
            return None

    def list(self, prefix: str) -> list[ObjectInfo]:
        found = [ObjectInfo(meta["path"], int(meta["size"]))
                 for chunk in obstore.list(self._store, prefix or None) for meta in chunk]
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._store, key)
        except (NotFoundError, FileNotFoundError):
            pass

    def close(self) -> None:
        pass


def _paced_parts(view: memoryview, part_bytes: int, pace: Pace):
    """``view`` as views of ``part_bytes`` (obstore's part size: each is one part as it is), each after the quota
    allowed it."""
    for start in range(0, len(view), part_bytes):
        part = view[start:start + part_bytes]
        pace.take(len(part))
        yield part
