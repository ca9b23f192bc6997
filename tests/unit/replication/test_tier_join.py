"""A replica that catches up from the object storage tier plus its leader's local tail (issue 36, item 3;
mqstore.replication.tier_join), in one process on real files: a leader whose local retention deleted segments and
consume queue files FINISHED in a file:// tier, and a replica with the same tier, each wired as the commit
log's composition wires them (uploader, reader, local retention, TierJoin), the handshake of
mqstore.replication.leader/replica and the copy of tests.unit.replication.pair.

The replica starts its log at the leader's local start (only those segments on its disk), serves every queue
offset and physical offset below from the tier byte-identical to the leader, also after a restart and once it
leads; a replica without the tier, or of an earlier version, is refused naming the flags; a replica left behind
the leader's local start starts again from the tier."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from mqstore import defaults
from mqstore.clock import FakeClock
from commitlog_service.replication import (
    GrpcReplicationStream,
    ReplicationServicer,
    history_out,
    welcome_in,
    welcome_messages,
)
from mqstore_rpc.gen.mqstore.v1.replication_pb2 import (
    LeaderMessage,
    LeaderWelcome,
    ReplicaHello,
    ReplicaMessage,
    TieredQueueStart,
)
from mqstore.errors import FailedPrecondition, InvalidArgument, Unavailable
from mqstore.format import cq_unit
from mqstore.model import MessageIn
from mqstore.replication.config import ReplicationConfig
from mqstore.replication.leader import ReplicaSession
from mqstore.replication.epochs import EpochEntry, EpochHistory
from mqstore.replication.messages import QueueStart, Welcome
from mqstore.replication.node import ReplicationNode
from mqstore.replication.replica import ReplicaFollower
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger
from mqstore.tier.local_retention import LocalRetention
from mqstore.tier.reads import TierReader
from mqstore.replication import tier_join
from mqstore.replication.tier_join import TierJoin
from mqstore.tier.sealed import queue_min, sealed_queue_files, sealed_segments
from mqstore.tier.uploader import Uploader
from mqstore.tier.urls import open_store
from tests.support.waiting import wait_until
from tests.unit.replication.pair import copy

SEGMENT = 16 * 1024
ENTRIES = 16  # entries per consume queue file
QUEUES = 2


class TierNode:
    """A store of the group with its replication node and, with ``tier``, the tier's parts as compose_tier wires
    them (local retention keeps two segments)."""

    def __init__(self, small_config, tmp_path, name: str, tier: bool = True):
        self.config = small_config(data_dir=tmp_path / name, metadata_url=f"sqlite:///{tmp_path / 'meta.db'}",
                                   preallocate_segments=False, segment_size_bytes=SEGMENT,
                                   cq_entries_per_file=ENTRIES)
        self.name, self.tier_dir, self.with_tier = name, tmp_path / "tier", tier
        self.tier_dir.mkdir(exist_ok=True)
        self.start()

    def start(self):
        self.store = store = build_store(self.config)
        store.tiered_log = self.with_tier
        store.start()
        store.topics.reload_on_miss = True
        self.node = node = ReplicationNode(ReplicationConfig(node_id=self.name), FakeClock(),
                                           self.config.data_dir / "epochs", log_end=store.log_end, flush_sync=False)
        node.on_promote = store.replica_view.promote
        node.in_sync.on_committed = store.replica_view.advance_visible
        store.gate = node
        self.tier = None
        if not self.with_tier:
            return
        self.tier = open_store(f"file://{self.tier_dir}", timeout_ms=10_000)
        self.ledger = Ledger.of_store(store)
        self.uploader = Uploader(self.tier, self.ledger, lambda: sealed_segments(store),
                                 leader_epoch=lambda: node.leading_epoch() or None,
                                 ready=store.replica_view.promoted_visible, log_min=store.log_min, interval_ms=10_000,
                                 logical_min=lambda: self.local.logical_min,
                                 queue_files=lambda: sealed_queue_files(store), segment_size=SEGMENT,
                                 queue_min=lambda topic, queue_id: queue_min(store, topic, queue_id))
        store.retention.add_floor("tier", self.uploader.retention_floor)
        self.reader = TierReader(self.tier, self._finished, SEGMENT, read_ahead_bytes=4096, cache_bytes=64 << 10,
                                 floor=lambda: self.local.logical_min, queue_file=self._queue_file)
        store.commitlog.remote = self.reader.read
        store.commitlog.remote_floor = lambda: self.local.logical_min
        self.local = LocalRetention(store, self.ledger, local_retention_ms=0, local_retention_bytes=2 * SEGMENT,
                                    writable=lambda: node.leading_epoch() != 0, interval_ms=10_000,
                                    reader=self.reader)
        self.local.open()
        store.tier_join = TierJoin(store, self.local)

    def _finished(self, base):
        self.ledger.catch_up()
        return self.ledger.finished_upload(base)

    def _queue_file(self, topic, queue_id, base):
        self.ledger.catch_up()
        return self.ledger.queue_file_upload(topic, queue_id, base)

    def stop(self):
        if self.tier is not None:
            self.tier.close()
        if self.store.running:
            self.store.stop()

    def pass_(self):
        self.uploader.step()
        self.local.step()

    def segment_files(self) -> list[int]:
        """The starts of the commit log's segment files holding bytes (a warmed next one left out)."""
        return sorted(int(p.name) for p in (self.config.data_dir / "commitlog").iterdir()
                      if p.name.isdigit() and int(p.name) < self.store.log_end())

    def follower(self) -> ReplicaFollower:
        return ReplicaFollower(self.store, self.node, link=None)


def _append(store, segments: int, start: int = 0) -> list[bytes]:
    bodies = []
    for batch in range(start, start + 10_000):  # bounded
        if store.log_end() > segments * SEGMENT:
            break
        more = [f"{batch}:{i}:".encode() + bytes([batch % 251]) * 700 for i in range(4)]
        store.append("t", [MessageIn(body=body, queue_id=i % QUEUES) for i, body in enumerate(more)],
                     replication="ASYNC")
        bodies += more
    wait_until(lambda: min(store.flushed_offset(), store.visible_offset()) >= (segments - 1) * SEGMENT,
               "segments sealed")
    store.write_checkpoint()  # the queue files flushed: sealed
    return bodies


def _queues(store) -> dict[int, tuple]:
    """Every queue of t: (min, max, [(queue offset, physical offset, body)]) as Pull and GetQueueInfo answer."""
    out = {}
    for queue_id in range(QUEUES):
        info = store.queue_info("t", queue_id)
        held, offset = [], info.min_offset
        for _ in range(10_000):  # bounded
            result = store.pull("t", queue_id, offset, 32, 1 << 20)
            if not result.messages:
                break
            held += [(m.record.queue_offset, m.record.physical_offset, m.record.body) for m in result.messages]
            offset = result.next_offset
        out[queue_id] = (info.min_offset, info.max_offset, held)
    return out


@pytest.fixture
def group(small_config, tmp_path):
    """The leader "a" after 12 segments, local retention done (its log and queue files below are in the tier)."""
    made = []

    def make(name: str, tier: bool = True) -> TierNode:
        node = TierNode(small_config, tmp_path, name, tier)
        made.append(node)
        return node
    leader = make("a")
    leader.node.become_leader(1, frozenset({"a"}))
    leader.store.topic_admin.create("t", QUEUES)
    bodies = _append(leader.store, 8)
    leader.pass_()
    bodies += _append(leader.store, 12, start=len(bodies))
    for _ in range(3):
        leader.pass_()
    assert leader.store.log_min() >= 6 * SEGMENT and leader.local.logical_min == 0  # below: only in the tier
    assert leader.local.queue_files_deleted > 0
    yield leader, make, bodies
    for node in made:
        node.stop()


def _join(leader: TierNode, replica: TierNode, before_shown=None):
    """The handshake (leader.py's welcome, replica.py's obedience to it), then the copy of the tail;
    ``before_shown()`` runs once the tail is copied but none of it shown to the replica's readers."""
    follower = replica.follower()
    session = ReplicaSession(leader.store, leader.node, follower.hello())
    with replica.node.apply_lock:
        follower._handshake(session.welcome)
    if before_shown is not None:
        copy(leader.store, replica.store, visible_to=replica.store.log_min())
        before_shown()
    copy(leader.store, replica.store)
    return session.welcome


def test_an_empty_replica_copies_only_the_local_tail_and_serves_every_offset_from_the_tier(group):
    leader, make, bodies = group
    replica = make("b")
    replica.node.become_replica("a", "a", 1)
    early = {}

    def before_shown():  # the ledger's records in the tail are not shown yet: the welcome's uploads serve
        early["pull"] = [m.record.body for m in replica.store.pull("t", 0, 0, 8, 1 << 20).messages]
    welcome = _join(leader, replica, before_shown)
    assert early["pull"] == [b for i, b in enumerate(bodies) if i % QUEUES == 0][:8]
    assert replica.store.tier_join.joined == 1 and welcome.tier_min == 0 and welcome.start_empty
    assert welcome.tier_uploads  # segments' and queue files' FINISHED records
    assert {q.topic for q in welcome.queues} == {"t"}  # the consumer offsets' and the ledger's start with the tail
    assert all(q.min_offset == 0 < q.first_offset for q in welcome.queues)  # files in the tier, and entries
    assert any(q.entries for q in welcome.queues)  # of the leader's first local file whose records are only there
    assert replica.segment_files() == leader.segment_files()  # the tail only: no segment below the local start
    assert replica.segment_files()[0] == leader.store.log_min() > 0
    expected = _queues(leader.store)
    assert [body for q in range(QUEUES) for _, _, body in expected[q][2]] == \
        [b for q in range(QUEUES) for i, b in enumerate(bodies) if i % QUEUES == q]
    assert expected[0][0] == 0 and _queues(replica.store) == expected  # offsets, physical offsets, bytes
    tiered = [phys for q in range(QUEUES) for _, phys, _ in expected[q][2] if phys < leader.store.log_min()]
    assert tiered and [replica.store.get_message(p).record for p in tiered] == \
        [leader.store.get_message(p).record for p in tiered]
    replica.pass_()  # its own local retention and uploader (a replica: nothing uploaded)
    assert _queues(replica.store) == expected

    replica.stop()
    replica.start()  # the queues' starts and the logical log come back from its files and the ledger in the tail
    replica.node.become_replica("a", "a", 1)
    assert _queues(replica.store) == expected

    more = _append(leader.store, 14, start=len(bodies))
    _join(leader, replica)  # caught up as usual: it holds what the leader continues
    assert replica.store.tier_join.joined == 0 and _queues(replica.store) == _queues(leader.store)

    leader.stop()  # the leader dies; the replica leads (epoch 2) and serves and appends after the same offsets
    replica.node.become_leader(2, frozenset({"b"}))
    wait_until(replica.store.replica_view.promoted_visible, "the promoted replica shows what it copied")
    after = replica.store.append("t", [MessageIn(body=b"after", queue_id=0)], replication="ASYNC")
    assert after[0].queue_offset == expected[0][1] + sum(1 for i in range(len(more)) if i % QUEUES == 0)
    got = _queues(replica.store)
    assert [body for _, _, body in got[0][2]] == \
        [b for i, b in enumerate(bodies + more) if i % QUEUES == 0] + [b"after"]
    replica.pass_()  # it uploads now: the tier's records are its ledger's
    assert replica.uploader.uploaded >= 0 and replica.uploader.copy_errors == 0


def test_a_replica_without_the_tier_is_refused_naming_the_flags(group):
    leader, make, _ = group
    replica = make("b", tier=False)
    replica.node.become_replica("a", "a", 1)
    hello = replica.follower().hello()
    assert not hello.reads_tier  # also what a node of an earlier version says (no such field)
    with pytest.raises(FailedPrecondition, match="--tier-url and --local-retention-ms"):
        ReplicaSession(leader.store, leader.node, hello)


def test_a_replica_left_behind_the_leaders_local_start_starts_again_from_the_tier(group):
    leader, make, bodies = group
    replica = make("b")
    replica.node.become_replica("a", "a", 1)
    _join(leader, replica)
    replica.stop()
    more = _append(leader.store, 20, start=len(bodies))
    for _ in range(3):
        leader.pass_()
    replica.start()
    replica.node.become_replica("a", "a", 1)
    assert replica.store.log_end() < leader.store.log_min()  # it stopped where the leader holds nothing now
    assert replica.ledger.catch_up().finished  # what it read of its old log
    early = {}

    def before_shown():  # its duties read the ledger meanwhile: the new log's, empty so far, and the welcome's
        replica.ledger.catch_up()
        early["pull"] = [m.record.body for m in replica.store.pull("t", 1, 0, 8, 1 << 20).messages]
    _join(leader, replica, before_shown)
    assert early["pull"] == [b for i, b in enumerate(bodies) if i % QUEUES == 1][:8]
    assert replica.store.tier_join.joined == 1 and replica.segment_files()[0] == leader.store.log_min()
    assert not list((replica.config.data_dir / "commitlog").glob("*.broken"))  # all it held was the leader's too
    expected = _queues(leader.store)
    assert _queues(replica.store) == expected
    assert sum(len(expected[q][2]) for q in range(QUEUES)) == len(bodies) + len(more)


def test_queue_entries_beyond_one_message_go_in_pages_and_the_replica_joins_identically(group):
    """The welcome's queue entries in pages of one entry (each queue split over several messages, as beyond
    WELCOME_ENTRY_BYTES), through the gRPC messages both ways (commitlog_service.replication): the welcome read
    back is the one sent, and the replica joined from it serves every queue as the leader does."""
    leader, make, _ = group
    replica = make("b")
    replica.node.become_replica("a", "a", 1)
    follower = replica.follower()
    assert follower.hello().pages_welcome
    welcome = ReplicaSession(leader.store, leader.node, follower.hello()).welcome
    entries = sum(len(q.entries) for q in welcome.queues) // cq_unit.ENTRY_SIZE
    assert entries >= 4 and max(len(q.entries) for q in welcome.queues) > cq_unit.ENTRY_SIZE
    messages = list(welcome_messages(welcome, page_bytes=cq_unit.ENTRY_SIZE))
    assert min(len(r) for r in welcome.tier_uploads) > cq_unit.ENTRY_SIZE  # each upload record a part of its own
    assert len(messages) == 1 + messages[0].welcome.more_parts == entries + len(welcome.tier_uploads)
    assert [m.WhichOneof("kind") for m in messages] == ["welcome"] + ["welcome_part"] * (len(messages) - 1)
    assert all(sum(len(q.entries) for q in (m.welcome.queues if i == 0 else m.welcome_part.queues))
               <= cq_unit.ENTRY_SIZE for i, m in enumerate(messages))
    got = welcome_in(messages[0].welcome, [m.welcome_part for m in messages[1:]])
    assert got == welcome
    with replica.node.apply_lock:
        follower._handshake(got)
    copy(leader.store, replica.store)
    assert replica.store.tier_join.joined == 1 and _queues(replica.store) == _queues(leader.store)
    one = list(welcome_messages(welcome))  # what fits one message goes in one, as to a replica of an earlier version
    assert len(one) == 1 and one[0].welcome.more_parts == 0
    assert welcome_in(one[0].welcome, []) == welcome


def _body(message):
    """A leader's welcome message's welcome or welcome part."""
    return message.welcome if message.WhichOneof("kind") == "welcome" else message.welcome_part


def _payload(message) -> tuple[int, int]:
    """(entry bytes, upload record bytes) of a leader's welcome message or welcome part."""
    body = _body(message)
    return sum(len(q.entries) for q in body.queues), sum(len(r) for r in body.tier_uploads)


def test_upload_records_beyond_one_message_go_in_parts_and_the_replica_reads_the_tier_from_them(group):
    """The welcome's upload records spread over several parts (a page of a few records, as the records of some
    80,000 uploads beside a full page of entries are beyond gRPC's 64 MiB): serialized as gRPC sends them and
    read back by the replica's stream, the welcome is the one sent, every message within the page, and the
    replica joined from it reads its tiered records from the tier before it shows any of the tail (the welcome's
    records alone say where they are)."""
    leader, make, bodies = group
    replica = make("b")
    replica.node.become_replica("a", "a", 1)
    follower = replica.follower()
    welcome = ReplicaSession(leader.store, leader.node, follower.hello()).welcome
    records = welcome.tier_uploads
    assert len(records) >= 6
    entry_bytes = sum(len(q.entries) for q in welcome.queues)
    page = entry_bytes + max(len(r) for r in records)  # the queues and a record or more in the welcome, then parts
    sent = [m.SerializeToString() for m in welcome_messages(welcome, page_bytes=page)]
    messages = [LeaderMessage.FromString(m) for m in sent]
    assert len(messages) == 1 + messages[0].welcome.more_parts >= 3
    assert all(sum(_payload(m)) <= page for m in messages)
    assert [bool(_payload(m)[1]) for m in messages] == [True] * len(messages)  # records in every part
    assert [r for m in messages for r in _body(m).tier_uploads] == list(records)
    stream = GrpcReplicationStream(_Stub(messages), "a", follower.hello(), silence_s=30)
    stream.read_welcome()
    stream.cancel()
    assert stream.welcome == welcome
    with replica.node.apply_lock:
        follower._handshake(stream.welcome)
    copy(leader.store, replica.store, visible_to=replica.store.log_min())  # the tail copied, none of it shown
    expected = _queues(leader.store)
    tiered = [(q, offset, phys, body) for q in range(QUEUES) for offset, phys, body in expected[q][2]
              if phys < leader.store.log_min()]
    assert tiered and tiered[0][2] == 0
    assert [replica.store.get_message(phys).record.body for _, _, phys, _ in tiered] == \
        [body for _, _, _, body in tiered]
    for q in range(QUEUES):
        got = replica.store.pull("t", q, 0, 8, 1 << 20).messages
        assert [m.record.body for m in got] == [b for i, b in enumerate(bodies) if i % QUEUES == q][:8]
    copy(leader.store, replica.store)
    assert replica.store.tier_join.joined == 1 and _queues(replica.store) == expected


def test_a_full_page_of_entries_and_90000_upload_records_go_in_messages_within_grpcs_limit():
    """The issue's case at its real sizes: 50 MiB of entries (more than a page) and 90,000 upload records of 190
    bytes (16 MiB): every message the leader sends is within gRPC's 64 MiB (before, the welcome carried a full page
    and every record, 65 MiB), and they read back as the welcome sent. To a replica of an earlier version that one
    message is refused naming the upgrade; one within 64 MiB goes as before."""
    entries = cq_unit.ENTRY.pack(1000, 40, 0) * ((50 << 20) // cq_unit.ENTRY_SIZE)
    records = tuple(i.to_bytes(4, "big") * 47 + b"rr" for i in range(90_000))
    welcome = Welcome("a", 1, 1 << 30, EpochHistory((EpochEntry(1, 0),)), start_empty=True, tier_min=0,
                      queues=(QueueStart("t", 0, 0, 0, entries, 1040),), tier_uploads=records)
    sizes, messages = [], []
    for message in welcome_messages(welcome):
        sizes.append(message.ByteSize())
        messages.append(LeaderMessage.FromString(message.SerializeToString()))
    assert len(sizes) == 2 and max(sizes) <= defaults.MAX_MESSAGE_BYTES
    assert welcome_in(messages[0].welcome, [m.welcome_part for m in messages[1:]]) == welcome
    # to a replica of an earlier version, one message: refused naming the upgrade, not failed by gRPC unexplained
    with pytest.raises(FailedPrecondition, match=r"is 69798840 bytes \(90000 upload records\).* earlier version: up"):
        next(welcome_messages(welcome, paged=False))
    small = dataclasses.replace(welcome, queues=(QueueStart("t", 0, 0, 0, entries[: 40 << 20], 1040),))
    assert len(list(welcome_messages(small, paged=False))) == 1  # 57 MiB: one message, as before


def test_the_loop_servicer_makes_the_welcomes_parts_off_the_loop(group, monkeypatch):
    """On a grpc.aio port (ReplicationServicer) the welcome's parts are cut and copied into messages on an
    executor thread, never on the event loop (at 512 MiB that is seconds of CPU the port's every call would wait
    on); the messages are the welcome the session made, in parts."""
    leader, make, _ = group
    replica = make("b")
    hello = replica.follower().hello()
    welcome = ReplicaSession(leader.store, leader.node, hello).welcome
    made_on = []
    real_parts = tier_join.parts

    def parts(*args):
        for part in real_parts(*args):
            made_on.append(threading.current_thread())
            yield part
    monkeypatch.setattr(tier_join, "parts", parts)
    monkeypatch.setattr(tier_join, "WELCOME_ENTRY_BYTES", 3 * cq_unit.ENTRY_SIZE)
    first = ReplicaMessage(hello=ReplicaHello(
        replica_id=hello.replica_id, address=hello.address, end_offset=hello.end_offset, min_offset=hello.min_offset,
        epochs=history_out(hello.history), segment_size_bytes=hello.segment_size_bytes, reads_tier=True,
        pages_welcome=True))

    async def requests():
        yield first
        await asyncio.Event().wait()  # the replica's acknowledgements: none

    async def welcome_of_the_stream():
        answers = ReplicationServicer(leader.store, leader.node).Replicate(requests(), None)
        messages = [await anext(answers)]
        for _ in range(messages[0].welcome.more_parts):
            messages.append(await anext(answers))
        await answers.aclose()
        return messages, threading.current_thread()
    messages, loop_thread = asyncio.run(welcome_of_the_stream())
    assert len(messages) > 2 and welcome_in(messages[0].welcome, [m.welcome_part for m in messages[1:]]) == welcome
    assert made_on and loop_thread not in made_on


def test_a_welcome_that_fits_one_message_is_the_message_sent_before_and_an_earlier_version_gets_one(group):
    """What fits one message (every test welcome here, at 48 MiB a page) is byte for byte the message of the
    version before paging; a replica of an earlier version (no pages_welcome) takes one message with every
    upload record, whatever the page."""
    leader, make, _ = group
    replica = make("b")
    welcome = ReplicaSession(leader.store, leader.node, replica.follower().hello()).welcome
    before = LeaderWelcome(leader_id=welcome.leader_id, epoch=welcome.epoch, truncate_to=welcome.truncate_to,
                           epochs=history_out(welcome.history), start_empty=welcome.start_empty, from_tier=True,
                           tier_min_offset=welcome.tier_min, tier_uploads=welcome.tier_uploads,
                           queues=[TieredQueueStart(topic=q.topic, queue_id=q.queue_id, min_offset=q.min_offset,
                                                    first_offset=q.first_offset, entries=q.entries,
                                                    physical_end=q.physical_end) for q in welcome.queues])
    before = LeaderMessage(welcome=before).SerializeToString()
    for paged in (True, False):
        one = list(welcome_messages(welcome, paged=paged))
        assert [m.SerializeToString() for m in one] == [before]
    one = list(welcome_messages(welcome, paged=False, page_bytes=cq_unit.ENTRY_SIZE))
    assert [m.SerializeToString() for m in one] == [before]


def test_the_welcomes_total_counts_its_upload_records(group, monkeypatch):
    """WELCOME_TOTAL_BYTES bounds what the leader builds for one join: the queues' entries and the upload records
    it encodes for it, together."""
    leader, make, _ = group
    replica = make("b")
    hello = replica.follower().hello()
    welcome = ReplicaSession(leader.store, leader.node, hello).welcome
    need = sum(len(q.entries) for q in welcome.queues) + sum(len(r) for r in welcome.tier_uploads)
    monkeypatch.setattr(tier_join, "WELCOME_TOTAL_BYTES", need)
    assert ReplicaSession(leader.store, leader.node, hello).welcome == welcome
    monkeypatch.setattr(tier_join, "WELCOME_TOTAL_BYTES", need - 1)
    with pytest.raises(FailedPrecondition, match=f"needs {need} bytes .* upload records.* more than a welcome"):
        ReplicaSession(leader.store, leader.node, hello)


def test_parts_carry_queues_then_records_within_the_page():
    """tier_join.parts on made-up welcomes: the queues' pages, then the records whole in the rest of the last page
    and the parts after; every part within the page (a record larger than a page alone), the queues merged and
    the records concatenated back equal; None: one part holding all."""
    entries = b"".join(cq_unit.ENTRY.pack(1000 + 50 * i, 40, 0) for i in range(5))
    starts = (QueueStart("a", 0, 0, 0, entries, 1000 + 50 * 4 + 40), QueueStart("b", 0, 0, 0, b"", 0))
    records = tuple(bytes([i]) * size for i, size in enumerate((10, 30, 7, 100, 1, 1, 45, 60)))
    for page in (cq_unit.ENTRY_SIZE, 45, 61, 100, 150, 1000):
        made = list(tier_join.parts(starts, records, page))
        assert len(made) == tier_join.part_count(starts, records, page)
        for queues, uploads in made:
            size = sum(len(q.entries) for q in queues) + sum(len(r) for r in uploads)
            assert size <= page or (len(uploads) == 1 and not any(q.entries for q in queues))
        assert tier_join.merged([q for queues, _ in made for q in queues]) == starts
        assert tuple(r for _, uploads in made for r in uploads) == records
    assert list(tier_join.parts(starts, records, 1000)) == [(starts, records)]
    assert list(tier_join.parts(starts, records, None)) == [(starts, records)]
    assert list(tier_join.parts((), (), 10)) == [((), ())]
    assert [len(u) for _, u in tier_join.parts((), records, 45)] == [2, 1, 1, 2, 1, 1]  # 10+30, 7, 100, 1+1, 45, 60


def test_a_replica_of_an_earlier_version_is_refused_beyond_one_message_and_any_beyond_the_total(group, monkeypatch):
    leader, make, _ = group
    replica = make("b")
    replica.node.become_replica("a", "a", 1)
    hello = replica.follower().hello()
    welcome = ReplicaSession(leader.store, leader.node, hello).welcome
    carried = sum(len(q.entries) for q in welcome.queues)
    monkeypatch.setattr(tier_join, "WELCOME_ENTRY_BYTES", carried - 1)  # one byte fewer than they need
    assert ReplicaSession(leader.store, leader.node, hello).welcome.queues == welcome.queues  # paged: joins
    earlier = dataclasses.replace(hello, pages_welcome=False)  # its hello has no pages_welcome
    with pytest.raises(FailedPrecondition, match="more than one welcome carries to a replica of an earlier"):
        ReplicaSession(leader.store, leader.node, earlier)
    monkeypatch.setattr(tier_join, "WELCOME_TOTAL_BYTES", carried - 1)
    with pytest.raises(FailedPrecondition, match="more than a welcome carries in all"):
        ReplicaSession(leader.store, leader.node, hello)
    assert replica.store.log_end() == 0 and replica.store.tier_join.joined == 0


def test_pages_split_and_merge_back_any_queue_shape():
    """tier_join.pages/merged on made-up queues: empty ones, one larger than several pages, pages that end exactly
    at a queue's end; every page within its size, merged back equal; a piece that does not continue is refused."""
    def entries(first, count, blank_last=False):
        out = [cq_unit.ENTRY.pack(1000 + 50 * i, 40, 0) for i in range(first, first + count)]
        if blank_last and out:
            out[-1] = cq_unit.BLANK_ENTRY
        return b"".join(out)
    starts = (QueueStart("a", 0, 0, 10, entries(10, 7), 1000 + 50 * 16 + 40),
              QueueStart("a", 1, 0, 0, b"", 0),
              QueueStart("b", 0, 3, 5, entries(5, 2, blank_last=True), 1000 + 50 * 5 + 40),
              QueueStart("c", 2, 0, 4, entries(4, 12), 1000 + 50 * 15 + 40))
    for page_entries in (1, 2, 3, 7, 9, 100):
        paged = tier_join.pages(starts, page_entries * cq_unit.ENTRY_SIZE)
        assert all(sum(len(q.entries) for q in page) <= page_entries * cq_unit.ENTRY_SIZE for page in paged)
        assert tier_join.merged([q for page in paged for q in page]) == starts
    assert len(tier_join.pages(starts, 100 * cq_unit.ENTRY_SIZE)) == 1
    with pytest.raises(InvalidArgument, match="does not continue"):
        tier_join.merged([starts[0], QueueStart("a", 0, 0, 18, entries(18, 1), 1)])


def test_a_replica_killed_between_the_join_and_the_tail_joins_again(group):
    """kill -9 (halt: no final checkpoint) after the join took the welcome in, before a byte of the tail: its
    log is still empty at the leader's local start, so the next handshake starts it from the tier again."""
    leader, make, _ = group
    replica = make("b")
    replica.node.become_replica("a", "a", 1)
    follower = replica.follower()
    with replica.node.apply_lock:
        follower._handshake(ReplicaSession(leader.store, leader.node, follower.hello()).welcome)
    replica.store.halt()
    replica.tier.close()
    replica.start()
    replica.node.become_replica("a", "a", 1)
    assert replica.store.log_min() == replica.store.log_end() == leader.store.log_min()
    _join(leader, replica)
    assert replica.store.tier_join.joined == 1 and _queues(replica.store) == _queues(leader.store)


class _Call:
    """A Replicate call's answers (the leader's messages), as the replica's GrpcReplicationStream reads them."""

    def __init__(self, messages):
        self._messages = iter(messages)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._messages)

    def cancel(self):
        pass


class _Stub:
    def __init__(self, messages):
        self.messages = messages

    def Replicate(self, requests):
        return _Call(self.messages)


def test_the_replicas_stream_reads_every_part_of_a_welcome_and_refuses_one_cut_short(group):
    leader, make, _ = group
    replica = make("b")
    hello = replica.follower().hello()
    welcome = ReplicaSession(leader.store, leader.node, hello).welcome
    messages = list(welcome_messages(welcome, page_bytes=cq_unit.ENTRY_SIZE))
    assert len(messages) > 2
    stream = GrpcReplicationStream(_Stub(messages), "a", hello, silence_s=30)
    stream.read_welcome()
    stream.cancel()
    assert stream.welcome == welcome
    cut = GrpcReplicationStream(_Stub(messages[:-1]), "a", hello, silence_s=30)
    with pytest.raises(Unavailable, match=f"ended its welcome after {len(messages) - 1} of {len(messages)} parts"):
        cut.read_welcome()
