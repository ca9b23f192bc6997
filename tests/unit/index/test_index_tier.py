"""Second tier (file://; s3:// in tests/integration/test_index_tier_s3.py): moves of immutable objects recorded
in the manifest, byte identity, restarts, torn objects, failed puts, ranged reads (at most two per compact file
per query), retention, stats, and the background maintainer thread."""

from __future__ import annotations

import os

import pytest

from index_testing import BASE_MS, Model, all_pages, record, tiny_config
from mqstore.index.maintenance import IndexMaintainer
from mqstore.index.store import IndexStore
from mqstore.index.tier import IndexTierConfig, TierReader, dir_url, open_tier
from mqstore.index.tier_manifest import TierManifest
from mqstore.clock import FakeClock
from mqstore.errors import AlreadyExists, DataLoss, FailedPrecondition, InvalidArgument, Unavailable

KEYS = [f"k{i}" for i in range(6)]


@pytest.fixture
def make_tier(tmp_path):
    """The index's tier on a file:// ObjectStore (tests/integration/test_index_tier_s3.py runs s3:// too)."""
    made = []

    def make(name: str):
        (tmp_path / name).mkdir(exist_ok=True)
        tier = open_tier(IndexTierConfig(tier_url=dir_url(tmp_path / name)))
        made.append(tier)
        return tier
    yield make
    for tier in made:
        tier.close()


@pytest.fixture
def setup(tmp_path, make_tier):
    tier = make_tier("tier")
    clock = FakeClock(BASE_MS)
    store = IndexStore(tiny_config(tmp_path, slot_count=3, entry_count=9, max_keys_per_message=2,
                                   tier_min_age_ms=60_000), clock=clock, tier=tier)
    store.start()
    model = Model()
    records = [record(100 * i, [KEYS[i % 6]], ts_ms=BASE_MS + 1000 * i) for i in range(1, 41)]
    store.apply(records, 4100)
    for rec in records:
        model.add(rec)
    yield store, tier, clock, model
    store.close()


def test_objects_are_byte_identical_to_the_local_files_and_named_once_in_the_manifest(setup, tmp_path):
    store, tier, clock, _ = setup
    store.convert_sealed(100)
    local = {p.name: p.read_bytes() for p in (tmp_path / "index").glob("*.cidx")}
    clock.advance(120_000)
    assert store.move_to_tier(100) == len(local) == 4
    manifest = TierManifest.load(tmp_path / "index", tier.name)
    assert manifest.started == {} and set(manifest.finished) == set(local)
    objects = tier.keys()
    assert set(objects) == {f.key for f in manifest.finished.values()}
    for name, entry in manifest.finished.items():
        assert entry.key.startswith(f"index/{name}.") and objects[entry.key] == len(local[name])
        assert tier.writes.get_range(entry.key, 0, entry.size) == local[name]
    assert list((tmp_path / "index").glob("*.cidx")) == []


def test_a_restart_opens_tier_files_from_the_manifest_and_refuses_another_url(setup, tmp_path, make_tier):
    store, tier, clock, model = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    store.move_to_tier(100)
    store.close()
    again = IndexStore(store.config, clock=clock, tier=tier)
    again.start()
    try:
        assert again.stats().files_compact_tier == 4
        for key in KEYS:
            assert all_pages(again, "T", key) == model.query("T", key, 0, 1 << 62)
    finally:
        again.close()
    for other in (None, make_tier("elsewhere")):
        with pytest.raises(FailedPrecondition, match="start it with --tier-url file://"):
            IndexStore(store.config, clock=clock, tier=other).start()


def test_a_torn_object_fails_the_query_never_answers_part_of_it(setup, tmp_path):
    store, tier, clock, model = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    store.move_to_tier(100)
    manifest = TierManifest.load(tmp_path / "index", tier.name)
    victim = manifest.finished[min(manifest.finished)]
    path = tmp_path / "tier" / victim.key
    path.write_bytes(path.read_bytes()[:victim.size - 7])  # an object cut short behind the store's back
    answered = 0
    for key in KEYS:
        try:
            found = all_pages(store, "T", key)
        except DataLoss as exc:
            assert "short read" in str(exc) and victim.key in str(exc)
            continue
        assert found == model.query("T", key, 0, 1 << 62)  # keys whose runs avoid the cut: whole answers
        answered += 1
    assert answered < len(KEYS)


def test_a_failed_put_is_discarded_and_the_move_retried_under_a_new_key(setup, tmp_path, monkeypatch):
    store, tier, clock, model = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    real_put, keys = tier.put, []

    def failing_put(key, source):
        keys.append(key)
        real_put(key, source)  # the object lands, then the store reports an error (pulsar#17228)
        raise Unavailable("object storage tier: PUT answered 500")

    monkeypatch.setattr(tier, "put", failing_put)
    maintainer = IndexMaintainer(store)  # one round in this thread (step), as the duty runs it
    with pytest.raises(Unavailable):
        maintainer.step()
    stats = store.stats()  # the tier away is said, but the index stays healthy: local queries answer
    assert stats.healthy and "PUT answered 500" in stats.last_error
    assert tier.keys() == {} and len(list((tmp_path / "index").glob("*.cidx"))) == 4
    assert TierManifest.load(tmp_path / "index", tier.name).started == {}
    monkeypatch.setattr(tier, "put", real_put)
    real_put(keys[0], sorted((tmp_path / "index").glob("*.cidx"))[0])  # a timed-out put landing after the delete
    maintainer.step()
    assert store.stats().files_compact_tier == 4 and store.stats().last_error == ""
    assert keys[0] not in tier.keys() and len(tier.keys()) == 4  # the next round listed the tier again
    for key in KEYS:
        assert all_pages(store, "T", key) == model.query("T", key, 0, 1 << 62)


def test_tier_basics(make_tier, tmp_path):
    tier = make_tier("t")
    (tmp_path / "src").write_bytes(b"0123456789")
    key = tier.new_key("a.cidx")
    assert key.startswith("index/a.cidx.") and key != tier.new_key("a.cidx")
    tier.put(key, tmp_path / "src")
    with pytest.raises(AlreadyExists):
        tier.put(key, tmp_path / "src")  # immutable: never replaced
    assert tier.keys() == {key: 10}
    assert TierReader(tier, key, 10).read(3, 4) == b"3456"
    assert (tier.reads_total, tier.read_bytes_total) == (1, 4)
    tier.delete(key)
    assert tier.keys() == {}
    with pytest.raises(DataLoss, match="missing from the tier"):  # not NOT_FOUND: a query would say "no such key"
        tier.read(key, 0, 1)


def test_a_reader_on_a_file_tier_opens_its_object_once_and_releases_it_at_close(make_tier, tmp_path, monkeypatch):
    """A query reads a tier file 2-8 times: on a file:// tier the object stays open between reads (a pread each, as
    the local files), from the first read until the reader's close; a missing object is DataLoss at that read."""
    tier = make_tier("t")
    (tmp_path / "src").write_bytes(bytes(range(100)))
    key = tier.new_key("a.cidx")
    tier.put(key, tmp_path / "src")
    opened: list[int] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if str(path).endswith(key):
            opened.append(fd)
        return fd
    monkeypatch.setattr(os, "open", counting_open)
    reader = TierReader(tier, key, 100)
    assert [reader.read(i * 10, 3) for i in range(5)] == [bytes(range(i * 10, i * 10 + 3)) for i in range(5)]
    assert len(opened) == 1 and (tier.reads_total, tier.read_bytes_total) == (5, 15)
    tier.delete(key)
    assert reader.read(97, 10) == bytes(range(97, 100))  # objects never change: the open one reads on
    reader.close()
    with pytest.raises(OSError):
        os.fstat(opened[0])  # released
    with pytest.raises(DataLoss, match="missing from the tier"):
        reader.read(0, 1)  # closed: read by key, and the object is gone
    with pytest.raises(DataLoss, match="missing from the tier"):
        TierReader(tier, key, 100).read(0, 1)
    verifying = TierReader(tier, tier.new_key("b.cidx"), 100, verifying=True)
    with pytest.raises(DataLoss):
        verifying.read(0, 1)  # a move's read back goes by key, through the writes store
    assert len(opened) == 1


def test_a_put_streams_the_file_never_reading_it_whole(make_tier, tmp_path, monkeypatch):
    tier = make_tier("t")
    source = tmp_path / "a.cidx"
    source.write_bytes(bytes(range(256)) * 64)

    def whole(path):
        raise AssertionError(f"{path} read whole into memory")
    monkeypatch.setattr(type(source), "read_bytes", whole)
    key = tier.new_key(source.name)
    tier.put(key, source)  # from a read-only memory map (ObjectStore.put_file)
    assert tier.keys() == {key: 256 * 64}
    assert TierReader(tier, key, 256 * 64).read(250, 12) == bytes(range(250, 256)) + bytes(range(6))


def test_tier_config_takes_file_and_s3_urls_and_the_aws_variables():
    config = IndexTierConfig(tier_url="s3://bucket/idx").with_env(
        {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "id",
         "AWS_SECRET_ACCESS_KEY": "secret"})
    assert (config.tier_endpoint, config.tier_region, config.credentials.access_key_id) == (
        "http://127.0.0.1:9", "eu-west-1", "id")
    assert "secret" not in repr(config) and "credentials" not in config.described()
    for bad in ("memory://x", "gcs://b/p"):
        with pytest.raises(InvalidArgument, match="fsspec URLs are no longer taken"):
            IndexTierConfig(tier_url=bad)
    assert IndexTierConfig().tier_multipart_bytes == 16 << 20  # the commit log's default
    with pytest.raises(InvalidArgument, match="at least 5 MiB"):
        IndexTierConfig(tier_url="s3://bucket/idx", tier_multipart_bytes=(5 << 20) - 1)


def test_move_respects_age_and_keeps_answers(setup):
    store, tier, clock, model = setup
    before = {k: all_pages(store, "T", k) for k in KEYS}
    assert store.convert_sealed(100) == 4
    assert store.move_to_tier(100) == 0  # younger than tier_min_age_ms
    clock.advance(120_000)
    assert store.move_to_tier(100) == 4
    stats = store.stats()
    assert (stats.files_unsealed, stats.files_compact_local, stats.files_compact_tier) == (1, 0, 4)
    assert len(tier.keys()) == 4
    for key in KEYS:
        assert all_pages(store, "T", key) == before[key] == model.query("T", key, 0, 1 << 62)


def test_reads_per_query_at_most_two_per_compact_file(setup):
    store, tier, clock, model = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    store.move_to_tier(100)
    for key in KEYS:
        reads_before = tier.reads_total
        result = store.query("T", key)
        compact_files = result.files_scanned - 1  # the newest file is unsealed (local mmap)
        assert result.reads == tier.reads_total - reads_before
        assert result.reads <= 2 * compact_files
    stats = store.stats()
    assert stats.max_reads_per_file <= 2
    assert stats.queries == len(KEYS) and stats.reads_per_query <= 8


def test_retention_deletes_tier_files(setup):
    store, tier, clock, _ = setup
    store.convert_sealed(100)
    clock.advance(120_000)
    store.move_to_tier(100)
    assert store.delete_before(10**9) == 4
    assert tier.keys() == {} and TierManifest.load(store.config.index_dir, tier.name).finished == {}
    assert all_pages(store, "T", KEYS[0]) == [3600]  # only the newest file (3300..4000) is left


def test_maintainer_thread_converts_in_the_background(setup):
    store, tier, clock, _ = setup
    maintainer = IndexMaintainer(store)
    maintainer.start()
    try:
        maintainer.wake()
        for _ in range(50):
            assert maintainer.round_done.wait(5.0)
            maintainer.round_done.clear()
            if store.stats().files_compact_local == 4:
                break
        assert store.stats().files_compact_local == 4 and store.stats().healthy
    finally:
        maintainer.stop(5.0)


def test_failed_round_marks_unhealthy(setup, monkeypatch):
    store, _, _, _ = setup
    maintainer = IndexMaintainer(store)

    def broken(max_files=1):
        raise OSError("disk on fire")

    monkeypatch.setattr(store, "convert_sealed", broken)
    maintainer.start()
    try:
        maintainer.wake()
        assert maintainer.round_done.wait(5.0)
        stats = store.stats()
        assert not stats.healthy and "disk on fire" in stats.last_error
    finally:
        maintainer.stop(5.0)


def test_queries_run_while_writing_converting_and_moving(tmp_path):
    """Readers, the writer and maintenance at once: no errors, and the final answers are complete."""
    import threading

    clock = FakeClock(BASE_MS)
    (tmp_path / "tier").mkdir()
    tier = open_tier(IndexTierConfig(tier_url=dir_url(tmp_path / "tier")))
    store = IndexStore(tiny_config(tmp_path, slot_count=3, entry_count=9, max_keys_per_message=2),
                       clock=clock, tier=tier)
    store.start()
    model, errors, done = Model(), [], threading.Event()

    def reader():
        while not done.is_set():
            try:
                for key in KEYS:
                    all_pages(store, "T", key, max_num=3)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
                return

    # two readers: each tier read hops to the tier's threads, and three slowed the writer 2-3x on a loaded machine
    threads = [threading.Thread(target=reader, name=f"reader-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        for i in range(1, 301):
            rec = record(100 * i, [KEYS[i % 6]], ts_ms=BASE_MS - 400_000 + 1000 * i)
            store.apply([rec], 100 * i + 100)
            model.add(rec)
            if i % 20 == 0:
                store.convert_sealed(10)
                store.move_to_tier(2)
    finally:
        done.set()
        for thread in threads:
            thread.join(10.0)
    assert errors == []
    for key in KEYS:
        assert all_pages(store, "T", key) == model.query("T", key, 0, 1 << 62)
    assert store.stats().files_compact_tier > 0
    store.close()
    tier.close()


def test_tier_files_keep_one_descriptor_each_and_release_it(tmp_path, make_tier):
    import os

    before = len(os.listdir("/proc/self/fd"))
    tier = make_tier("fds")
    clock = FakeClock(BASE_MS)
    store = IndexStore(tiny_config(tmp_path, slot_count=3, entry_count=9, max_keys_per_message=2,
                                   tier_min_age_ms=60_000), clock=clock, tier=tier)
    store.start()
    store.apply([record(100 * i, [KEYS[i % 6]], ts_ms=BASE_MS + 1000 * i) for i in range(1, 41)], 4100)
    store.convert_sealed(100)
    clock.advance(120_000)
    assert store.move_to_tier(100) == 4
    for key in KEYS:
        all_pages(store, "T", key)
    store.close()
    tier.close()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_the_service_flags_take_tier_urls_and_tier_dir_as_an_alias(tmp_path):
    from index_service.main import build_arg_parser, parse_config

    base = ["--data-dir", str(tmp_path)]
    assert parse_config(base, {}).tier.tier_url == ""
    aliased = parse_config(base + ["--tier-dir", str(tmp_path / "t")], {})
    assert aliased.tier.tier_url == f"file://{(tmp_path / 't').resolve()}"
    s3 = parse_config(base + ["--tier-url", "s3://b/idx", "--tier-read-timeout-ms", "700",
                              "--tier-multipart-bytes", str(8 << 20)],
                      {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "id"})
    assert (s3.tier.tier_url, s3.tier.tier_read_timeout_ms, s3.tier.tier_endpoint, s3.tier.credentials.access_key_id) \
        == ("s3://b/idx", 700, "http://127.0.0.1:9", "id")
    assert s3.tier.tier_multipart_bytes == 8 << 20
    with pytest.raises(InvalidArgument, match="not both"):
        parse_config(base + ["--tier-dir", "/x", "--tier-url", "file:///y"], {})
    with pytest.raises(InvalidArgument, match="fsspec"):
        parse_config(base + ["--tier-url", "memory://x"], {})
    text = build_arg_parser().format_help()
    for flag in ("--tier-url", "--tier-dir", "--tier-endpoint", "--tier-region", "--tier-call-timeout-ms",
                 "--tier-read-timeout-ms", "--tier-multipart-bytes"):
        assert flag in text
    assert "--credentials" not in text


def test_a_tier_directory_of_the_old_layout_is_refused_with_the_way_to_migrate(tmp_path):
    from mqstore.index.tier import check_no_old_layout

    old = tmp_path / "tier"
    old.mkdir()
    config = IndexTierConfig(tier_url=dir_url(old))
    check_no_old_layout(config, tmp_path / "index")  # empty: a new tier
    (old / "00000000000000000000.cidx").write_bytes(b"x")  # what DirectoryTier left at the top
    with pytest.raises(FailedPrecondition, match=r"old --tier-dir layout .* rebuilt from the commit log"):
        check_no_old_layout(config, tmp_path / "index")
