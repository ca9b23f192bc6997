"""Compaction log segments in the object storage tier (mqstore.compaction.tier) on a file:// tier: the upload's
two phases in the tier's manifest, local retention only after FINISHED, reads and rounds of segments only in
the tier byte-identical to local ones, a restart rebuilding the map from the tier alone, a crash between the
phases finished by the next pass with no orphan, and the read path's errors (UNAVAILABLE naming the tier,
DATA_LOSS on a short object).
"""

from __future__ import annotations

import pytest

from mqstore import failpoints
from mqstore.compaction import reads
from mqstore.compaction.store import CompactionStore
from mqstore.compaction.tier import FINISHED, STARTED, TierDuty, open_tier
from mqstore.compaction.tier_config import CompactionTierConfig
from mqstore.errors import DataLoss, FailedPrecondition, InvalidArgument, Unavailable
from mqstore.format import compaction_segment as cseg
from mqstore.metrics import Registry
from mqstore.tier.local import LocalBackend
from mqstore.tier.reads import BlockCache
from tests.support.compaction import put
from tests.support.compaction_tier import CONFIG, Rig, everything, fill, sealed_files

@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path, local_retention_bytes=1)  # every uploaded segment leaves the local disk
    r.open()
    yield r
    r.close()


def test_upload_then_reads_and_a_restart_serve_the_tier_byte_identically(rig):
    fill(rig.store, rig.clock)
    before, files = everything(rig.store), sealed_files(rig.store)
    latest = {k: reads.get_latest(rig.store, "kv", f"k{k}").stored.raw for k in range(12)}
    assert len(files) >= 3
    rig.tier.run_pass(rig.store)
    manifest = rig.tier.segments()
    assert {w[2] for w in manifest} == set(files) and {s.state for s in manifest.values()} == {FINISHED}
    assert sorted(rig.objects().values()) == sorted(files.values())  # each object = its file, byte for byte
    qlog = rig.qlog
    assert qlog.tiered == set(files)
    assert not any((qlog.directory / cseg.log_name(b)).exists() for b in files)  # .log gone, .cq kept
    assert all((qlog.directory / cseg.index_name(b)).exists() for b in files)
    assert everything(rig.store) == before
    assert rig.tier.reader.fetched_bytes > 0
    scanned = reads.scan(rig.store, "kv", 0, 0, 100)
    assert {i.key: i.stored.raw for i in scanned.items} == {f"k{k}": v for k, v in latest.items()}
    rig.close()  # a restart: the map of tiered segments comes from the tier's manifest alone
    rig.open()
    assert rig.qlog.tiered == set(files)
    assert everything(rig.store) == before
    assert {k: reads.get_latest(rig.store, "kv", f"k{k}").stored.raw for k in latest} == latest


def test_a_round_over_tiered_segments_matches_a_local_round_and_replaces_their_objects(rig, tmp_path):
    reference = CompactionStore(tmp_path / "reference", CONFIG, rig.clock)
    fill(reference, rig.clock)
    reference.compact(reference.slot("kv", 0))
    expected = everything(reference)
    reference.close()
    fill(rig.store, rig.clock)
    rig.tier.run_pass(rig.store)
    old_keys = {s.key for s in rig.tier.segments().values()}
    pinned = rig.tier.pin(rig.qlog, rig.qlog.bases[-2])  # a read that took the last sealed one's upload before ...
    rig.store.compact(rig.store.slot("kv", 0))  # reads the tiered segments through the tier
    assert everything(rig.store) == expected
    assert rig.qlog.tiered == set() or rig.qlog.tiered < set(rig.qlog.bases)
    assert old_keys <= {s.key for s in rig.tier.segments().values()}  # not deleted before the next pass
    rig.tier.run_pass(rig.store)
    manifest = rig.tier.segments()
    assert not old_keys & {s.key for s in manifest.values()}
    assert set(rig.objects()) == {s.key for s in manifest.values()}  # the replaced objects are gone, no orphan
    assert {w[2] for w in manifest} == set(rig.qlog.bases[:-1])
    assert everything(rig.store) == expected
    assert pinned.key not in {s.key for s in manifest.values()}
    rig.tier.reader.cache = BlockCache(0)  # (its blocks cached before: the old bytes, still the pinned ones)
    with pytest.raises(Unavailable, match="replaced by a round while read; retry"):
        rig.tier.read(pinned, 0, 100)  # ... the round and the pass replaced it: retried, never another's bytes


@pytest.mark.parametrize("point", ["compaction.tier.started", "compaction.tier.after_put"])
def test_a_crash_between_the_phases_keeps_the_local_file_and_the_next_pass_leaves_no_orphan(rig, failpoint, point):
    fill(rig.store, rig.clock)
    before, files = everything(rig.store), sealed_files(rig.store)
    with failpoint.armed(point), pytest.raises(failpoints.FailpointHit):
        rig.tier.run_pass(rig.store)
    [started] = rig.tier.segments().values()
    assert started.state == STARTED and not rig.qlog.tiered
    assert sealed_files(rig.store) == files  # local retention only after FINISHED
    rig.close()
    rig.open()  # the restarted process: the STARTED attempt is discarded, its object (if put) deleted
    assert not rig.qlog.tiered
    rig.tier.run_pass(rig.store)
    manifest = rig.tier.segments()
    assert started.key not in {s.key for s in manifest.values()} and len(manifest) == len(files)
    assert set(rig.objects()) == {s.key for s in manifest.values()}
    assert everything(rig.store) == before


def test_a_put_that_succeeded_but_failed_never_deletes_the_local_file(rig):
    fill(rig.store, rig.clock)
    files = sealed_files(rig.store)
    put_file = rig.tier.writes.put_file

    def succeeds_then_fails(key, path, size):
        put_file(key, path, size)
        raise Unavailable("injected: the put succeeded, its answer was lost")
    rig.tier.writes.put_file = succeeds_then_fails
    metrics = Registry()
    rig.tier.register_metrics(metrics)
    with pytest.raises(Unavailable, match="injected"):
        rig.tier.run_pass(rig.store)
    assert sealed_files(rig.store) == files and not rig.qlog.tiered
    assert metrics.get("mqstore_compactor_tier_copy_errors_total").value == 1
    assert metrics.get("mqstore_compactor_tier_copy_lag_segments").value == len(files)
    rig.tier.writes.put_file = put_file
    rig.tier.run_pass(rig.store)
    assert rig.qlog.tiered == set(files)
    assert metrics.get("mqstore_compactor_tier_copy_lag_segments").value == 0
    assert metrics.get("mqstore_compactor_tier_copy_bytes_total").value == sum(map(len, files.values()))
    assert metrics.get("mqstore_compactor_tier_size_bytes").value == sum(map(len, files.values()))
    everything(rig.store)
    assert metrics.get("mqstore_compactor_tier_fetch_bytes_total").value > 0
    assert set(rig.objects()) == {s.key for s in rig.tier.segments().values()}


def test_local_retention_by_age_keeps_young_segments(tmp_path):
    rig = Rig(tmp_path, local_retention_ms=60_000)
    rig.open()
    try:
        fill(rig.store, rig.clock)
        rig.tier.run_pass(rig.store)
        assert len(rig.tier.segments()) >= 3 and not rig.qlog.tiered  # uploaded, younger than a minute
        rig.clock.advance(60_000)
        rig.tier.run_pass(rig.store)
        assert rig.qlog.tiered == set(rig.qlog.bases[:-1])
    finally:
        rig.close()


def test_tier_reads_fail_unavailable_naming_the_tier_and_data_loss_on_a_short_object(rig):
    fill(rig.store, rig.clock, 200)
    put(rig.store, "local", b"v", 200, rig.clock.now_ms())  # in the active segment
    rig.tier.run_pass(rig.store)
    entry = min(rig.tier.segments().values(), key=lambda s: s.segment_base)
    path = rig.tmp / "tier" / entry.key
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataLoss, match="short"):
        rig.qlog.read(0, 5)
    rig.tier.reads.close()
    with pytest.raises(Unavailable, match=str(rig.tmp / "tier")):
        rig.qlog.read(rig.qlog.index_of(150), 5)
    assert reads.get_latest(rig.store, "kv", "local").stored.entry.queue_offset == 200  # local reads answer


def test_a_start_whose_tier_lost_a_segments_upload_refuses_with_the_file(rig):
    fill(rig.store, rig.clock)
    rig.tier.run_pass(rig.store)
    rig.close()
    for path in (rig.tmp / "tier").rglob("*.json"):
        path.unlink()  # the manifest gone: the local .cq files name segments no one holds
    with pytest.raises(FailedPrecondition, match="no upload of it"):
        rig.open()
    rig.store = CompactionStore(rig.tmp / "other", CONFIG, rig.clock)  # (for the fixture's close)
    rig.tier = open_tier(rig.config, "a", rig.clock)


def test_config_checks():
    with pytest.raises(InvalidArgument, match="give --tier-url"):
        CompactionTierConfig(local_retention_ms=5)
    with pytest.raises(InvalidArgument, match="tier_url"):
        CompactionTierConfig(tier_url="http://x")
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_SECRET_ACCESS_KEY": "s"}
    config = CompactionTierConfig(tier_url="s3://b").with_env(env)
    assert config.tier_endpoint == "http://127.0.0.1:9" and "credentials" not in config.described()


def test_each_instance_keeps_its_own_segments_and_a_standby_uploads_nothing(tmp_path):
    """Two compactors on one tier (an active and a standby, each with logs of its own): the standby's duty
    uploads nothing; after a takeover the new active uploads under its own instance and never touches the
    old one's objects, which the old active, now a standby, still reads (its tiered segments), also after a
    restart."""
    first = Rig(tmp_path, local_retention_bytes=1)
    fill(first.open(), first.clock)
    before = everything(first.store)
    first.tier.run_pass(first.store)
    assert first.qlog.tiered
    second = Rig(tmp_path / "b", tier_url=first.config.tier_url, local_retention_bytes=1)
    second.tier = open_tier(second.config, "b", second.clock)
    second.store = CompactionStore(tmp_path / "b" / "logs", CONFIG, second.clock, remote=second.tier)
    fill(second.store, second.clock)
    active = {"a": True}
    TierDuty(second.tier, second.store, active=lambda: not active["a"]).step()  # a standby: nothing happens
    assert not second.tier.segments() and not second.qlog.tiered
    active["a"] = False  # the takeover
    TierDuty(first.tier, first.store, active=lambda: active["a"]).step()  # the old active: nothing happens
    TierDuty(second.tier, second.store, active=lambda: not active["a"]).step()
    assert second.qlog.tiered and {s.key.split("/")[1] for s in second.tier.segments().values()} == {"b"}
    assert {s.key for s in first.tier.segments().values()} <= set(first.objects())  # a's objects untouched
    assert everything(first.store) == before
    first.close()
    first.open()
    assert everything(first.store) == before
    first.close()
    second.close()


def test_a_second_writer_of_one_instance_is_fenced_by_the_manifest_put_if_absent(rig):
    fill(rig.store, rig.clock)
    other = open_tier(rig.config, "a", rig.clock)  # a second process given the same instance id
    try:
        rig.tier.run_pass(rig.store)
        with pytest.raises(FailedPrecondition, match="two compactors run with one instance id"):
            other.run_pass(rig.store)
    finally:
        other.close()
    assert set(rig.objects()) == {s.key for s in rig.tier.segments().values()}


def test_a_start_with_the_tier_down_checks_the_local_index_files_once_a_standby_reads_the_manifest(rig, monkeypatch):
    """A start while the file:// tier fails (its listing raises) goes on with the lone .cq files taken as tiered;
    once it answers, even a standby's duty reads the manifest, and a .cq the manifest no longer names reads
    DATA_LOSS (the others from the tier, as before)."""
    fill(rig.store, rig.clock)
    rig.tier.run_pass(rig.store)
    before, tiered = everything(rig.store), sorted(rig.qlog.tiered)
    lost = tiered[0]
    segments = rig.tier.segments()
    del segments[("kv", 0, lost)]
    rig.tier.manifest.save(segments)  # the tier lost the first segment's upload
    rig.close()

    def down(self, prefix):
        raise OSError("injected: the tier's mount is gone")
    monkeypatch.setattr(LocalBackend, "list", down)
    rig.open()
    metrics = Registry()
    rig.tier.register_metrics(metrics)
    assert not rig.tier.loaded and metrics.get("mqstore_compactor_tier_manifest_loaded").value == 0
    assert sorted(rig.qlog.tiered) == tiered
    with pytest.raises(Unavailable, match="manifest is not read yet"):
        rig.tier.run_pass(rig.store)  # nothing uploaded or deleted meanwhile
    monkeypatch.undo()
    TierDuty(rig.tier, rig.store, active=lambda: False).step()  # a standby reads its manifest too
    assert rig.tier.loaded and metrics.get("mqstore_compactor_tier_manifest_loaded").value == 1
    assert not rig.store.slot("kv", 0).keys_partial  # the key table completed from the segments the tier holds
    assert reads.get_latest(rig.store, "kv", "k11").stored.raw == next(raw for _, raw in reversed(before)
                                                                        if b"k11@" in raw)
    with pytest.raises(DataLoss, match="names no FINISHED upload"):
        rig.qlog.read(0, 5)
    at = rig.qlog.index_of(before[-1][0])
    assert [(s.entry.queue_offset, s.raw) for s in rig.qlog.read(at, 1)] == before[-1:]


def test_a_start_with_the_file_tier_directory_moved_away_serves_local_segments_then_completes(rig):
    """A file:// tier whose directory is missing is the tier down, not an empty tier (mqstore.tier.local): the
    compactor starts (its lone .cq files taken as tiered), serves its local segments, answers UNAVAILABLE naming
    the tier for the tiered ones, retries, and once the directory is back serves everything byte-identically."""
    fill(rig.store, rig.clock)
    rig.tier.run_pass(rig.store)
    put(rig.store, "fresh", b"local value", 240, rig.clock.now_ms())  # in the active (local) segment
    before, tiered = everything(rig.store), sorted(rig.qlog.tiered)
    latest = {f"k{k}": reads.get_latest(rig.store, "kv", f"k{k}").stored.raw for k in range(12)}
    assert tiered
    rig.close()
    (rig.tmp / "tier").rename(rig.tmp / "away")
    rig.open()  # (before: the manifest listed as empty and the lone .cq files refused the start)
    assert not rig.tier.loaded and sorted(rig.qlog.tiered) == tiered
    assert reads.get_latest(rig.store, "kv", "fresh").stored.raw == before[-1][1]
    at = rig.qlog.index_of(240)
    assert [(s.entry.queue_offset, s.raw) for s in rig.qlog.read(at, 1)] == before[-1:]
    tier_url = f"object storage tier file://{rig.tmp / 'tier'}"
    with pytest.raises(Unavailable, match=tier_url):
        rig.qlog.read(0, 5)
    with pytest.raises(Unavailable, match=tier_url):
        reads.get_latest(rig.store, "kv", "k0")  # its latest record may be in a tiered segment: not NOT_FOUND
    duty = TierDuty(rig.tier, rig.store)
    duty.step()  # a retry while the directory is still away: nothing changes, nothing is made in its place
    assert not rig.tier.loaded and not (rig.tmp / "tier").exists()
    (rig.tmp / "away").rename(rig.tmp / "tier")
    duty.step()
    assert rig.tier.loaded and not rig.store.slot("kv", 0).keys_partial
    assert everything(rig.store) == before
    assert {k: reads.get_latest(rig.store, "kv", k).stored.raw for k in latest} == latest
