"""The compaction tier's manifest in the object store (mqstore.compaction.tier_manifest) on a file:// tier: a change
puts one new object holding only what changed (its bytes pinned by a golden file), snapshots bound the chain a
load reads and the objects kept, every object is new (put-if-absent, never overwritten), the whole-manifest
versions before are read once and deleted later, and a change missing from the chain is DATA_LOSS."""

from __future__ import annotations

import pathlib

import pytest

from mqstore.compaction.tier_manifest import FINISHED, STARTED, Manifest, TieredSegment
from mqstore.errors import DataLoss, FailedPrecondition, Unavailable
from mqstore.tier.urls import open_store
from tests.conftest import golden_bytes

ROOT = "compaction/a"


def _segment(base: int, state: str = FINISHED, topic: str = "kv") -> TieredSegment:
    return TieredSegment(topic, 0, base, f"{ROOT}/segments/{topic}/0/{base:020d}.{base:032x}", 4096, "ab" * 32,
                         "cd" * 32, state)


@pytest.fixture
def stores(tmp_path):
    (tmp_path / "tier").mkdir()
    url = f"file://{tmp_path / 'tier'}"
    writes, reads = open_store(url, timeout_ms=30_000), open_store(url, timeout_ms=30_000)
    yield writes, reads
    writes.close()
    reads.close()


def _objects(tmp_path: pathlib.Path) -> dict[str, bytes]:
    root = tmp_path / "tier" / ROOT / "manifest"
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())} if root.is_dir() else {}


def _loaded(stores) -> Manifest:
    manifest = Manifest(*stores, ROOT)
    manifest.load()
    return manifest


def test_a_change_puts_only_what_changed(stores, tmp_path, request):
    manifest = _loaded(stores)
    manifest.save({s.where: s for s in (_segment(b) for b in range(0, 200 * 4096, 4096))})
    big = _objects(tmp_path)["00000000000000000001.json"]
    segments = manifest.segments()
    segments[("kv", 0, 0)] = _segment(0, STARTED, topic="kv")
    del segments[("kv", 0, 4096)]
    manifest.save(segments)
    delta = _objects(tmp_path)["00000000000000000002.json"]
    assert delta == golden_bytes("compaction_manifest_delta.json", delta, request)
    assert len(delta) < len(big) / 100  # one entry put, one dropped: not the 200 entries
    assert _loaded(stores).segments() == segments


def test_snapshots_bound_the_chain_and_the_objects_kept(stores, tmp_path, request):
    manifest = _loaded(stores)
    manifest.max_deltas, manifest.min_deltas = 5, 2
    segments = {}
    for n in range(40):
        entry = _segment(n * 4096)
        segments[entry.where] = entry
        manifest.save(dict(segments))
        names = list(_objects(tmp_path))
        assert len(names) <= 2 * 5 + 2  # the chain of the snapshot before the newest and the newest's
        assert _loaded(stores).segments() == segments
    snapshots = [n for n in _objects(tmp_path) if n.endswith(".snapshot.json")]
    assert len(snapshots) == 2 and min(_objects(tmp_path))[:20] == snapshots[0][:20]  # nothing below the older one
    first = _objects(tmp_path)[snapshots[0]]
    assert first == golden_bytes("compaction_manifest_snapshot.json", first, request)


def test_the_whole_manifest_versions_before_are_read_once_then_deleted(stores, tmp_path):
    old = '{\n "version": 1,\n "seq": %d,\n "segments": [%s]\n}'
    entry = ('{"topic": "kv", "queue_id": 0, "segment_base": %d, "key": "%s", "segment_size": 4096, '
             '"sha256": "%s", "index_sha256": "%s", "state": "FINISHED"}')
    writes, _ = stores
    for seq, bases in ((4, [0]), (5, [0, 4096])):
        body = old % (seq, ", ".join(entry % (b, _segment(b).key, "ab" * 32, "cd" * 32) for b in bases))
        writes.put_if_absent(f"{ROOT}/manifest/{seq:020d}.json", body.encode())
    manifest = _loaded(stores)
    assert manifest.segments() == {s.where: s for s in (_segment(0), _segment(4096))}
    manifest.max_deltas, manifest.min_deltas = 3, 1
    segments = manifest.segments()
    segments[("kv", 0, 8192)] = _segment(8192)
    manifest.save(segments)  # a change, and a snapshot at once: its base was a whole version
    assert {"00000000000000000006.json", "00000000000000000006.snapshot.json"} <= set(_objects(tmp_path))
    assert _loaded(stores).segments() == segments
    for n in range(8):
        segments[("kv", 0, 12288 + 4096 * n)] = _segment(12288 + 4096 * n)
        manifest.save(dict(segments))
    assert "00000000000000000005.json" not in _objects(tmp_path)  # gone with the chains before
    assert _loaded(stores).segments() == segments


def test_a_change_missing_from_the_chain_is_data_loss(stores, tmp_path):
    manifest = _loaded(stores)
    for n in range(4):
        manifest.save({s.where: s for s in (_segment(b * 4096) for b in range(n + 1))})
    (tmp_path / "tier" / ROOT / "manifest" / "00000000000000000003.json").unlink()
    with pytest.raises(DataLoss, match="00000000000000000003.json is missing"):
        _loaded(stores)


def _landing_then_failing(manifest: Manifest, monkeypatch) -> None:
    """The next put of ``manifest`` lands but reports an error (a timeout after the write, pulsar#17228)."""
    put = manifest.writes.put_if_absent

    def landed_then_failed(key, data):
        put(key, data)
        monkeypatch.setattr(manifest.writes, "put_if_absent", put)
        raise Unavailable(f"object storage tier: PUT {key} timed out (injected after the write)")
    monkeypatch.setattr(manifest.writes, "put_if_absent", landed_then_failed)


def test_a_change_that_landed_but_reported_an_error_is_taken_as_written(stores, tmp_path, monkeypatch):
    manifest = _loaded(stores)
    manifest.save({s.where: s for s in (_segment(0),)})
    _landing_then_failing(manifest, monkeypatch)
    second = {s.where: s for s in (_segment(0), _segment(4096))}
    with pytest.raises(Unavailable):
        manifest.save(second)
    # the duty retries with what it holds by then: the change that landed is ours, not another writer's
    third = {s.where: s for s in (_segment(0), _segment(4096), _segment(8192))}
    manifest.save(third)
    assert manifest.segments() == third
    assert _loaded(stores).segments() == third
    assert sorted(_objects(tmp_path)) == [f"{n:020d}.json" for n in (1, 2, 3)]


def test_a_change_that_did_not_land_is_written_again_and_another_writers_is_fenced(stores, tmp_path, monkeypatch):
    manifest = _loaded(stores)
    manifest.save({s.where: s for s in (_segment(0),)})

    def failed(key, data):
        raise Unavailable(f"object storage tier: PUT {key} refused (injected)")
    monkeypatch.setattr(manifest.writes, "put_if_absent", failed)
    with pytest.raises(Unavailable):
        manifest.save({s.where: s for s in (_segment(0), _segment(4096))})
    monkeypatch.undo()
    second = {s.where: s for s in (_segment(0), _segment(8192))}
    manifest.save(second)  # nothing landed: seq 2 is this change
    assert _loaded(stores).segments() == second
    _landing_then_failing(manifest, monkeypatch)
    with pytest.raises(Unavailable):
        manifest.save({s.where: s for s in (_segment(0),)})
    # what is at seq 3 now is not what this writer put: another writer of the instance put its own change there
    (tmp_path / "tier" / ROOT / "manifest" / "00000000000000000003.json").unlink()
    manifest.writes.put_if_absent(f"{ROOT}/manifest/{3:020d}.json", b'{"version": 2, "seq": 3}')
    with pytest.raises(FailedPrecondition, match="another process"):
        manifest.save(second)
