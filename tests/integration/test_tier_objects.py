"""The ObjectStore contract (mqstore.tier.objects) against both backends: file:// and a real S3-compatible
server (moto's server mode on 127.0.0.1, one per module); and the deadline against a server that never
answers: UNAVAILABLE naming the tier within the deadline."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mqstore.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from mqstore.tier.config import Credentials
from mqstore.tier.objects import ObjectInfo
from mqstore.tier.urls import open_store
from tests.support.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, moto_s3, stalled_server

pytestmark = pytest.mark.integration

TIMEOUT_MS = 10_000
KEYS = Credentials(ACCESS_KEY_ID, SECRET_ACCESS_KEY)


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture(params=["file", "s3"])
def tier(request, tmp_path, s3):
    if request.param == "file":
        (tmp_path / "tier").mkdir()
        store = open_store(f"file://{tmp_path}/tier", timeout_ms=TIMEOUT_MS)
    else:
        store = open_store(f"s3://{s3.bucket()}/some/prefix", timeout_ms=TIMEOUT_MS, endpoint=s3.endpoint,
                           region=REGION, credentials=KEYS)
    yield store
    store.close()


def test_put_if_absent_creates_once_and_a_second_put_fails_clearly(tier):
    tier.put_if_absent("commitlog/1/a", b"first")
    with pytest.raises(AlreadyExists, match="commitlog/1/a exists already"):
        tier.put_if_absent("commitlog/1/a", b"second")
    assert tier.get_range("commitlog/1/a", 0, 100) == b"first"  # never replaced


def test_range_reads_and_size(tier):
    data = bytes(range(256)) * 1000
    tier.put_if_absent("k/data", data)
    assert tier.size("k/data") == len(data)
    assert tier.get_range("k/data", 0, 10) == data[:10]
    assert tier.get_range("k/data", 100_001, 4096) == data[100_001:104_097]
    assert tier.get_range("k/data", len(data) - 5, 100) == data[-5:]  # fewer at the end
    assert tier.get_range("k/data", 5, 0) == b""
    assert tier.get_range("k/data", len(data), 10) == b"" and tier.get_range("k/data", len(data) + 7, 1) == b""
    assert tier.size("k/absent") is None
    with pytest.raises(NotFound):
        tier.get_range("k/absent", 0, 1)


def test_list_by_prefix_and_delete(tier):
    for key in ("a/1/x", "a/1/y", "a/2/z", "ab/1"):
        tier.put_if_absent(key, key.encode())
    assert tier.list("a") == [ObjectInfo("a/1/x", 5), ObjectInfo("a/1/y", 5), ObjectInfo("a/2/z", 5)]
    assert [info.key for info in tier.list("a/1")] == ["a/1/x", "a/1/y"]
    assert tier.list("none") == []
    tier.delete("a/1/x")
    tier.delete("a/1/x")  # absent: no error
    assert [info.key for info in tier.list("a")] == ["a/1/y", "a/2/z"]
    tier.put_if_absent("a/1/x", b"again")  # a deleted key may be created again
    assert tier.get_range("a/1/x", 0, 5) == b"again"


@pytest.mark.parametrize("key", ["", "/a", "a//b", "a/../b", "a/./b", "a b", "a/"])
def test_a_bad_key_is_invalid_argument(tier, key):
    with pytest.raises(InvalidArgument):
        tier.put_if_absent(key, b"x")


def test_a_temp_file_of_a_crashed_put_is_never_listed(tmp_path):
    store = open_store(f"file://{tmp_path}", timeout_ms=TIMEOUT_MS)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".x.123.tmp").write_bytes(b"torn")
    store.put_if_absent("a/x", b"whole")
    assert store.list("a") == [ObjectInfo("a/x", 5)]
    store.close()


def test_a_file_tier_is_read_on_the_callers_thread_and_written_on_the_tiers(tier):
    """A file:// tier's get_range runs on the caller's thread (a hop to the executor cost 5-10x the read:
    mqstore.tier.objects); its writes, and every call of an S3 tier, run on the tier's threads (``tier_N``)."""
    threads: dict[str, list[str]] = {"get_range": [], "put_if_absent": []}
    backend = tier._backend

    def recording(name: str):
        call = getattr(backend, name)

        def recorded(*args):
            threads[name].append(threading.current_thread().name)
            return call(*args)
        return recorded
    for name in threads:
        setattr(backend, name, recording(name))
    tier.put_if_absent("a/x", b"whole")
    assert tier.get_range("a/x", 1, 3) == b"hol"
    with pytest.raises(NotFound):
        tier.get_range("a/none", 0, 1)
    if tier.url.startswith("file://"):
        assert threads["get_range"] == [threading.current_thread().name] * 2
    else:
        assert len(threads["get_range"]) == 2 and all(t.startswith("tier") for t in threads["get_range"])
    assert len(threads["put_if_absent"]) == 1 and threads["put_if_absent"][0].startswith("tier")


def test_a_closed_file_tier_reads_no_more(tmp_path):
    """Its reads run on the caller's thread, yet a closed store refuses them as the executor refuses the rest."""
    (tmp_path / "tier").mkdir()
    store = open_store(f"file://{tmp_path}/tier", timeout_ms=TIMEOUT_MS)
    store.put_if_absent("a/x", b"whole")
    assert store.get_range("a/x", 0, 5) == b"whole"
    store.close()
    for call in (lambda: store.get_range("a/x", 0, 5), lambda: store.size("a/x")):
        with pytest.raises(Unavailable, match=f"object storage tier file://{tmp_path}/tier: closed"):
            call()


def test_an_object_kept_open_reads_its_ranges_on_a_file_tier_and_s3_reads_by_key(tier):
    data = bytes(range(256)) * 40
    tier.put_if_absent("k/open", data)
    opened = tier.open_object("k/open")
    if tier.url.startswith("s3://"):
        assert opened is None  # a ranged GET whatever is kept: get_range
        return
    try:
        assert opened.get_range(0, 10) == data[:10] and opened.get_range(len(data) - 5, 100) == data[-5:]
        assert opened.get_range(len(data) + 3, 10) == b""
        with pytest.raises(InvalidArgument):
            opened.get_range(-1, 10)
        with pytest.raises(NotFound):
            tier.open_object("k/absent")
        tier.delete("k/open")
        assert opened.get_range(100, 4) == data[100:104]  # the object it opened: objects never change
        tier.put_if_absent("k/other", b"other")
        other = tier.open_object("k/other")
        other.close()
        with pytest.raises(Unavailable, match="GET k/other failed: OSError"):  # a read that fails names the tier
            other.get_range(0, 1)
        tier.close()
        with pytest.raises(Unavailable, match="closed"):  # as every read of a closed store
            opened.get_range(0, 1)
    finally:
        opened.close()


def test_a_missing_file_tier_directory_is_unavailable_never_empty_and_never_made(tmp_path):
    """The root of a file:// tier is its bucket (mqstore.tier.local): while the directory is missing (moved away,
    not mounted) every call is Unavailable naming the tier, nothing "empty" or "gone", and a put does not make
    it again; a missing folder below the root is an empty prefix, as on S3; the directory back, all is there."""
    root = tmp_path / "tier"
    root.mkdir()
    store = open_store(f"file://{root}", timeout_ms=TIMEOUT_MS)
    try:
        store.put_if_absent("a/x", b"whole")
        assert store.list("none") == [] and store.size("a/y") is None
        root.rename(tmp_path / "away")
        for call in (lambda: store.list("a"), lambda: store.list(""), lambda: store.get_range("a/x", 0, 5),
                     lambda: store.size("a/x"), lambda: store.delete("a/x"),
                     lambda: store.put_if_absent("b/y", b"new")):
            with pytest.raises(Unavailable, match=f"object storage tier file://{root}.*does not exist"):
                call()
        assert not root.exists()  # the put made nothing in its place
        (tmp_path / "away").rename(root)
        assert store.list("a") == [ObjectInfo("a/x", 5)] and store.get_range("a/x", 0, 5) == b"whole"
    finally:
        store.close()


def test_a_stalled_store_is_unavailable_naming_the_tier_within_the_deadline():
    with stalled_server() as endpoint:
        store = open_store("s3://stalled/p", timeout_ms=1_000, endpoint=endpoint, region=REGION, credentials=KEYS)
        try:
            for call in (lambda: store.size("k/x"), lambda: store.put_if_absent("k/x", b"data"),
                         lambda: store.list("k")):
                began = time.monotonic()
                with pytest.raises(Unavailable, match="object storage tier s3://stalled/p") as info:
                    call()
                assert time.monotonic() - began < 5, "the deadline is 1 s (a loaded machine gets slack)"
                assert "1000 ms" in str(info.value) or "failed" in str(info.value)
        finally:
            store.close()


def test_a_bad_url_is_invalid_argument():
    for url in ("ftp://x/y", "file://relative/dir", "s3:///nobucket"):
        with pytest.raises(InvalidArgument):
            open_store(url, timeout_ms=TIMEOUT_MS)


def test_put_file_creates_the_files_bytes_once(tier, tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(bytes(range(256)) * 300 + b"tail")
    tier.put_file("commitlog/7/a", path, path.stat().st_size)
    assert tier.get_range("commitlog/7/a", 0, 1 << 20) == path.read_bytes()
    with pytest.raises(AlreadyExists, match="commitlog/7/a exists already"):
        tier.put_file("commitlog/7/a", path, path.stat().st_size)


def test_a_segment_above_the_multipart_size_is_uploaded_in_parts_byte_identical_and_create_only(s3, tmp_path):
    """The uploader (mqstore.tier.uploader) puts a segment of 12 MiB and a bit with --tier-multipart-bytes 5 MiB:
    a multipart upload of three parts (the server's ETag says so), FINISHED after a HEAD without reading the
    object back (S3 checked the signed payloads), byte-identical read back with boto3; a second put of its key
    is AlreadyExists (mqstore.tier.s3: the HEAD before an unconditioned multipart)."""
    import os

    from mqstore.format import tier_upload
    from mqstore.format.tier_upload import FINISHED
    from mqstore.tier.ledger import Ledger
    from mqstore.tier.sealed import SealedSegment
    from mqstore.tier.uploader import Uploader

    bucket = s3.bucket()
    store = open_store(f"s3://{bucket}/n", timeout_ms=60_000, endpoint=s3.endpoint, region=REGION, credentials=KEYS,
                       multipart_bytes=5 << 20)
    records: list[bytes] = []
    ledger = Ledger(records.append, lambda at, n: [(i, records[i], i) for i in range(at, min(at + n, len(records)))],
                    lambda: (0, len(records)))
    data = os.urandom((12 << 20) + 4321)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(data)
    segment = SealedSegment(0, len(data), path.read_bytes, path)
    uploader = Uploader(store, ledger, lambda: [segment], leader_epoch=lambda: 0, ready=lambda: True,
                        log_min=lambda: 0, interval_ms=600_000)
    gets, get_range = [], store._backend.get_range
    store._backend.get_range = lambda *args: gets.append(args) or get_range(*args)
    try:
        uploader.step()
        assert gets == []  # no read-back of a put that answered
        finished, pending = ledger.snapshot()
        assert not pending and list(finished) == [0] and finished[0].segment_size == len(data)
        assert [tier_upload.decode(r).state for r in records][-1] == FINISHED
        key = finished[0].key
        assert store._backend.multipart_puts == 1
        assert s3.objects(bucket, "n/") == {f"n/{key}": data}  # byte-identical, nothing else
        assert s3.client.head_object(Bucket=bucket, Key=f"n/{key}")["ETag"].strip('"').endswith("-3")  # 3 parts
        with pytest.raises(AlreadyExists):
            store.put_file(key, path, len(data))
    finally:
        store.close()


def test_every_put_and_part_carries_its_bodys_crc64nvme_for_s3_to_check_and_is_not_signed_again(s3, tmp_path):
    """What the store sends (a proxy records it on its way to moto, which checks no checksum itself): every PUT of
    a single object and every UploadPart carries ``x-amz-checksum-crc64nvme`` equal to the CRC-64/NVME of its body
    (S3 refuses a body that does not match it, mqstore.tier.s3), the multipart upload is created with that
    algorithm (S3 then keeps the whole object's), and the payloads are not signed (``UNSIGNED-PAYLOAD``: no second
    SHA-256 of the bytes in the store); the objects read back byte-identical."""
    from tests.support.crc64 import header_value
    from tests.support.s3 import recording_proxy

    bucket = s3.bucket()
    with recording_proxy(s3.endpoint) as (endpoint, seen):
        store = open_store(f"s3://{bucket}/p", timeout_ms=60_000, endpoint=endpoint, region=REGION, credentials=KEYS,
                           multipart_bytes=5 << 20)
        try:
            small, large = tmp_path / "small", tmp_path / "large"
            small.write_bytes(os.urandom(70_001))
            large.write_bytes(os.urandom((10 << 20) + 7))  # three parts
            store.put_file("commitlog/0/a", small, small.stat().st_size)
            store.put_file("commitlog/1/b", large, large.stat().st_size)
            store.put_if_absent("commitlog/2/c", b"some bytes")
        finally:
            store.close()
    puts = [request for request in seen if request.method == "PUT"]
    assert len(puts) == 5  # the small file, three parts, the bytes
    for request in puts:
        assert request.headers.get("x-amz-checksum-crc64nvme") == header_value(request.body), request.path
        assert request.headers.get("x-amz-content-sha256") == "UNSIGNED-PAYLOAD", request.path
    assert sum("partNumber=" in request.path for request in puts) == 3
    creates = [request for request in seen if request.method == "POST" and request.path.endswith("?uploads=")]
    assert len(creates) == 1 and creates[0].headers.get("x-amz-checksum-algorithm") == "CRC64NVME"
    assert s3.objects(bucket, "p/") == {"p/commitlog/0/a": small.read_bytes(), "p/commitlog/1/b": large.read_bytes(),
                                       "p/commitlog/2/c": b"some bytes"}


def test_the_multipart_size_is_at_least_s3s_smallest_part():
    with pytest.raises(InvalidArgument, match="at least"):
        open_store("s3://b/p", timeout_ms=TIMEOUT_MS, endpoint="http://127.0.0.1:1", region=REGION, credentials=KEYS,
                   multipart_bytes=1 << 20)


class RecordingPace:
    """The upload quota as the backends see it (mqstore.tier.objects.Pace): records each chunk it is asked for."""

    def __init__(self, longest_s: float = 0.0, hold_s: float = 0.0):
        self.taken: list[int] = []
        self._longest_s, self._hold_s = longest_s, hold_s

    def take(self, size: int) -> None:
        self.taken.append(size)
        if self._hold_s:
            threading.Event().wait(self._hold_s)  # a quota that holds the put back (a real wait, bounded)

    def longest_s(self, size: int) -> float:
        return self._longest_s


def test_put_file_asks_the_quota_for_every_chunk_it_sends(tier, tmp_path):
    """file:// copies in chunks of COPY_BYTES, each after the quota; S3 at or under the multipart size is one PUT,
    taken whole first."""
    from mqstore.tier.local import COPY_BYTES

    path = tmp_path / "segment"
    path.write_bytes(os.urandom(2 * COPY_BYTES + 12345))
    pace = RecordingPace()
    tier.put_file("commitlog/9/a", path, path.stat().st_size, pace)
    assert tier.get_range("commitlog/9/a", 0, 1 << 30) == path.read_bytes()
    assert sum(pace.taken) == path.stat().st_size
    if tier.url.startswith("file://"):
        assert pace.taken == [COPY_BYTES, COPY_BYTES, 12345]
    else:
        assert pace.taken == [path.stat().st_size]


def test_a_multipart_put_asks_the_quota_for_every_part(s3, tmp_path):
    bucket = s3.bucket()
    store = open_store(f"s3://{bucket}/n", timeout_ms=60_000, endpoint=s3.endpoint, region=REGION, credentials=KEYS,
                       multipart_bytes=5 << 20)
    try:
        data = os.urandom((12 << 20) + 4321)
        path = tmp_path / "segment"
        path.write_bytes(data)
        pace = RecordingPace()
        store.put_file("commitlog/0/a", path, len(data), pace)
        assert pace.taken == [5 << 20, 5 << 20, (2 << 20) + 4321]  # one take per part, each part as it is taken
        assert s3.objects(bucket, "n/") == {"n/commitlog/0/a": data}
        assert s3.client.head_object(Bucket=bucket, Key="n/commitlog/0/a")["ETag"].strip('"').endswith("-3")
    finally:
        store.close()


def test_a_put_held_back_by_the_quota_gets_its_longest_wait_on_top_of_the_deadline(tmp_path):
    """A put whose quota holds it 1 s, with a 300 ms deadline: UNAVAILABLE when the quota's longest wait is not
    added, done when it is (the deadline covers the store, not the pacing the quota asked for)."""
    (tmp_path / "tier").mkdir()
    store = open_store(f"file://{tmp_path}/tier", timeout_ms=300)
    try:
        path = tmp_path / "segment"
        path.write_bytes(b"x" * 1000)
        with pytest.raises(Unavailable, match="did not answer within 300 ms"):
            store.put_file("commitlog/1/a", path, 1000, RecordingPace(longest_s=0.0, hold_s=1.0))
        store.put_file("commitlog/1/b", path, 1000, RecordingPace(longest_s=30.0, hold_s=1.0))
        assert store.get_range("commitlog/1/b", 0, 1000) == b"x" * 1000
    finally:
        store.close()
