"""Local retention with the object storage tier and reads from it (mqstore.tier.local_retention, mqstore.tier.reads),
on a real store and a file:// tier in one process: the block cache's byte limit, the read-ahead's aligned GETs,
a short object refused whole, local retention deleting only FINISHED segments (never one whose upload failed at
a failpoint), and Pull / GetMessage of records only in the tier, byte-identical, before and after a restart."""

from __future__ import annotations

import itertools
import uuid

import pytest

from mqstore import failpoints, tailing
from mqstore.errors import DataLoss, InvalidArgument, OutOfRange, Unavailable
from mqstore.format.tier_upload import FINISHED, Upload
from mqstore.format import record_reader
from mqstore.model import TAIL_AT_OFFSET, TAIL_EARLIEST, MessageIn
from mqstore.store_parts import build_store
from mqstore.tier.config import TierConfig
from mqstore.tier.ledger import Ledger
from mqstore.tier.local_retention import LocalRetention
from mqstore.tier.reads import BlockCache, TierReader
from mqstore.tier.status import TierStats
from mqstore.tier.sealed import sealed_segments
from mqstore.tier.uploader import Uploader
from mqstore.tier.urls import open_store
from tests.support.waiting import wait_until

SEGMENT = 16 * 1024


# ---- the cache and the read-ahead, on a counting store --------------------------------------------------------

class CountingStore:
    url = "mem://test"

    def __init__(self, objects: dict[str, bytes]):
        self.objects = objects
        self.gets: list[tuple[str, int, int]] = []

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets.append((key, start, length))
        return self.objects[key][start:start + length]


def _upload(key: str, base: int, size: int) -> Upload:
    return Upload(FINISHED, uuid.uuid4(), base, size, bytes(32), 0, key)


def test_the_block_cache_keeps_at_most_its_byte_limit_evicting_the_least_recently_used():
    cache = BlockCache(limit_bytes=250)
    for index in range(3):
        cache.put(("k", index), bytes(100))
    assert cache.bytes == 200 and len(cache) == 2 and cache.get(("k", 0)) is None  # 0 went for 2
    assert cache.get(("k", 1)) is not None  # 1 is now the most recent: 2 goes next
    cache.put(("k", 3), bytes(100))
    assert cache.get(("k", 2)) is None and cache.get(("k", 1)) is not None and cache.bytes == 200
    cache.put(("k", 4), bytes(300))  # larger than the whole cache: not kept, nothing evicted for it
    assert cache.bytes == 200 and cache.get(("k", 4)) is None


def test_a_read_gets_aligned_read_ahead_blocks_once_and_serves_the_next_reads_from_the_cache():
    data = bytes(range(256)) * 40  # 10240 bytes
    objects = CountingStore({"o": data})
    reader = TierReader(objects, lambda base: _upload("o", 0, len(data)) if base == 0 else None, 16384,
                        read_ahead_bytes=4096, cache_bytes=1 << 20)
    assert reader.read(100, 50) == data[100:150]
    assert objects.gets == [("o", 0, 4096)]
    assert reader.read(4000, 200) == data[4000:4200]  # crosses into block 1: one more GET, block 0 a hit
    assert objects.gets[1:] == [("o", 4096, 4096)]
    assert reader.read(9000, 5000) == data[9000:]  # the last block is the object's rest; nothing past it
    assert objects.gets[2:] == [("o", 8192, 2048)]
    assert reader.read(0, len(data)) == data and len(objects.gets) == 3  # all hits


def test_a_short_object_is_data_loss_and_nothing_of_it_is_served_and_a_missing_upload_unavailable():
    data = bytes(range(256)) * 16
    objects = CountingStore({"o": data[:3000]})  # the upload recorded 4096 bytes: torn
    reader = TierReader(objects, lambda base: _upload("o", 0, len(data)) if base == 0 else None, 16384,
                        read_ahead_bytes=4096, cache_bytes=1 << 20)
    with pytest.raises(DataLoss, match="object o is short: 3000 bytes at 0 where its upload recorded 4096"):
        reader.read(0, 100)
    assert len(reader.cache) == 0
    with pytest.raises(Unavailable, match="mem://test: the segment at physical offset 16384 .* no FINISHED upload"):
        reader.read(16384 + 10, 10)


def test_local_retention_is_refused_longer_than_the_total_retention_or_without_a_tier():
    with pytest.raises(InvalidArgument, match="local_retention_ms 7200000 is longer than the total retention"):
        TierConfig(tier_url="file:///x", local_retention_ms=7_200_000).check_against(3_600_000)
    TierConfig(tier_url="file:///x", local_retention_ms=3_600_000).check_against(3_600_000)
    with pytest.raises(InvalidArgument, match="give --tier-url too"):
        TierConfig(local_retention_bytes=1)


# ---- on a real store --------------------------------------------------------------------------------------

class Rig:
    def __init__(self, config, tier_dir):
        self.config, self.tier_dir = config, tier_dir
        tier_dir.mkdir(parents=True, exist_ok=True)
        self.start()

    def start(self):
        self.store = build_store(self.config)
        self.store.tiered_log = True
        self.store.start()
        self.tier = open_store(f"file://{self.tier_dir}", timeout_ms=10_000)
        self.ledger = Ledger.of_store(self.store)
        self.uploader = Uploader(self.tier, self.ledger, lambda: sealed_segments(self.store), leader_epoch=lambda: 0,
                                 ready=self.store.replica_view.promoted_visible, log_min=self.store.log_min,
                                 interval_ms=10_000,
                                 logical_min=lambda: self.local.logical_min)
        self.store.retention.add_floor("tier", self.uploader.retention_floor)
        self.reader = TierReader(self.tier, self._finished, SEGMENT, read_ahead_bytes=4096, cache_bytes=64 << 10,
                                 floor=lambda: self.local.logical_min)
        self.store.commitlog.remote = self.reader.read
        self.store.commitlog.remote_floor = lambda: self.local.logical_min
        self.local = LocalRetention(self.store, self.ledger, local_retention_ms=0, local_retention_bytes=2 * SEGMENT,
                                    writable=lambda: True, interval_ms=10_000)
        self.local.open()

    def _finished(self, base):
        self.ledger.catch_up()
        return self.ledger.finished_upload(base)

    def stop(self):
        self.tier.close()
        self.store.stop()

    def local_files(self) -> list[int]:
        return sorted(int(path.name) for path in (self.config.data_dir / "commitlog").iterdir())


@pytest.fixture
def rig(small_config, tmp_path):
    made = Rig(small_config(segment_size_bytes=SEGMENT), tmp_path / "tier")
    yield made
    failpoints.disarm_all()
    made.stop()


def _fill(store, segments: int, start: int = 0) -> list[bytes]:
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
               "segments sealed")  # by offset: local retention may have deleted the first ones
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


def _tail_all(store) -> list[bytes]:
    end = store.visible_offset()
    got = []
    for frame in itertools.islice(tailing.tail(store, TAIL_EARLIEST, 0, ["t"], 64 << 10, 10, is_active=lambda: True),
                                  100_000):  # bounded
        got += [bytes(view.body) for view in record_reader.records(frame.records)]
        if frame.next_physical_offset >= end:
            return got
    raise AssertionError("the tail did not reach the log's end")


def test_local_retention_deletes_only_uploaded_segments_and_pull_and_get_read_the_rest_from_the_tier(rig):
    bodies = _fill(rig.store, 8)
    failpoints.arm("tier.upload.started", "raise")  # the first upload fails: nothing is FINISHED
    with pytest.raises(failpoints.FailpointHit):
        rig.uploader.step()
    rig.local.step()
    assert rig.local.deleted == 0 and rig.local_files()[0] == 0  # not uploaded: every local file stays
    stats = TierStats(rig.store, rig.uploader, rig.reader, lambda: rig.local.logical_min)
    failed = stats.status()
    assert failed.copy_errors == 1 and "FailpointHit" in failed.last_error and failed.last_error_ms > 0
    assert failed.copy_lag_segments >= 7 and failed.copy_lag_bytes == failed.copy_lag_segments * SEGMENT
    assert failed.pending_uploads == 1 and failed.tiered_bytes == 0 and failed.local_bytes >= 8 * SEGMENT
    failpoints.disarm_all()
    rig.uploader.step()
    uploaded = stats.status(with_segments=True)
    assert uploaded.copy_lag_segments == 0 and uploaded.pending_uploads == 0
    assert uploaded.last_error == failed.last_error  # kept: the last error, not cleared by a good step
    assert uploaded.tiered_bytes == uploaded.copy_bytes == sum(r.size for r in uploaded.segments if r.tiered)
    assert [r.base for r in uploaded.segments] == rig.local_files() and not uploaded.segments[-1].sealed
    bodies += _fill(rig.store, 14, start=len(bodies))  # the FINISHED records lie in segments that go next
    rig.uploader.step()
    rig.local.step()
    assert rig.local.deleted >= 8 and rig.local_files()[0] > 0
    assert rig.store.queue_info("t", 0).min_offset == 0  # the logical log is the total retention's
    assert _pull_all(rig.store) == bodies and rig.reader.gets > 0
    read = stats.status(with_segments=True)
    assert read.fetch_bytes == rig.reader.fetched_bytes > 0 and read.cache_misses > 0 and read.cache_hits > 0
    assert read.local_min == rig.local_files()[0] and all(r.tiered for r in read.segments if not r.local)
    assert {r.base for r in read.segments if not r.local} == {r.base for r in read.segments if r.base < read.local_min}
    raw = rig.store.pull_raw("t", 0, 0, 32).records
    assert [bytes(m) for m in raw] == [rig.store.get_message_raw(m.record.physical_offset)
                                       for m in rig.store.pull("t", 0, 0, 32).messages]
    first = rig.store.pull("t", 0, 0, 1).messages[0]
    assert rig.store.get_message(first.record.physical_offset).record.body == bodies[0]
    middle = rig.store.pull("t", 0, len(bodies) // 3, 1).messages[0].record  # in a tiered segment
    assert middle.physical_offset < rig.local_files()[0]
    assert rig.store.offset_by_time("t", 0, middle.store_timestamp_ms) <= len(bodies) // 3  # times from the tier
    raw = rig.store.get_messages([first.record.physical_offset, 5], raw=True)
    assert raw[0].message is not None and raw[1].message is None  # 5: no record starts there
    assert rig.local.rerecorded > 0  # the FINISHED records in the deleted segments were appended again
    assert _tail_all(rig.store) == bodies  # Tail from the earliest offset reads the tier too, then the local log
    unfiltered = next(tailing.tail(rig.store, TAIL_AT_OFFSET, first.record.physical_offset, [], 4096, 10,
                                   is_active=lambda: True))
    assert unfiltered.next_physical_offset - len(unfiltered.records) == first.record.physical_offset  # contiguous
    assert [bytes(v.body) for v in record_reader.records(unfiltered.records)][0] == bodies[0]
    with pytest.raises(InvalidArgument, match="in the tier"):
        next(tailing.tail(rig.store, TAIL_AT_OFFSET, first.record.physical_offset + 1, [], 0, 10,
                          is_active=lambda: True))
    rig.stop()
    rig.start()  # the ledger's records below the local log were re-appended: the tier is still mapped
    assert rig.local.logical_min == 0 and rig.store.queue_info("t", 0).min_offset == 0
    assert _pull_all(rig.store) == bodies


def test_a_hold_keeps_no_finished_segment_local_only_an_unfinished_one_and_tail_reads_the_tier(rig):
    bodies = _fill(rig.store, 6)
    now = rig.store.clock.now_ms()
    rig.store.retention.holds.open("follower", 0, now, durable=False)  # a lagging follower in the local log
    failpoints.arm("tier.upload.started", "raise")
    with pytest.raises(failpoints.FailpointHit):
        rig.uploader.step()
    failpoints.disarm_all()
    rig.local.step()
    assert rig.local.deleted == 0 and rig.local_files()[0] == 0  # not uploaded: the segment stays (and the hold)
    rig.uploader.step()
    rig.local.step()
    first_min = rig.local_files()[0]
    assert first_min > 0 and len(rig.local_files()) <= 3  # FINISHED: gone below the follower's hold
    assert rig.store.retention.holds.snapshot()["follower"][0] == 0  # the hold stays, for the total retention
    assert rig.store.retention.limit() == 0 and rig.local.logical_min == 0
    assert rig.store.store_info().min_physical_offset == 0  # the log's start for a follower (the Index's retention)
    rig.store.retention.holds.open("reads-the-local-log", first_min, now, durable=False)
    bodies += _fill(rig.store, 14, start=len(bodies))
    rig.uploader.step()
    rig.local.step()
    assert rig.local_files()[0] > first_min  # a hold in the local log keeps nothing FINISHED local either
    assert _tail_all(rig.store) == bodies  # the follower's Tail reads what went from the tier


def test_a_hold_stops_the_total_retention_of_segments_only_in_the_tier(small_config, tmp_path):
    made = Rig(small_config(segment_size_bytes=SEGMENT, retention_ms=1000, retention_hold_grace_ms=0),
               tmp_path / "tier")
    try:
        _fill(made.store, 6)
        now = made.store.clock.now_ms()
        made.store.retention.holds.open("follower", 0, now, durable=False)
        made.uploader.step()
        made.local.step()
        local_min = made.local_files()[0]
        assert local_min > 0  # local retention ignores the hold
        end = made.store.commitlog.store_timestamp_at(SEGMENT)
        wait_until(lambda: made.store.clock.now_ms() > end + 1000, "the first tiered segment past retention_ms", 10)
        made.local.step()
        assert made.local.logical_min == 0 and made.store.queue_info("t", 0).min_offset == 0  # held: nothing expires
        made.store.retention.holds.close("follower", made.store.clock.now_ms())  # grace 0: the hold ends

        def expired():
            made.local.step()
            return made.local.logical_min > 0
        wait_until(expired, "the tiered segments expired once the hold ended", 30)
    finally:
        made.stop()


def test_a_torn_object_is_data_loss_naming_it_never_a_partial_message(rig):
    bodies = _fill(rig.store, 6)
    rig.uploader.step()
    rig.local.step()
    assert rig.local.deleted >= 1
    upload = rig.ledger.finished_upload(0)
    path = rig.tier_dir / upload.key
    path.write_bytes(path.read_bytes()[:1000])  # cut inside the first record's block
    with pytest.raises(DataLoss, match=f"object {upload.key} is short"):
        rig.store.pull("t", 0, 0, 32)
    assert bodies


def test_total_retention_moves_the_logical_min_past_segments_only_in_the_tier_and_deletes_their_objects(
        small_config, tmp_path):
    made = Rig(small_config(segment_size_bytes=SEGMENT, retention_ms=1500), tmp_path / "tier")
    try:
        _fill(made.store, 8)
        made.uploader.step()
        made.local.step()
        local_min = made.local_files()[0]
        assert local_min > 0 and made.store.queue_info("t", 0).min_offset == 0  # not expired yet: all there
        first = made.store.pull("t", 0, 0, 1).messages[0].record.physical_offset
        assert made.store.get_message(first).record.body  # read from the tier
        made.uploader.step()
        assert made.uploader.expired == 0  # nothing past the total retention yet: every object kept

        def expired():
            made.local.step()
            return made.local.logical_min >= local_min
        wait_until(expired, "the tiered segments expired by retention_ms (1.5 s)", 30)
        low = made.store.queue_info("t", 0).min_offset
        assert low > 0 and made.store.pull("t", 0, low, 1).messages[0].record.physical_offset >= local_min
        # The tier's own retention: the expired segments' objects go, then DELETED is recorded; a crash between
        # (the failpoint) leaves a FINISHED upload without its object, and the next pass finishes the job.
        gone = {base: u for base, u in made.ledger.snapshot()[0].items() if base + u.segment_size <= local_min}
        assert gone and 0 in gone
        failpoints.arm("tier.retention.after_delete", "raise")
        with pytest.raises(failpoints.FailpointHit):
            made.uploader.step()
        failpoints.disarm_all()
        assert made.tier.size(gone[0].key) is None and 0 in made.ledger.snapshot()[0]  # deleted, not yet recorded
        made.uploader.step()
        assert made.ledger.deleted().keys() == gone.keys()
        assert all(made.tier.size(u.key) is None for u in gone.values())
        assert not set(gone) & set(made.ledger.snapshot()[0])
        remaining = {info.key for info in made.tier.list("commitlog")}
        assert remaining == {u.key for u in made.ledger.snapshot()[0].values()}  # the rest kept, no orphan
        made.uploader.step()  # idempotent: nothing more to delete
        assert made.uploader.expired == len(gone) and made.ledger.conflicts == 0
        # Reads of the deleted offsets answer as expired local data does: below the log's start.
        with pytest.raises(OutOfRange):
            made.store.get_message(first)
        assert made.store.get_messages([first])[0].message is None
        with pytest.raises(OutOfRange, match=f"valid offsets are \\[{low},"):
            made.store.pull("t", 0, 0, 1)
        assert made.reader.fetch_errors == 0
        made.stop()
        made.start()  # the ledger from the log: the deleted segments stay deleted, the logical log where it was
        assert made.local.logical_min >= local_min and made.ledger.deleted().keys() >= gone.keys()
        made.uploader.step()
        after = {info.key for info in made.tier.list("commitlog")}  # a segment sealed since may be uploaded now
        assert made.uploader.expired == 0 and remaining <= after and not after & {u.key for u in gone.values()}
    finally:
        failpoints.disarm_all()
        made.stop()


def test_a_file_tier_directory_moved_away_is_unavailable_naming_the_tier_not_data_loss(rig):
    """The commit log's side of a missing file:// tier directory (mqstore.tier.local), as the compactor's: reads of
    tiered segments are UNAVAILABLE naming the tier (before: the objects read as gone, DATA_LOSS), the local
    tail answers, the uploader uploads nothing in a directory made in its place, and once it is back every
    record is served again."""
    bodies = _fill(rig.store, 8)
    rig.uploader.step()
    bodies += _fill(rig.store, 14, start=len(bodies))
    rig.uploader.step()
    rig.local.step()
    assert rig.local.deleted >= 8
    rig.reader.cache = BlockCache(0)
    rig.tier_dir.rename(rig.tier_dir.with_name("away"))
    with pytest.raises(Unavailable, match=f"object storage tier file://{rig.tier_dir}.*does not exist"):
        rig.store.pull("t", 0, 0, 1)
    local = rig.store.pull("t", 0, len(bodies) - 1, 1).messages
    assert [m.record.body for m in local] == bodies[-1:]
    with pytest.raises(Unavailable):
        rig.uploader.step()
    assert not rig.tier_dir.exists()
    rig.tier_dir.with_name("away").rename(rig.tier_dir)
    assert _pull_all(rig.store) == bodies
