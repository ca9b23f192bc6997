"""The Index's tier manifest (mqstore.index.tier_manifest; layout mqstore.format.tier_manifest_log): its bytes
pinned by golden files; a change appends one record and rewrites nothing; recovery is the snapshot plus the log's
valid prefix (a torn tail cut, never served; damage before the tail stops the start); a crash between a snapshot
and the log's truncation, and a power cut that undid the truncation, replay nothing twice; the whole-file
manifest of the version before is read once and replaced by a snapshot (also across a crash in that upgrade);
random changes and restarts against a dict model (seed printed; rerun with MQSTORE_SEED=<n>)."""

from __future__ import annotations

import json
import os
import random

import pytest

from mqstore import failpoints
from mqstore.errors import DataLoss, FailedPrecondition
from mqstore.format import tier_manifest_log as L
from mqstore.format.compact_index import CompactHeader
from mqstore.index.tier_manifest import LOG_NAME, OLD_NAME, SNAPSHOT_NAME, TierFile, TierManifest
from tests.conftest import golden_bytes

URL = "file:///tier"


def _header(first: int) -> CompactHeader:
    return CompactHeader(1_700_000_000_000, 1_700_000_060_000 + first, first, first + 999, 4, 3, 8, 0x11, 0x22)


def _file(first: int, attempt: int) -> tuple[str, str, TierFile]:
    name, header = f"{first:020d}.cidx", _header(first)
    key = f"index/{name}.{attempt:032x}"
    return name, key, TierFile(key, header.size_bytes, header)


def _state(manifest: TierManifest) -> tuple[dict, dict]:
    return dict(manifest.started), dict(manifest.finished)


def _opened(directory) -> TierManifest:
    """What the index's start does: load, then settle."""
    manifest = TierManifest.load(directory, URL)
    manifest.settle()
    return manifest


# ---- the format ------------------------------------------------------------------------------------------------

def _records() -> list[L.Record]:
    header = _header(4096).encode()
    attempt = bytes(range(16))
    return [L.Record(L.STARTED, 7, 4096, attempt), L.Record(L.FINISHED, 8, 4096, attempt, 100, header),
            L.Record(L.DISCARDED, 9, 8192), L.Record(L.FORGOTTEN, 10, 4096)]


def test_log_records_golden_and_checks(request):
    records = _records()
    data = b"".join(L.encode_record(r) for r in records)
    assert data == golden_bytes("tier_manifest_log.bin", data, request)
    assert L.RECORD_SIZE == 112 and len(data) == 4 * 112
    first = data[:112]
    assert first[4:8] == b"\x01\x01\x00\x00" and first[8:16] == (7).to_bytes(8, "big")
    assert first[16:24] == (4096).to_bytes(8, "big") and first[24:40] == bytes(range(16))
    assert data[112 + 40:112 + 48] == (100).to_bytes(8, "big") and data[112 + 48:112 + 112] == _header(4096).encode()
    assert L.decode_log(data, "x") == (records, len(data))
    for cut in (1, 60, 111):  # a torn tail: cut, never served
        assert L.decode_log(data + first[:cut], "x") == (records, len(data))
    flipped = data[:-1] + bytes([data[-1] ^ 1])  # the last record fails its CRC: a torn tail too
    assert L.decode_log(flipped, "x") == (records[:3], 3 * 112)
    damaged = data[:150] + bytes([data[150] ^ 1]) + data[151:]  # the second fails, later ones check: damage
    with pytest.raises(DataLoss, match="damage, not a torn tail"):
        L.decode_log(damaged, "x")


def test_snapshot_golden_and_checks(request):
    records = _records()[:2]
    snapshot = L.Snapshot(8, URL, tuple(records))
    data = L.encode_snapshot(snapshot)
    assert data == golden_bytes("tier_manifest_snapshot.bin", data, request)
    assert data[:18] == bytes.fromhex("4D51544D" "00000001" "0000000000000008" "000C")
    assert data[18:30] == URL.encode() and data[30:34] == b"\x00\x00\x00\x02" and len(data) == 34 + 2 * 112 + 4
    assert L.decode_snapshot(data, "x") == snapshot
    for bad in (data[:-1], data[:20], data[:40] + bytes([data[40] ^ 1]) + data[41:], b"XXXX" + data[4:],
                data + b"\x00"):
        with pytest.raises(DataLoss):
            L.decode_snapshot(bad, "x")


# ---- changes ---------------------------------------------------------------------------------------------------

def test_a_change_appends_one_record_and_rewrites_nothing(tmp_path):
    """The cost of a change does not grow with the files on the tier: one 112-byte append, the snapshot as it was."""
    manifest = _opened(tmp_path)
    for first in range(1, 201):
        name, key, entry = _file(first, first)
        manifest.start(name, key)
        manifest.finish(name, entry)
    snapshot = tmp_path / SNAPSHOT_NAME
    before, identity = snapshot.read_bytes(), os.stat(snapshot).st_ino
    size = (tmp_path / LOG_NAME).stat().st_size
    name, key, entry = _file(500, 500)
    manifest.start(name, key)
    manifest.finish(name, entry)
    manifest.forget(_file(1, 1)[0])
    assert (tmp_path / LOG_NAME).stat().st_size == size + 3 * L.RECORD_SIZE
    assert snapshot.read_bytes() == before and os.stat(snapshot).st_ino == identity
    assert _state(TierManifest.load(tmp_path, URL)) == _state(manifest)
    assert not (tmp_path / OLD_NAME).exists()


def test_the_log_is_compacted_into_a_snapshot_at_its_limits(tmp_path):
    manifest = _opened(tmp_path)
    manifest.max_log_records, manifest.min_log_records = 10, 4
    for first in range(1, 40):
        name, key, entry = _file(first, first)
        manifest.start(name, key)
        manifest.finish(name, entry)
        assert (tmp_path / LOG_NAME).stat().st_size < 10 * L.RECORD_SIZE
    snapshot = L.decode_snapshot((tmp_path / SNAPSHOT_NAME).read_bytes(), "x")
    assert len(snapshot.records) >= 30 and 0 < snapshot.seq <= manifest.seq
    manifest.max_log_records = 1000  # and at log_size_factor x the snapshot's bytes
    for first in range(1, 40):
        manifest.forget(_file(first, first)[0])
    assert (tmp_path / LOG_NAME).stat().st_size < 2 * (tmp_path / SNAPSHOT_NAME).stat().st_size + L.RECORD_SIZE
    assert _state(_opened(tmp_path)) == _state(manifest) == ({}, {})


def test_a_snapshot_keeps_a_file_that_is_both_finished_and_started_again(tmp_path):
    """A snapshot is a state: its FINISHED record of a file does not end the file's newer STARTED attempt (the
    log replays FINISHED as the end of an attempt; a snapshot sorted STARTED first lost it; seed 332322857)."""
    manifest = _opened(tmp_path)
    name, key, entry = _file(7, 1)
    manifest.start(name, key)
    manifest.finish(name, entry)
    again = _file(7, 2)[1]
    manifest.start(name, again)
    manifest._compact()
    assert L.decode_snapshot((tmp_path / SNAPSHOT_NAME).read_bytes(), "x").seq == manifest.seq
    assert _state(_opened(tmp_path)) == _state(manifest) == ({name: again}, {name: entry})


# ---- recovery --------------------------------------------------------------------------------------------------

def _filled(tmp_path, count: int = 6) -> TierManifest:
    manifest = _opened(tmp_path)
    for first in range(1, count + 1):
        name, key, entry = _file(first, first)
        manifest.start(name, key)
        if first % 3:
            manifest.finish(name, entry)
    return manifest


@pytest.mark.parametrize("cut", [1, 56, 111, 112])
def test_a_torn_tail_is_cut_and_never_served(tmp_path, cut):
    """A crash during an append leaves part of a record (or all of it, with bytes that do not check): the change
    was never relied on. A load serves the state before it; the start cuts it; the next change appends after."""
    manifest = _filled(tmp_path)
    expected = _state(manifest)
    good = (tmp_path / LOG_NAME).stat().st_size
    record = L.encode_record(L.Record(L.FORGOTTEN, manifest.seq + 1, 1))
    torn = record[:cut] if cut < len(record) else record[:-1] + bytes([record[-1] ^ 0xFF])
    with open(tmp_path / LOG_NAME, "ab") as f:
        f.write(torn)
    assert _state(TierManifest.load(tmp_path, URL)) == expected
    again = _opened(tmp_path)
    assert (tmp_path / LOG_NAME).stat().st_size == good and _state(again) == expected
    again.forget(_file(1, 1)[0])
    assert _state(TierManifest.load(tmp_path, URL)) == _state(again) and _file(1, 1)[0] not in again.finished


def test_an_append_that_fails_midway_is_cut_before_the_next(tmp_path, monkeypatch):
    """A full disk after part of a record: the change raises and is not applied; the next change first cuts the
    part (else a later load would find a bad record before good ones: damage)."""
    manifest = _filled(tmp_path)
    expected, good = _state(manifest), (tmp_path / LOG_NAME).stat().st_size
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[:50]))
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        manifest.forget(_file(1, 1)[0])
    monkeypatch.undo()
    assert _state(manifest) == expected and (tmp_path / LOG_NAME).stat().st_size == good + 50
    manifest.forget(_file(2, 2)[0])
    assert (tmp_path / LOG_NAME).stat().st_size == good + L.RECORD_SIZE
    assert _state(TierManifest.load(tmp_path, URL)) == _state(manifest) and _file(1, 1)[0] in manifest.finished


def test_damage_before_the_tail_stops_the_start(tmp_path):
    _filled(tmp_path)
    data = bytearray((tmp_path / LOG_NAME).read_bytes())
    data[L.RECORD_SIZE + 10] ^= 1  # the second record, with good ones after it
    (tmp_path / LOG_NAME).write_bytes(bytes(data))
    with pytest.raises(DataLoss, match="damage"):
        TierManifest.load(tmp_path, URL)


def test_a_crash_between_the_snapshot_and_the_logs_truncation_replays_nothing_twice(tmp_path, failpoint):
    """The change that compacts dies once the snapshot is durable, before the log is truncated (or a power cut
    undid the truncation): the log's records are all in the snapshot. A load skips them (their seq) and serves
    the snapshot's state, the start truncates the log, and changes go on from there."""
    manifest = _filled(tmp_path)
    manifest.max_log_records = manifest.seq + 1  # the next change compacts
    with failpoint.armed("index.tier_manifest.snapshot_written"), pytest.raises(failpoints.FailpointHit):
        manifest.forget(_file(1, 1)[0])
    expected = _state(manifest)
    assert _file(1, 1)[0] not in expected[1]
    stale = (tmp_path / LOG_NAME).read_bytes()
    assert len(stale) == manifest.seq * L.RECORD_SIZE  # every change since the first is still in the log
    assert L.decode_snapshot((tmp_path / SNAPSHOT_NAME).read_bytes(), "x").seq == manifest.seq
    loaded = TierManifest.load(tmp_path, URL)
    assert _state(loaded) == expected and loaded.seq == manifest.seq
    again = _opened(tmp_path)
    assert (tmp_path / LOG_NAME).stat().st_size == 0 and _state(again) == expected
    again.discard(_file(3, 3)[0])
    again.start(*_file(2, 77)[:2])
    assert (tmp_path / LOG_NAME).stat().st_size == 2 * L.RECORD_SIZE
    assert _state(_opened(tmp_path)) == _state(again) != expected


def test_a_gap_after_the_snapshot_is_data_loss(tmp_path):
    manifest = _filled(tmp_path)
    record = L.encode_record(L.Record(L.FORGOTTEN, manifest.seq + 2, 1))  # seq + 1 is missing
    with open(tmp_path / LOG_NAME, "ab") as f:
        f.write(record)
    with pytest.raises(DataLoss, match="seq"):
        TierManifest.load(tmp_path, URL)


def _old_json(tmp_path, manifest_state: tuple[dict, dict], url: str = URL) -> None:
    """The whole-file manifest as the version before wrote it."""
    started, finished = manifest_state
    body = {"version": 1, "url": url, "started": dict(sorted(started.items())),
            "finished": {name: {"key": f.key, "size": f.size, "header": f.header.encode().hex()}
                         for name, f in sorted(finished.items())}}
    (tmp_path / OLD_NAME).write_bytes(json.dumps(body, indent=1).encode())


def test_the_whole_file_manifest_of_the_version_before_is_read_once(tmp_path, failpoint):
    """The upgrade: tier-manifest.json read, its state written as a snapshot, then it goes; a crash after the
    snapshot and before it went: the snapshot is the truth (a change made since is kept), the json goes."""
    (tmp_path / "src").mkdir()
    source = _filled(tmp_path / "src")
    expected = _state(source)
    _old_json(tmp_path, expected)
    loaded = TierManifest.load(tmp_path, URL)
    assert _state(loaded) == expected and not (tmp_path / SNAPSHOT_NAME).exists()  # (a load writes nothing)
    with pytest.raises(FailedPrecondition, match="--tier-url file:///tier"):
        TierManifest.load(tmp_path, "file:///elsewhere")
    with failpoint.armed("index.tier_manifest.snapshot_written"), pytest.raises(failpoints.FailpointHit):
        TierManifest.load(tmp_path, URL).settle()
    assert (tmp_path / OLD_NAME).exists() and (tmp_path / SNAPSHOT_NAME).exists()
    manifest = TierManifest.load(tmp_path, URL)
    assert _state(manifest) == expected
    manifest.forget(_file(1, 1)[0])  # (settles first: the json goes)
    assert not (tmp_path / OLD_NAME).exists()
    assert _state(_opened(tmp_path)) == _state(manifest) and _file(1, 1)[0] not in manifest.finished
    _old_json(tmp_path, expected)  # a json next to a snapshot is a leftover of the upgrade, never read again
    assert _state(_opened(tmp_path)) == _state(manifest) and not (tmp_path / OLD_NAME).exists()


def test_another_url_is_refused_and_an_empty_manifest_takes_the_new_one(tmp_path):
    _filled(tmp_path)
    with pytest.raises(FailedPrecondition, match="started with no tier"):
        TierManifest.load(tmp_path, "")
    other = tmp_path / "other"
    other.mkdir()
    manifest = _opened(other)
    manifest.start(*_file(1, 1)[:2])
    manifest.discard_all()
    moved = TierManifest.load(other, "file:///elsewhere")  # nothing on the tier: another URL is taken
    moved.start(*_file(2, 2)[:2])
    assert TierManifest.load(other, "file:///elsewhere").started == {_file(2, 2)[0]: _file(2, 2)[1]}
    with pytest.raises(FailedPrecondition):
        TierManifest.load(other, URL)


def test_random_changes_and_restarts_against_a_model(tmp_path):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    started: dict[str, str] = {}
    finished: dict[str, TierFile] = {}
    manifest = _opened(tmp_path)
    for step in range(600):
        manifest.max_log_records, manifest.min_log_records = rng.choice([(8, 2), (50, 10), (4096, 64)])
        first = rng.randrange(1, 30)
        name, key, entry = _file(first, step + 1)
        choice = rng.random()
        if choice < 0.35:
            manifest.start(name, key)
            started[name] = key
        elif choice < 0.6 and name in started:
            entry = TierFile(started[name], entry.size, entry.header)
            manifest.finish(name, entry)
            del started[name]
            finished[name] = entry
        elif choice < 0.7 and name in started:
            manifest.discard(name)
            del started[name]
        elif choice < 0.85 and name in finished:
            assert manifest.forget(name) == finished.pop(name)
        elif choice < 0.88:
            manifest.discard_all()
            started.clear()
        elif choice < 0.95:
            if rng.random() < 0.5:  # a crash mid-append: a torn tail
                with open(tmp_path / LOG_NAME, "ab") as f:
                    f.write(bytes(rng.randrange(256) for _ in range(rng.randrange(1, L.RECORD_SIZE))))
            manifest = _opened(tmp_path)
        assert (manifest.started, manifest.finished) == (started, finished), f"seed={seed} step={step}"
    assert _state(_opened(tmp_path)) == (started, finished), f"seed={seed}"
