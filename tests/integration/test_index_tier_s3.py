"""The Index's tier on a real S3-compatible server (moto's server mode on 127.0.0.1, one per module, behind a TCP
proxy that can stall it): objects byte-identical to the local compact files (read back with boto3, not the code
tested), a crash before / between / after the two phases of a move loses nothing and leaves no orphan, and a
stalled store fails tier queries with UNAVAILABLE naming the tier within the read deadline while queries that
local files answer still do. The service itself on s3:// runs in tests/integration/test_index_service.py."""

from __future__ import annotations

import dataclasses
import time

import pytest

from mqstore import failpoints
from mqstore.clock import FakeClock
from mqstore.errors import AlreadyExists, Unavailable
from mqstore.index.store import IndexStore
from mqstore.index.tier import IndexTierConfig, open_tier
from mqstore.index.tier_manifest import TierManifest
from tests.support.s3 import moto_s3
from tests.support.tcp_proxy import TcpProxy
from tests.unit.index.index_testing import BASE_MS, Model, all_pages, record, tiny_config

pytestmark = pytest.mark.integration

KEYS = [f"k{i}" for i in range(5)]
READ_TIMEOUT_MS = 1_000


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        host, port = server.endpoint.removeprefix("http://").split(":")
        proxy = TcpProxy((host, int(port)))
        try:
            yield server, proxy
        finally:
            proxy.heal()
            proxy.close()


class Rig:
    """An IndexStore over tmp_path whose tier is a fresh bucket reached through the proxy; a model of what
    was fed. ``open`` again is the restart after a crash (the old store dropped, not closed)."""

    def __init__(self, tmp_path, s3):
        self.server, self.proxy = s3
        self.bucket = self.server.bucket()
        env = {**self.server.env(), "AWS_ENDPOINT_URL": f"http://{self.proxy.address}"}
        self.tier_config = IndexTierConfig(tier_url=f"s3://{self.bucket}/idx", tier_read_timeout_ms=READ_TIMEOUT_MS,
                                           tier_call_timeout_ms=5_000).with_env(env)
        self.config = tiny_config(tmp_path, entry_count=9, max_keys_per_message=2, tier_min_age_ms=60_000)
        self.clock = FakeClock(BASE_MS)
        self.model = Model()
        self.stores, self.tiers = [], []

    def open(self) -> IndexStore:
        tier = open_tier(self.tier_config)
        self.tiers.append(tier)
        store = IndexStore(self.config, clock=self.clock, tier=tier)
        store.start()
        self.stores.append(store)
        return store

    def feed(self, store, first: int, count: int) -> None:
        records = [record(100 * i, [KEYS[i % 5], KEYS[i * 3 % 5]], ts_ms=BASE_MS + 1000 * i)
                   for i in range(first, first + count)]
        store.apply(records, 100 * (first + count))
        for rec in records:
            self.model.add(rec)

    def check(self, store, begin_ms: int = 0) -> None:
        for key in KEYS:
            assert all_pages(store, "T", key, begin_ms=begin_ms) == self.model.query("T", key, begin_ms, 1 << 62), key

    def objects(self) -> dict[str, bytes]:
        return self.server.objects(self.bucket, "idx/")

    def close(self) -> None:
        for store in self.stores:
            store.close()
        for tier in self.tiers:
            tier.close()


@pytest.fixture
def rig(tmp_path, s3):
    made = Rig(tmp_path, s3)
    yield made
    made.close()


def test_moved_files_are_byte_identical_objects_under_unique_keys(rig):
    store = rig.open()
    rig.feed(store, 1, 24)
    store.convert_sealed(100)
    local = {p.name: p.read_bytes() for p in rig.config.index_dir.glob("*.cidx")}
    rig.clock.advance(120_000)
    assert store.move_to_tier(100) == len(local) >= 4
    manifest = TierManifest.load(rig.config.index_dir, store.tier.name)
    objects = rig.objects()
    assert objects == {f"idx/{entry.key}": local[name] for name, entry in manifest.finished.items()}
    rig.check(store)


def test_a_file_above_the_multipart_size_goes_as_a_multipart_upload_byte_identical(rig, tmp_path):
    config = dataclasses.replace(rig.tier_config, tier_multipart_bytes=5 << 20)
    tier = open_tier(config)
    try:
        source = tmp_path / "big.cidx"
        data = bytes(range(251)) * ((6 << 20) // 251)  # above 5 MiB: two parts
        source.write_bytes(data)
        key = tier.new_key(source.name)
        tier.put(key, source)
        assert tier.writes._backend.multipart_puts == 1
        assert rig.objects() == {f"idx/{key}": data}  # read back with boto3
        with pytest.raises(AlreadyExists):
            tier.put(key, source)  # create-only, as the commit log's segments
    finally:
        tier.close()


@pytest.mark.parametrize("point", ["index.tier.started", "index.tier.after_put", "index.tier.finished"])
def test_a_crash_in_a_move_loses_nothing_and_leaves_no_orphan_on_s3(rig, failpoint, point):
    store = rig.open()
    rig.feed(store, 1, 24)
    store.convert_sealed(100)
    rig.clock.advance(120_000)
    with failpoint.armed(point), pytest.raises(failpoints.FailpointHit):
        store.move_to_tier(1)
    store.checkpoint()
    again = rig.open()
    rig.check(again)
    again.tidy_tier()  # the first maintenance round's start
    manifest = TierManifest.load(rig.config.index_dir, again.tier.name)
    assert set(rig.objects()) == {f"idx/{entry.key}" for entry in manifest.finished.values()}
    assert again.move_to_tier(100) >= 1
    manifest = TierManifest.load(rig.config.index_dir, again.tier.name)
    names = [p.name for p in rig.config.index_dir.glob("*.cidx")]
    assert names == [] and set(rig.objects()) == {f"idx/{entry.key}" for entry in manifest.finished.values()}
    assert again.stats().files_compact_tier == len(manifest.finished)
    rig.check(again)


def test_a_stalled_store_fails_tier_queries_within_the_deadline_and_local_ones_answer(rig):
    store = rig.open()
    rig.feed(store, 1, 24)
    store.convert_sealed(100)
    rig.clock.advance(120_000)
    assert store.move_to_tier(100) >= 2
    with store.files() as table:
        newest_local = max(i.begin_timestamp_ms for i in table.infos() if i.tier == "local")
    rig.proxy.partition()
    try:
        rig.check(store, begin_ms=newest_local + 1000)  # the local (unsealed) file answers alone
        started = time.monotonic()
        with pytest.raises(Unavailable, match=f"object storage tier s3://{rig.bucket}/idx") as caught:
            store.query("T", KEYS[0], max_num=100)
        elapsed_ms = (time.monotonic() - started) * 1000
        assert elapsed_ms < READ_TIMEOUT_MS + 2_000, caught.value
        rig.check(store, begin_ms=newest_local + 1000)
    finally:
        rig.proxy.heal()
    rig.check(store)
