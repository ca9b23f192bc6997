"""The tier's upload records (mqstore.format.tier_upload: golden bytes, what does not decode), their map
against a trivially correct model (mqstore.tier.ledger), and the uploader (mqstore.tier.uploader) on a real
store with a file:// tier, step by step: byte identity, a put that succeeded but reported an error is
finished and never deleted, an attempt cut before its put is discarded and redone, orphans are swept, a
restart reads the ledger from the log, a node that does not lead uploads nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import uuid

import pytest

from mqstore import failpoints
from mqstore.failpoints import FailpointHit
from mqstore.format import crc64, tier_upload
from mqstore.format.tier_upload import DELETED, DISCARDED, FINISHED, STARTED, Upload
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger, UploadMap
from mqstore.tier.sealed import sealed_segments
from mqstore.tier.uploader import Uploader, object_key
from mqstore.tier.urls import open_store
from tests.conftest import golden_bytes
from tests.support.crc64 import crc64nvme
from tests.support.waiting import wait_until

SEGMENT = 16 * 1024


def _upload(state=STARTED, base=0, upload_id=None, size=SEGMENT, epoch=3) -> Upload:
    upload_id = upload_id or uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF)
    return Upload(state, upload_id, base, size, hashlib.sha256(b"segment").digest(), epoch, object_key(base, upload_id))


# ---- the format -----------------------------------------------------------------------------------------

def test_tier_upload_golden(request):
    upload = _upload(STARTED, base=1 << 30)
    data = tier_upload.encode(upload)
    assert data == golden_bytes("tier_upload.bin", data, request)
    assert data[:6] == bytes.fromhex("4d5154550101")  # magic "MQTU", version 1, STARTED
    assert data[6:22] == upload.upload_id.bytes and data[22:30] == (1 << 30).to_bytes(8, "big")
    assert data[30:38] == SEGMENT.to_bytes(8, "big") and data[38:70] == upload.digest
    assert data[70:78] == (3).to_bytes(8, "big") and data[78:80] == len(upload.key).to_bytes(2, "big")
    assert data[80:].decode() == upload.key == "commitlog/00000000001073741824/0123456789abcdef0123456789abcdef"
    assert tier_upload.decode(data) == upload
    assert tier_upload.decode(tier_upload.encode(upload.but(FINISHED))).state == FINISHED
    deleted = tier_upload.encode(upload.but(DELETED))  # state 4, added deliberately: the rest is the golden's
    assert deleted[5] == 4 and deleted[:5] + deleted[6:] == data[:5] + data[6:]
    assert tier_upload.decode(deleted) == upload.but(DELETED)


def test_a_record_with_a_crc64_digest_is_version_4_golden_and_what_does_not_decode(request):
    """A STARTED record whose digest is the file's CRC-64/NVME (what the uploader writes with the compiled codec):
    version 4, version 3's fields with the incarnation -1 for a commit log segment, the CRC big-endian in the
    digest's first 8 bytes (24 zero bytes after), then the digest kind 2; a consume queue file's likewise with its
    topic, queue and incarnation. A SHA-256 record is still version 1 (the golden above)."""
    crc = (0xAE8B14860A799888).to_bytes(8, "big")
    upload = dataclasses.replace(_upload(STARTED, base=1 << 30), digest=crc, digest_kind=tier_upload.CRC64NVME)
    data = tier_upload.encode(upload)
    assert data == golden_bytes("tier_upload_v4.bin", data, request)
    v1 = tier_upload.encode(_upload(STARTED, base=1 << 30))
    key_end = 80 + len(upload.key)
    assert data[:6] == bytes.fromhex("4d5154550401")  # magic "MQTU", version 4, STARTED
    assert data[6:38] == v1[6:38] and data[38:70] == crc + bytes(24) and data[70:key_end] == v1[70:]
    assert data[key_end:] == bytes([tier_upload.COMMITLOG]) + bytes(4) + bytes(2) + (-1).to_bytes(8, "big",
                                                                                                 signed=True) + b"\2"
    assert tier_upload.decode(data) == upload and tier_upload.decode(tier_upload.encode(upload.but(FINISHED))) == \
        upload.but(FINISHED)
    queue_file = Upload(STARTED, upload.upload_id, 320, 320, crc, 3, "consumequeue/t/2/00000000000000000320/"
                        + upload.upload_id.hex, tier_upload.CONSUME_QUEUE, "t", 2, 7 << 20, tier_upload.CRC64NVME)
    queue_data = tier_upload.encode(queue_file)
    assert queue_data == golden_bytes("tier_upload_queue_file_v4.bin", queue_data, request)
    assert queue_data[4] == 4 and queue_data[-9:] == (7 << 20).to_bytes(8, "big") + b"\2"
    assert tier_upload.decode(queue_data) == queue_file
    padded = data[:69] + b"\1" + data[70:]  # a CRC's padding not zero
    for bad in (data[:-1], data + b"x", data[:-1] + b"\3", data[:-1] + b"\0", padded,
                data[:-9] + (0).to_bytes(8, "big") + b"\2"):  # a commit log segment with an incarnation
        with pytest.raises(ValueError):
            tier_upload.decode(bad)
    for wrong in (dataclasses.replace(upload, digest=crc + b"\0"), dataclasses.replace(upload, digest_kind=3),
                  dataclasses.replace(upload, digest=hashlib.sha256(b"x").digest())):
        with pytest.raises(ValueError):
            tier_upload.encode(wrong)


def test_tier_upload_refuses_what_it_cannot_decode_or_encode():
    good = tier_upload.encode(_upload())
    for bad in (b"", good[:79], good[:-1], good + b"x", b"\0" * 4 + good[4:], good[:4] + b"\2" + good[5:],
                good[:5] + b"\5" + good[6:], good[:78] + b"\0\0" + good[80:]):
        with pytest.raises(ValueError):
            tier_upload.decode(bad)
    for wrong in (_upload(state=0), _upload(base=-1), _upload(size=0), _upload(epoch=-1)):
        with pytest.raises(ValueError):
            tier_upload.encode(wrong)


# ---- the map against a model ------------------------------------------------------------------------------

def test_the_upload_map_is_the_model_of_its_records():
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for _ in range(200):
        umap, attempts = UploadMap(), []
        finished: dict[int, uuid.UUID] = {}   # the model: the first FINISHED of a segment after its STARTED,
        deleted: set[int] = set()             # until a DELETED of that attempt
        ended: set[uuid.UUID] = set()
        started: set[uuid.UUID] = set()
        for _ in range(rng.randrange(1, 30)):
            if attempts and rng.random() < 0.6:
                attempt = rng.choice(attempts)
                record = attempt.but(rng.choice([FINISHED, DISCARDED, STARTED, DELETED]))
            else:
                attempt = _upload(base=rng.randrange(4) * SEGMENT, upload_id=uuid.UUID(int=rng.getrandbits(128)))
                attempts.append(attempt)
                record = attempt
            umap.apply(record)
            uid = record.upload_id
            if record.state == STARTED:
                if uid not in started and uid not in ended:
                    started.add(uid)
            elif record.state == DELETED:
                if finished.get(record.segment_base) == uid:
                    del finished[record.segment_base]
                started.discard(uid)
                ended.add(uid)
                deleted.add(record.segment_base)
            elif uid in started:
                started.discard(uid)
                ended.add(uid)
                if record.state == FINISHED:
                    finished.setdefault(record.segment_base, uid)
        assert {base: u.upload_id for base, u in umap.finished.items()} == finished, f"seed {seed}"
        assert set(umap.pending) == started, f"seed {seed}"
        assert set(umap.deleted) == deleted and set(umap.positions) == set(umap.finished), f"seed {seed}"


# ---- the uploader on a real store -------------------------------------------------------------------------

@pytest.fixture
def rig(small_config, tmp_path):
    made = []

    def make(leader_epoch=lambda: 0):
        store = build_store(small_config(segment_size_bytes=SEGMENT))
        store.start()
        (tmp_path / "tier").mkdir(exist_ok=True)
        tier = open_store(f"file://{tmp_path}/tier", timeout_ms=10_000)
        uploader = Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=leader_epoch,
                            ready=store.replica_view.promoted_visible, log_min=store.log_min,
                            interval_ms=10_000)
        made.append((store, tier))
        return store, tier, uploader
    yield make
    failpoints.disarm_all()
    for store, tier in made:
        tier.close()
        if store.running:
            store.stop()


def _fill(store: MessageStore, segments: int) -> None:
    """Append until ``segments`` segments are sealed (written, flushed and visible past their end)."""
    if "t" not in {t.name for t in store.topic_admin.list()}:
        store.topic_admin.create("t", 1)
    for batch in range(10_000):  # bounded: 4 records of ~1 KiB a batch
        if store.log_end() > segments * SEGMENT:
            break
        store.append("t", [MessageIn(body=bytes([batch % 256]) * 900)] * 4)
    wait_until(lambda: len(sealed_segments(store)) >= segments, f"{segments} segments sealed (flushed on roll)")


def _objects(tier) -> dict[str, bytes]:
    return {info.key: tier.get_range(info.key, 0, info.size) for info in tier.list("commitlog")}


def _segment_bytes(store, base) -> bytes:
    return next(s for s in sealed_segments(store) if s.base == base).read()


def test_sealed_segments_are_uploaded_byte_identical_once(rig):
    store, tier, uploader = rig()
    _fill(store, 2)
    uploader.step()
    finished, pending = uploader.ledger.snapshot()
    sealed = sealed_segments(store)
    assert sorted(finished) == [s.base for s in sealed] and not pending
    objects = _objects(tier)
    assert len(objects) == len(sealed)
    for segment in sealed:
        assert objects[finished[segment.base].key] == segment.read()  # byte-identical, the whole file
    active = store.segments.segments[-1]
    assert active.start not in finished  # the segment written now is not sealed
    uploader.step()
    assert _objects(tier) == objects and uploader.uploaded == len(sealed)  # nothing twice


def test_a_put_that_succeeded_but_reported_an_error_is_finished_never_deleted(rig):
    store, tier, uploader = rig()
    _fill(store, 1)
    failpoints.arm("tier.upload.after_put", "raise")  # the object is stored, the put "failed"
    with pytest.raises(FailpointHit):
        uploader.step()
    _, pending = uploader.ledger.snapshot()
    (attempt,) = pending
    assert tier.size(attempt.key) == SEGMENT
    failpoints.disarm_all()
    uploader.step()
    finished, pending = uploader.ledger.snapshot()
    assert finished[attempt.segment_base].upload_id == attempt.upload_id and not pending
    assert uploader.discarded == 0 and _objects(tier) == {attempt.key: _segment_bytes(store, attempt.segment_base)}


def test_an_attempt_cut_before_its_put_is_discarded_and_redone(rig):
    store, tier, uploader = rig()
    _fill(store, 1)
    failpoints.arm("tier.upload.started", "raise")
    with pytest.raises(FailpointHit):
        uploader.step()
    (cut,) = uploader.ledger.snapshot()[1]
    failpoints.disarm_all()
    uploader.step()
    finished, pending = uploader.ledger.snapshot()
    assert not pending and uploader.discarded == 1 and uploader.ledger.states()[cut.upload_id] == DISCARDED
    assert finished[cut.segment_base].upload_id != cut.upload_id
    assert list(_objects(tier)) == [finished[cut.segment_base].key]


def test_an_object_that_does_not_match_its_record_is_deleted_and_the_segment_redone(rig):
    store, tier, uploader = rig()
    _fill(store, 1)
    failpoints.arm("tier.upload.started", "raise")
    with pytest.raises(FailpointHit):
        uploader.step()
    (cut,) = uploader.ledger.snapshot()[1]
    tier.put_if_absent(cut.key, b"torn" * 100)  # another object under the attempt's key
    failpoints.disarm_all()
    uploader.step()
    finished = uploader.ledger.snapshot()[0]
    assert uploader.ledger.states()[cut.upload_id] == DISCARDED and tier.size(cut.key) is None
    assert _objects(tier) == {finished[cut.segment_base].key: _segment_bytes(store, cut.segment_base)}


@pytest.mark.parametrize("kind", [tier_upload.CRC64NVME, tier_upload.SHA256])
def test_a_pending_attempt_is_resolved_by_its_records_digest_of_either_kind(rig, kind):
    """The STARTED record holds the segment's CRC-64/NVME (the compiled codec's, version 4: the definition's value;
    a SHA-256 on the pure-Python codec).
    Pending attempts of either kind (an older node's records hold a SHA-256), each with an object of the recorded
    size: the one whose object differs in one byte is DISCARDED and its object deleted, the one whose object reads
    back with the record's digest is FINISHED."""
    store, tier, uploader = rig()
    _fill(store, 1)
    failpoints.arm("tier.upload.started", "raise")
    with pytest.raises(FailpointHit):
        uploader.step()
    (cut,) = uploader.ledger.snapshot()[1]
    data = _segment_bytes(store, cut.segment_base)
    if crc64.FAST:  # the compiled codec's CRC; on the pure-Python codec a SHA-256 (its CRC would be far slower)
        assert cut.digest_kind == tier_upload.CRC64NVME and cut.digest == crc64nvme(data).to_bytes(8, "big")
    else:
        assert cut.digest_kind == tier_upload.SHA256 and cut.digest == hashlib.sha256(data).digest()
    digest = crc64nvme(data).to_bytes(8, "big") if kind == tier_upload.CRC64NVME else hashlib.sha256(data).digest()
    cut = dataclasses.replace(cut, upload_id=uuid.uuid4(), digest=digest, digest_kind=kind)
    cut = dataclasses.replace(cut, key=object_key(cut.segment_base, cut.upload_id))
    good = dataclasses.replace(cut, upload_id=uuid.uuid4())
    good = dataclasses.replace(good, key=object_key(good.segment_base, good.upload_id))
    uploader.ledger.record(cut)
    uploader.ledger.record(good)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    tier.put_if_absent(cut.key, bytes(flipped))  # the recorded size, one bit off
    tier.put_if_absent(good.key, data)
    failpoints.disarm_all()
    uploader.step()
    states = uploader.ledger.states()
    assert states[cut.upload_id] == DISCARDED and tier.size(cut.key) is None
    assert states[good.upload_id] == FINISHED and uploader.ledger.snapshot()[0][good.segment_base] == good.but(FINISHED)
    assert _objects(tier) == {good.key: data}


def test_orphans_are_swept_and_a_restart_reads_the_ledger_from_the_log(rig, small_config):
    store, tier, uploader = rig()
    _fill(store, 2)
    uploader.step()
    kept = _objects(tier)
    orphan = object_key(0, uuid.uuid4())  # an attempt whose STARTED the log does not hold
    tier.put_if_absent(orphan, b"left by a deposed leader")
    uploader.step()
    assert uploader.swept == 1 and _objects(tier) == kept
    store.stop()
    store, tier, again = rig()  # the same data dir and tier
    again.step()
    assert again.uploaded == 0 and again.ledger.conflicts == 0 and _objects(tier) == kept


def test_a_node_that_does_not_lead_uploads_nothing(rig):
    store, tier, uploader = rig(leader_epoch=lambda: None)
    _fill(store, 1)
    uploader.step()
    assert _objects(tier) == {} and uploader.ledger.snapshot() == ({}, [])


def test_retention_deletes_no_segment_before_its_upload_finished(rig, small_config):
    store, tier, uploader = rig()
    store.retention.add_floor("tier", uploader.retention_floor)  # as the commit log composes it with a tier
    _fill(store, 3)
    sealed = [s.base for s in sealed_segments(store)]
    object.__setattr__(store.retention._config, "retention_ms", 1)  # every sealed segment expired
    wait_until(lambda: store.retention._expired_end(store.clock.now_ms()), "the segments expired")
    assert store.retention.delete_expired_segments() == 0  # none uploaded: all kept
    assert [s.start for s in store.segments.segments][:len(sealed)] == sealed
    uploader.step()
    assert store.retention.delete_expired_segments() >= len(sealed) - 1  # uploaded: they may go now
    finished = uploader.ledger.snapshot()[0]
    assert all(store.segments.segments[0].start >= base for base in finished)
    # Without local retention the local log is the logical one: the uploaded segments it deleted are past the
    # total retention, so the tier's retention deletes their objects and records DELETED.
    uploader.step()
    assert uploader.expired >= len(sealed) - 1
    assert all(tier.size(u.key) is None for u in uploader.ledger.deleted().values())
    # An unknown attempt's object is swept while its segment is local, and below the logical log (expired);
    # in between (local retention's tiered part) its records may have gone with retention: it is kept there.
    below, local = object_key(0, uuid.uuid4()), object_key(store.segments.segments[0].start, uuid.uuid4())
    tier.put_if_absent(below, b"an old segment's")
    tier.put_if_absent(local, b"an orphan")
    uploader.logical_min = lambda: 0  # as local retention's logical log reaching down to segment 0
    uploader.step()
    assert tier.size(below) is not None and tier.size(local) is None
    uploader.logical_min = store.log_min
    uploader.step()
    assert tier.size(below) is None
