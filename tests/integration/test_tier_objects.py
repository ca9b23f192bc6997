"""The ObjectStore contract (mqstore.tier.objects) against both backends: file:// and a real S3-compatible
server (moto's server mode on 127.0.0.1, one per module); and the deadline against a server that never
answers: UNAVAILABLE naming the tier within the deadline."""

from __future__ import annotations

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
