"""Consume queue files in the object storage tier (issue 36's whole-topic local disk), layer 1: the upload
record's second kind (mqstore.format.tier_upload version 2: golden bytes, a version 1 record still parses as a
commit log segment's), the ledger's map per queue, and the uploader on a real store with a file:// tier: a
sealed consume queue file is uploaded byte-identical once, only after the commit log segments its entries
point into FINISHED; a put that reported an error is finished, an attempt cut before its put discarded and
redone; a restart reads the files' uploads from the log; a node that does not lead uploads nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

import pytest

from mqstore import failpoints
from mqstore.errors import DataLoss, Unavailable
from mqstore.failpoints import FailpointHit
from mqstore.format import cq_unit, tier_upload
from mqstore.format.tier_upload import COMMITLOG, CONSUME_QUEUE, DELETED, DISCARDED, FINISHED, STARTED, Upload
from mqstore.metrics import Registry
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger, UploadMap
from mqstore.tier.local_retention import LocalRetention
from mqstore.tier.reads import BlockCache, TierReader
from mqstore.tier.status import TierStats, register_metrics
from mqstore.tier.sealed import queue_min, sealed_queue_files, sealed_segments
from mqstore.tier.uploader import Uploader, object_key, queue_object_key
from mqstore.tier.urls import open_store
from tests.conftest import GOLDEN, golden_bytes
from tests.support.waiting import wait_until

SEGMENT = 16 * 1024
ENTRIES = 16  # entries per consume queue file: 320 bytes


def _file_upload(state=STARTED, base=ENTRIES * 20, upload_id=None) -> Upload:
    upload_id = upload_id or uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF)
    return Upload(state, upload_id, base, ENTRIES * 20, hashlib.sha256(b"file").digest(), 3,
                  queue_object_key("t", 2, base, upload_id), CONSUME_QUEUE, "t", 2)


# ---- the format -----------------------------------------------------------------------------------------

def test_a_consume_queue_files_record_golden_and_a_version_1_record_still_parses(request):
    upload = _file_upload()
    data = tier_upload.encode(upload)
    assert data == golden_bytes("tier_upload_queue_file.bin", data, request)
    assert data[:6] == bytes.fromhex("4d5154550201")  # magic "MQTU", version 2, STARTED
    key_end = 80 + len(upload.key)
    assert data[80:key_end].decode() == upload.key == "consumequeue/t/2/00000000000000000320/" + upload.upload_id.hex
    assert data[key_end:] == bytes([CONSUME_QUEUE]) + (2).to_bytes(4, "big") + (1).to_bytes(2, "big") + b"t"
    assert tier_upload.decode(data) == upload and tier_upload.decode(tier_upload.encode(upload.but(FINISHED))) == \
        upload.but(FINISHED)
    old = (GOLDEN / "tier_upload.bin").read_bytes()  # a version 1 record, as every node wrote before
    decoded = tier_upload.decode(old)
    assert (decoded.kind, decoded.topic, decoded.queue_id) == (COMMITLOG, "", 0)
    assert tier_upload.encode(decoded) == old  # a segment's record is still written as version 1


def test_a_consume_queue_files_record_with_its_topics_incarnation_golden_and_one_without_still_parses(request):
    upload = dataclasses.replace(_file_upload(), incarnation=7 * SEGMENT)
    data = tier_upload.encode(upload)
    assert data == golden_bytes("tier_upload_queue_file_v3.bin", data, request)
    assert data[:6] == bytes.fromhex("4d5154550301")  # magic "MQTU", version 3, STARTED
    v2 = tier_upload.encode(_file_upload())
    assert data[4] == 3 and data[5:len(v2)] == v2[5:] and data[len(v2):] == (7 * SEGMENT).to_bytes(8, "big")
    assert tier_upload.decode(data) == upload
    before = tier_upload.decode((GOLDEN / "tier_upload_queue_file.bin").read_bytes())  # written without it
    assert before == _file_upload() and before.incarnation == -1
    for bad in (data[:-1], data + b"x", data[:-8] + (-2).to_bytes(8, "big", signed=True)):
        with pytest.raises(ValueError):
            tier_upload.decode(bad)
    segment = Upload(STARTED, uuid.uuid4(), 0, SEGMENT, b"\0" * 32, 0, "k", incarnation=0)
    for wrong in (segment, dataclasses.replace(upload, incarnation=-2)):
        with pytest.raises(ValueError):
            tier_upload.encode(wrong)


def test_the_ledger_answers_for_the_topic_holding_the_name_now():
    old = dataclasses.replace(_file_upload(FINISHED), incarnation=100)
    new = dataclasses.replace(_file_upload(FINISHED, upload_id=uuid.uuid4()), incarnation=900)
    unknown = _file_upload(FINISHED, base=0, upload_id=uuid.uuid4())  # a version 2 record
    records = [tier_upload.encode(u) for r in (old, new, unknown) for u in (r.but(STARTED), r)]
    starts = {"t": 100}
    ledger = Ledger(lambda body: None, lambda at, count: [(i, records[i], i) for i in range(at, len(records))][:count],
                    lambda: (0, len(records)), lambda topic: starts.get(topic))
    ledger.catch_up()
    assert ledger.queue_file_upload("t", 2, old.segment_base) == new  # a registry that lags: the latest wins
    starts["t"] = 900  # the topic created again: the old topic's upload stands for nothing
    assert ledger.queue_file_upload("t", 2, old.segment_base) == new and ledger.queue_file_upload("t", 2, 0) == unknown
    assert ledger.queue_snapshot() == {("t", 2): ({old.segment_base: new, 0: unknown}, [])}
    maps = ledger.queue_maps()
    assert maps[("t", 2, 100)] == ({old.segment_base: old}, [], False) and maps[("t", 2, 900)][2]
    assert maps[("t", 2, -1)][2]
    starts["t"] = 1000  # created again once more, nothing uploaded yet: only the unknown incarnation's
    assert ledger.queue_file_upload("t", 2, old.segment_base) is None and ledger.queue_file_upload("t", 2, 0) == unknown


def test_a_version_2_record_that_does_not_decode_or_encode_is_refused():
    good = tier_upload.encode(_file_upload())
    key_end = 80 + len(_file_upload().key)
    for bad in (good[:-1], good + b"x", good[:key_end], good[:key_end] + b"\3" + good[key_end + 1:],
                good[:key_end] + b"\1" + good[key_end + 1:],  # a segment's kind with a topic
                good[:key_end + 5] + b"\0\0"):  # a consume queue file without its topic
        with pytest.raises(ValueError):
            tier_upload.decode(bad)
    segment = Upload(STARTED, uuid.uuid4(), 0, SEGMENT, b"\0" * 32, 0, "k")
    for wrong in (dataclasses.replace(_file_upload(), topic=""), dataclasses.replace(_file_upload(), queue_id=-1),
                  dataclasses.replace(segment, topic="t"), dataclasses.replace(segment, kind=9)):
        with pytest.raises(ValueError):
            tier_upload.encode(wrong)


def test_the_ledger_keeps_a_queues_files_apart_from_the_segments():
    umap = UploadMap()
    segment = Upload(STARTED, uuid.uuid4(), ENTRIES * 20, SEGMENT, b"\0" * 32, 0, object_key(0, uuid.uuid4()))
    file = _file_upload()
    for record in (segment, file, file.but(FINISHED)):
        umap.apply(record)
    assert umap.finished == {} and list(umap.pending) == [segment.upload_id]  # the same base, another kind
    queue = umap.queues[("t", 2, -1)]  # a version 2 record: its incarnation unknown
    assert queue.finished == {file.segment_base: file.but(FINISHED)} and not queue.pending
    umap.apply(file.but(DISCARDED))  # a second end
    assert umap.skipped == 1


# ---- the uploader on a real store -------------------------------------------------------------------------

@pytest.fixture
def rig(small_config, tmp_path):
    made = []

    def make(leader_epoch=lambda: 0):
        store = build_store(small_config(segment_size_bytes=SEGMENT, cq_entries_per_file=ENTRIES))
        store.start()
        (tmp_path / "tier").mkdir(exist_ok=True)
        tier = open_store(f"file://{tmp_path}/tier", timeout_ms=10_000)
        uploader = Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=leader_epoch,
                            ready=store.replica_view.promoted_visible, log_min=store.log_min, interval_ms=10_000,
                            queue_files=lambda: sealed_queue_files(store), segment_size=SEGMENT,
                            queue_min=lambda topic, queue_id: queue_min(store, topic, queue_id))
        made.append((store, tier))
        return store, tier, uploader
    yield make
    failpoints.disarm_all()
    for store, tier in made:
        tier.close()
        if store.running:
            store.stop()


def _fill(store: MessageStore, segments: int) -> None:
    """Append to topic t's one queue until ``segments`` log segments and their queue files are sealed."""
    if "t" not in {t.name for t in store.topic_admin.list()}:
        store.topic_admin.create("t", 1)
    for batch in range(10_000):  # bounded: 4 records of ~1 KiB a batch
        if store.log_end() > segments * SEGMENT:
            break
        store.append("t", [MessageIn(body=bytes([batch % 256]) * 900)] * 4)
    wait_until(lambda: len(sealed_segments(store)) >= segments, f"{segments} segments sealed (flushed on roll)")
    wait_until(lambda: len(sealed_queue_files(store)) >= 2, "queue files sealed (flushed)")


def _queue_objects(tier) -> dict[str, bytes]:
    return {info.key: tier.get_range(info.key, 0, info.size) for info in tier.list("consumequeue")}


def _uploadable(store, finished_segments) -> list:
    """The sealed queue files whose records all lie in FINISHED segments."""
    return [f for f in sealed_queue_files(store) if all(
        base in finished_segments for base in range(f.log_span()[0] - f.log_span()[0] % SEGMENT, f.log_span()[1],
                                                    SEGMENT))]


def test_sealed_queue_files_are_uploaded_byte_identical_once_after_their_segments(rig):
    store, tier, uploader = rig()
    _fill(store, 3)
    uploader.step()
    segments, _ = uploader.ledger.snapshot()
    files, pending = uploader.ledger.queue_snapshot()[("t", 0)]
    sealed = sealed_queue_files(store)
    expected = _uploadable(store, segments)
    assert expected and not pending and sorted(files) == [f.file.base for f in expected]
    late = [f for f in sealed if f.file.base not in files]  # entries in the segment written now: not yet
    assert all(f.log_span()[1] > max(segments) + SEGMENT for f in late)
    objects = _queue_objects(tier)
    assert len(objects) == len(expected)
    cq = store.queues.get("t", 0)
    for f in expected:
        data = objects[files[f.file.base].key]
        assert data == f.file.read() and len(data) == ENTRIES * cq_unit.ENTRY_SIZE  # byte-identical, whole
        assert cq_unit.decode(data, 0) == cq.entry(f.file.base // cq_unit.ENTRY_SIZE)
    assert uploader.queue_files_uploaded == len(expected)
    uploader.step()
    assert _queue_objects(tier) == objects and uploader.queue_files_uploaded == len(expected)  # nothing twice
    assert uploader.ledger.queue_file_upload("t", 0, expected[0].file.base) == files[expected[0].file.base]


def test_no_queue_file_before_the_segments_it_points_into_finished(rig):
    store, tier, uploader = rig()
    _fill(store, 3)
    failpoints.arm("tier.upload.started", "raise")  # the first segment's attempt is cut: nothing FINISHED
    with pytest.raises(FailpointHit):
        uploader.step()
    failpoints.disarm_all()
    assert _queue_objects(tier) == {} and uploader.ledger.queue_snapshot() == {}


def test_a_queue_files_put_that_reported_an_error_is_finished_and_one_cut_before_its_put_redone(rig):
    store, tier, uploader = rig()
    _fill(store, 3)
    uploader.queue_files = lambda: []
    uploader.step()  # the segments first
    uploader.queue_files = lambda: sealed_queue_files(store)
    failpoints.arm("tier.upload.queue_file.after_put", "raise")  # the file's object is stored, the put "failed"
    with pytest.raises(FailpointHit):
        uploader.step()
    ((_, (finished, (stored,))),) = uploader.ledger.queue_snapshot().items()
    assert not finished and tier.size(stored.key) == ENTRIES * cq_unit.ENTRY_SIZE
    failpoints.arm("tier.upload.queue_file.started", "raise")  # the next file's attempt is cut before its put
    with pytest.raises(FailpointHit):
        uploader.step()
    failpoints.disarm_all()
    finished, pending = uploader.ledger.queue_snapshot()[("t", 0)]
    assert finished[stored.segment_base].upload_id == stored.upload_id  # resolved: FINISHED, never deleted
    (cut,) = pending
    uploader.step()
    finished, pending = uploader.ledger.queue_snapshot()[("t", 0)]
    assert not pending and uploader.ledger.queue_snapshot() and uploader.discarded == 1
    assert finished[cut.segment_base].upload_id != cut.upload_id and tier.size(cut.key) is None
    by_base = {f.file.base: f.file.read() for f in sealed_queue_files(store)}
    assert _queue_objects(tier) == {u.key: by_base[base] for base, u in finished.items()}


def test_a_restart_reads_the_queue_files_uploads_from_the_log_and_a_follower_uploads_nothing(rig):
    store, tier, uploader = rig()
    _fill(store, 3)
    uploader.step()
    kept, files = _queue_objects(tier), uploader.ledger.queue_snapshot()
    assert kept
    store.stop()
    store, tier, again = rig()  # the same data dir and tier
    again.step()
    assert again.ledger.queue_snapshot()[("t", 0)][0] == files[("t", 0)][0]
    assert again.uploaded == 0 and _queue_objects(tier) == kept
    store.stop()
    store, tier, follower = rig(leader_epoch=lambda: None)
    store.append("t", [MessageIn(body=b"x" * 900)] * 40)
    follower.step()
    assert _queue_objects(tier) == kept and follower.uploaded == 0


def test_the_tiers_retention_deletes_files_below_the_queues_minimum_and_sweeps_discarded_attempts(rig):
    store, tier, uploader = rig()
    _fill(store, 3)
    uploader.step()
    files = uploader.ledger.queue_snapshot()[("t", 0)][0]
    assert len(files) >= 2
    kept = _queue_objects(tier)
    cq = store.queues.get("t", 0)
    with store.dispatcher.lock:
        cq.raise_min_offset(ENTRIES + 1)  # the total retention: the first file's entries all below, not the second's
    uploader.step()
    first = files[0]
    assert uploader.queue_files_expired == 1 and tier.size(first.key) is None
    assert uploader.ledger.queue_states()[first.upload_id] == DELETED
    assert 0 not in uploader.ledger.queue_snapshot()[("t", 0)][0]
    assert _queue_objects(tier) == {k: v for k, v in kept.items() if k != first.key}  # the rest kept
    late = queue_object_key("t", 0, ENTRIES * 20, uuid.uuid4())
    tier.put_if_absent(late, b"an unknown attempt's")  # its records may have gone with local retention: kept
    discarded = dataclasses.replace(files[ENTRIES * 20], upload_id=uuid.uuid4(), state=STARTED)
    discarded = dataclasses.replace(discarded, key=queue_object_key("t", 0, ENTRIES * 20, discarded.upload_id))
    uploader.ledger.record(discarded)
    uploader.ledger.record(discarded.but(DISCARDED))
    tier.put_if_absent(discarded.key, b"a deposed leader's late put")
    uploader.step()
    assert tier.size(discarded.key) is None and tier.size(late) is not None and uploader.swept == 1
    assert uploader.queue_files_expired == 1  # the expired file (still local) is not uploaded again
    assert list(uploader.ledger.queue_states().values()).count(DELETED) == 1


# ---- layers 2-4: local retention of the files, reads of their entries from the tier, a restart ------------

class Rig:
    """A store with local retention of two segments and the tier's reads of segments and queue files."""

    def __init__(self, config, tier_dir, queue_files=True):
        self.config, self.tier_dir, self.upload_files = config, tier_dir, queue_files
        self.start()

    def start(self):
        self.store = build_store(self.config)
        self.store.tiered_log = True
        self.store.start()
        self.tier_dir.mkdir(parents=True, exist_ok=True)
        self.tier = open_store(f"file://{self.tier_dir}", timeout_ms=10_000)
        self.ledger = Ledger.of_store(self.store)
        files = (lambda: sealed_queue_files(self.store)) if self.upload_files else (lambda: [])
        self.uploader = Uploader(self.tier, self.ledger, lambda: sealed_segments(self.store), leader_epoch=lambda: 0,
                                 ready=self.store.replica_view.promoted_visible, log_min=self.store.log_min,
                                 interval_ms=10_000, logical_min=lambda: self.local.logical_min,
                                 queue_files=files, segment_size=SEGMENT)
        self.store.retention.add_floor("tier", self.uploader.retention_floor)
        self.reader = TierReader(self.tier, self._finished, SEGMENT, read_ahead_bytes=4096, cache_bytes=64 << 10,
                                 floor=lambda: self.local.logical_min, queue_file=self._queue_file)
        self.store.commitlog.remote = self.reader.read
        self.store.commitlog.remote_floor = lambda: self.local.logical_min
        self.local = LocalRetention(self.store, self.ledger, local_retention_ms=0, local_retention_bytes=2 * SEGMENT,
                                    writable=lambda: True, interval_ms=10_000, reader=self.reader)
        self.local.open()

    def _finished(self, base):
        self.ledger.catch_up()
        return self.ledger.finished_upload(base)

    def _queue_file(self, topic, queue_id, base):
        self.ledger.catch_up()
        return self.ledger.queue_file_upload(topic, queue_id, base)

    def stop(self):
        self.tier.close()
        self.store.stop()

    def queue_files(self) -> list[int]:
        return sorted(int(path.name) for path in (self.config.data_dir / "consumequeue" / "t" / "0").iterdir())

    def pass_(self):
        self.uploader.step()
        self.local.step()


@pytest.fixture
def tiered(small_config, tmp_path):
    made = []

    def make(queue_files=True):
        rig = Rig(small_config(segment_size_bytes=SEGMENT, cq_entries_per_file=ENTRIES), tmp_path / "tier",
                  queue_files)
        made.append(rig)
        return rig
    yield make
    failpoints.disarm_all()
    for rig in made:
        rig.stop()


def _append(store, segments: int, start: int = 0) -> list[bytes]:
    if "t" not in {t.name for t in store.topic_admin.list()}:
        store.topic_admin.create("t", 1)
    bodies = []
    for batch in range(start, start + 10_000):  # bounded
        if store.log_end() > segments * SEGMENT:
            break
        more = [f"{batch}:{i}:".encode() + bytes([batch % 251]) * 700 for i in range(4)]
        store.append("t", [MessageIn(body=body) for body in more])
        bodies += more
    wait_until(lambda: min(store.flushed_offset(), store.visible_offset()) >= (segments - 1) * SEGMENT,
               "segments sealed")
    store.write_checkpoint()  # the queue files flushed: sealed
    return bodies


def _pull_all(store) -> list[bytes]:
    got, offset = [], 0
    for _ in range(10_000):  # bounded
        result = store.pull("t", 0, offset, 32, 1 << 20)
        if not result.messages:
            return got
        got += [m.record.body for m in result.messages]
        offset = result.next_offset
    raise AssertionError("pull did not end")


def test_local_retention_deletes_uploaded_queue_files_and_pull_reads_their_entries_from_the_tier(tiered):
    rig = tiered()
    bodies = _append(rig.store, 10)
    rig.pass_()
    bodies += _append(rig.store, 20, start=len(bodies))  # the ledger's records lie in segments that go next
    rig.pass_()
    rig.pass_()
    cq = rig.store.queues.get("t", 0)
    local_log = rig.store.segments.min_offset
    assert local_log > 0 and rig.local.queue_files_deleted > 0 and rig.queue_files()[0] > 0
    first = cq.files.segments[0]  # the first local file stays: not uploaded, or it holds the local log
    last_phys, last_size, _ = cq.entry(first.end // cq_unit.ENTRY_SIZE - 1)
    assert rig.ledger.queue_file_upload("t", 0, first.start) is None or last_phys + last_size > local_log
    for base in range(0, rig.queue_files()[0], ENTRIES * cq_unit.ENTRY_SIZE):  # every file gone was FINISHED
        assert rig.ledger.queue_file_upload("t", 0, base) is not None
    assert rig.store.queue_info("t", 0).min_offset == 0  # the total retention's, not the local files'
    gets = rig.reader.gets
    assert _pull_all(rig.store) == bodies and rig.reader.gets > gets  # byte-identical, entries and records tiered
    middle = rig.store.pull("t", 0, 5, 1).messages[0].record
    assert rig.store.offset_by_time("t", 0, middle.store_timestamp_ms) <= 5  # the binary search reads the tier
    assert rig.store.get_message(middle.physical_offset).record.body == bodies[5]
    assert rig.local.rerecorded > 0
    rig.stop()
    rig.start()  # no local file below: the map of tiered files comes from the ledger, in the log
    assert rig.queue_files()[0] > 0 and rig.store.queue_info("t", 0).min_offset == 0
    assert _pull_all(rig.store) == bodies


def test_a_queue_file_not_uploaded_stays_local(tiered):
    rig = tiered(queue_files=False)
    _append(rig.store, 10)
    rig.pass_()
    assert rig.store.segments.min_offset > 0 and rig.local.deleted > 0  # the log's segments went
    assert rig.queue_files()[0] == 0 and rig.local.queue_files_deleted == 0  # the files did not


def test_a_tiered_queue_file_without_its_upload_is_unavailable_and_a_short_one_data_loss(tiered):
    rig = tiered()
    _append(rig.store, 10)
    rig.pass_()
    rig.pass_()
    assert rig.queue_files()[0] > 0
    upload = rig.ledger.queue_file_upload("t", 0, 0)
    rig.reader.queue_file = lambda topic, queue_id, base: None
    with pytest.raises(Unavailable, match=f"object storage tier {rig.tier.url}: consume queue t/0's file at byte 0"):
        rig.store.pull("t", 0, 0, 32)
    rig.reader.queue_file = rig._queue_file
    path = rig.tier_dir / upload.key
    path.write_bytes(path.read_bytes()[:100])  # a torn object: 5 entries of 16
    rig.reader.cache = BlockCache(0)
    with pytest.raises(DataLoss, match=f"object {upload.key} is short"):
        rig.store.pull("t", 0, 0, 32)
    path.unlink()
    with pytest.raises(DataLoss, match=f"object {upload.key} of the FINISHED upload"):
        rig.store.pull("t", 0, 0, 32)


def test_a_start_with_the_tier_unreadable_serves_the_local_tail_and_the_tiered_entries_once_it_is_back(tiered):
    rig = tiered()
    bodies = _append(rig.store, 10)
    rig.pass_()
    bodies += _append(rig.store, 16, start=len(bodies))
    rig.pass_()
    rig.pass_()
    assert rig.queue_files()[0] > 0
    # A few records more, in the queue's last file (never uploaded): the file of the last entries before them may
    # have been uploaded and deleted locally (a full file with the next one made ahead), which depends on the log's
    # layout, the upload records' sizes included.
    more = [f"tail:{i}".encode() for i in range(4)]
    rig.store.append("t", [MessageIn(body=body) for body in more])
    rig.store.write_checkpoint()
    bodies += more
    rig.stop()
    away = rig.tier_dir.with_name("away")
    rig.tier_dir.rename(away)  # every object unreadable
    rig.start()  # the queues' minimums in the tier are not read: the start goes on
    # The local tail: the last records whose bytes are in a local segment (which segments local retention
    # kept depends on the segments made ahead of need before the stop, so it is read, not assumed).
    cq, local_min = rig.store.queues.get("t", 0), rig.store.log_min()
    tail = len(bodies)
    while tail > len(bodies) - 8 and cq.entry(tail - 1)[0] >= local_min:  # bounded: a few records at most
        tail -= 1
    assert tail < len(bodies), f"no record of the last ones is local (the local log starts at {local_min})"
    assert [m.record.body for m in rig.store.pull("t", 0, tail, 32).messages] == bodies[tail:]
    with pytest.raises((DataLoss, Unavailable)):
        rig.store.pull("t", 0, 0, 32)
    away.rename(rig.tier_dir)
    rig.local.step()  # corrects the minimum now
    assert rig.store.queue_info("t", 0).min_offset == 0 and _pull_all(rig.store) == bodies


def test_a_local_file_that_is_not_the_uploaded_one_stays(tiered):
    rig = tiered()
    _append(rig.store, 10)
    rig.uploader.step()
    cq = rig.store.queues.get("t", 0)
    first = cq.files.segments[0]
    upload = rig.ledger.queue_file_upload("t", 0, first.start)
    assert upload is not None
    stale = dataclasses.replace(upload, digest=hashlib.sha256(b"a file of an earlier topic t").digest())
    rig.ledger.queue_file_upload = lambda topic, queue_id, base: stale if base == first.start else upload
    rig.local.step()
    assert rig.store.segments.min_offset > 0 and rig.queue_files()[0] == 0  # the log went, the file stayed
    assert rig.local.queue_files_deleted == 0


# ---- status and metrics of every kind --------------------------------------------------------------------

def _family(registry, name: str) -> dict[tuple, float]:
    (family,) = [f for f in registry.collect() if f.name == name]
    return {labels: value for labels, value in family.samples}


def test_tier_status_and_metrics_count_each_topics_queue_files_apart_from_the_logs_segments(tiered):
    rig = tiered()
    bodies = _append(rig.store, 10)
    rig.uploader.step()  # the segments, then the files whose segments FINISHED
    rig.uploader.queue_files = lambda: []
    bodies += _append(rig.store, 16, start=len(bodies))
    failpoints.arm("tier.upload.queue_file.started", "raise")
    rig.uploader.queue_files = lambda: sealed_queue_files(rig.store)
    with pytest.raises(FailpointHit):  # a step that fails on one of t's files counts for t, not for the log
        rig.uploader.step()
    failpoints.disarm_all()
    stats = TierStats(rig.store, rig.uploader, rig.reader, lambda: rig.local.logical_min)
    failed = stats.status()
    (row,) = failed.topics
    assert row.topic == "t" and row.copy_errors == 1 and "FailpointHit" in row.last_error and row.last_error_ms > 0
    assert row.pending_uploads == 1 and row.copy_lag_files >= 1 and failed.copy_errors == 0 and not failed.last_error
    rig.pass_()
    rig.pass_()
    assert rig.local.queue_files_deleted > 0
    assert _pull_all(rig.store) == bodies
    status = stats.status(with_segments=True)
    (row,) = status.topics
    files = rig.ledger.queue_snapshot()[("t", 0)][0]
    objects = _queue_objects(rig.tier)
    assert row.tiered_files == len(files) == len(objects) and row.tiered_bytes == sum(map(len, objects.values()))
    assert row.copy_bytes == row.tiered_bytes and row.pending_uploads == 0  # this node uploaded every file
    cq = rig.store.queues.get("t", 0)
    assert row.local_bytes == sum(f.size for f in cq.files.segments) > 0
    assert row.copy_lag_files == len([f for f in sealed_queue_files(rig.store) if f.file.base not in files])
    assert row.fetch_bytes > 0 and row.fetch_errors == 0
    segments = [r for r in status.segments if r.tiered]  # the log's figures are its segments' only
    assert status.copy_bytes == status.tiered_bytes == sum(r.size for r in segments)
    assert status.fetch_bytes + row.fetch_bytes == rig.reader.fetched_bytes
    registry = Registry()
    register_metrics(registry, stats)
    log_kind, topic_kind = ("commitlog", ""), ("consume_queue", "t")
    copied = _family(registry, "mqstore_tier_copy_bytes_total")
    assert copied == {log_kind: status.copy_bytes, topic_kind: row.copy_bytes}
    assert _family(registry, "mqstore_tier_size_bytes") == {log_kind: status.tiered_bytes, topic_kind: row.tiered_bytes}
    assert _family(registry, "mqstore_tier_local_bytes")[topic_kind] == row.local_bytes
    assert _family(registry, "mqstore_tier_copy_errors_total") == {log_kind: 0, topic_kind: 1}
    assert _family(registry, "mqstore_tier_fetch_bytes_total")[topic_kind] == row.fetch_bytes
    assert _family(registry, "mqstore_tier_copy_lag_segments")[topic_kind] == row.copy_lag_files


def test_a_topic_deleted_and_created_again_has_its_files_uploaded_at_the_old_bases_and_never_reads_the_old_ones(
        tiered):
    rig = tiered()
    _append(rig.store, 8)
    rig.pass_()
    first = rig.store.topics.start_of("t")
    old = rig.ledger.queue_snapshot()[("t", 0)][0]
    assert 0 in old and {u.incarnation for u in old.values()} == {first}
    old_keys = {u.key for u in old.values()}
    rig.store.topic_admin.delete("t")
    bodies = _append(rig.store, 18, start=10_000)  # t again: its files at the old bases, other bytes
    again = rig.store.topics.start_of("t")
    assert again > first and rig.store.queue_info("t", 0).min_offset == 0
    rig.pass_()
    bodies += _append(rig.store, 26, start=20_000)
    rig.pass_()
    rig.pass_()
    files = rig.ledger.queue_snapshot()[("t", 0)][0]
    assert set(old) <= set(files) and {u.incarnation for u in files.values()} == {again}  # uploaded at once
    objects = _queue_objects(rig.tier)
    assert not old_keys & set(objects)  # the old topic's objects are deleted, DELETED recorded
    states = rig.ledger.queue_states()
    assert all(states[u.upload_id] == DELETED for u in old.values())
    assert set(objects) == {u.key for u in files.values()}
    assert rig.local.queue_files_deleted > 0 and rig.queue_files()[0] > 0  # the new files left the local disk
    assert _pull_all(rig.store) == bodies  # the new topic's entries read from the tier, never the old ones
    rig.stop()
    rig.start()
    assert rig.store.queue_info("t", 0).min_offset == 0 and _pull_all(rig.store) == bodies


def test_a_topic_created_again_over_uploads_recorded_without_incarnation_uploads_its_own_and_reads_them(tiered):
    """Uploads recorded before the field (version 2, incarnation unknown) may be the deleted topic's: the new
    topic's files at their bases, whose bytes differ, are uploaded under its incarnation and read from there,
    never the old objects."""
    rig = tiered()
    _append(rig.store, 8)

    def unknown():
        files = sealed_queue_files(rig.store)
        for f in files:
            f.incarnation = -1  # as a node of the version before wrote them
        return files
    rig.uploader.queue_files = unknown
    rig.pass_()
    old = rig.ledger.queue_snapshot()[("t", 0)][0]
    assert 0 in old and {u.incarnation for u in old.values()} == {-1} and rig.local.queue_files_deleted > 0
    rig.store.topic_admin.delete("t")
    rig.uploader.queue_files = lambda: sealed_queue_files(rig.store)
    bodies = _append(rig.store, 18, start=10_000)
    rig.pass_()
    bodies += _append(rig.store, 26, start=20_000)
    rig.pass_()
    rig.pass_()
    files = rig.ledger.queue_snapshot()[("t", 0)][0]
    again = rig.store.topics.start_of("t")
    assert files[0].incarnation == again and files[0].upload_id != old[0].upload_id  # its own, at the old base
    assert rig.queue_files()[0] > 0  # then it left the local disk
    assert _pull_all(rig.store) == bodies
    rig.stop()
    rig.start()
    assert _pull_all(rig.store) == bodies
