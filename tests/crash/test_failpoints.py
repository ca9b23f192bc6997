"""Every registered failpoint (mqstore.failpoints.KNOWN) has a crash scenario here: it reaches the
failpoint, crashes there (raised in-process, or os._exit in a child process where the process dying
is the crash that matters), reopens from disk and checks the invariants: nothing acknowledged is lost,
queue offsets stay dense, an unacknowledged batch is whole or absent, and the part works on after.
A failpoint registered without a scenario fails ``test_every_failpoint``.

The subject's own crash tests go deeper (tests/crash/test_recovery_inprocess.py, test_staged_install.py,
tests/unit/index/test_index_recovery.py); these check that each crash point is reachable and safe.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Callable

import pytest

from mqstore.index.store import IndexStore
from mqstore.index.tier import IndexTierConfig, dir_url, open_tier
from mqstore import failpoints, fs
from mqstore.clock import FakeClock
from mqstore.config import StoreConfig
from mqstore.errors import CorruptLog
from mqstore.log.repair import repair
from mqstore.model import MessageIn
from mqstore.replication import store_ops
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
from tests.crash.test_compaction_crash import crash_in_drop, crash_in_roll, crash_in_round
from tests.crash.test_topic_delete_crash import crash_in_delete
from tests.crash.test_staged_install import OUTCOME, REPLACED, UNTOUCHED, _contents, _prepare
from tests.support.compaction import put
from tests.support.compaction_tier import Rig, everything, fill
from tests.unit.index.index_testing import BASE_MS, Model, all_pages, record, tiny_config

pytestmark = pytest.mark.crash
SCENARIOS: dict[str, Callable] = {}


def scenario(*names: str):
    def register(function):
        for name in names:
            SCENARIOS[name] = function
        return function
    return register


@pytest.mark.parametrize("name", sorted(failpoints.KNOWN))
def test_every_failpoint(name, tmp_path, failpoint):
    assert name in SCENARIOS, f"failpoint {name!r} has no crash scenario: add one to {__file__}"
    SCENARIOS[name](name, tmp_path, failpoint)


# ---- the commit log ---------------------------------------------------------------------------------------

def _config(tmp_path: pathlib.Path, **overrides) -> StoreConfig:
    # Long intervals and no warmer: only the scenario's own call reaches the failpoint, no background duty.
    values = dict(data_dir=tmp_path / "store", segment_size_bytes=16 * 1024, cq_entries_per_file=64,
                  flush_interval_ms=20, checkpoint_interval_ms=600_000, clean_interval_ms=600_000,
                  warm_ahead_bytes=0)
    values.update(overrides)
    return StoreConfig(**values)


def _batch(tag: str, count: int = 5) -> list[MessageIn]:
    return [MessageIn(body=f"{tag}-{i}".encode() * 100, queue_id=i % 2) for i in range(count)]


def _fill(store: MessageStore, batches: int) -> list[bytes]:
    acked = []
    for b in range(batches):
        batch = _batch(f"acked{b}")
        store.append("t", batch)
        acked += [m.body for m in batch]
    return acked


def _started(config: StoreConfig, batches: int) -> tuple[MessageStore, list[bytes]]:
    """A started store with topic "t" (2 queues) and ``batches`` acknowledged batches."""
    store = build_store(config)
    store.start()
    store.topic_admin.create("t", 2)
    return store, _fill(store, batches)


def _check_store(config: StoreConfig, acked: list[bytes], maybe: list[bytes] = ()) -> None:
    """Reopen: every acknowledged message, in order and with dense queue offsets; ``maybe`` (a batch
    that was never acknowledged) whole or absent; and an append works."""
    store = build_store(config)
    store.start()
    try:
        got = {}
        for queue_id in range(2):
            messages = store.pull("t", queue_id, 0, 10_000, 8 << 20).messages
            assert [m.record.queue_offset for m in messages] == list(range(len(messages)))
            got[queue_id] = [m.record.body for m in messages]
        found = [body for body in maybe if body in got[0] + got[1]]
        assert found in ([], list(maybe)), "an unacknowledged batch is whole or absent"
        for queue_id in range(2):
            expected = [b for i, b in enumerate(acked) if i % 5 % 2 == queue_id]
            assert got[queue_id][:len(expected)] == expected
        store.append("t", _batch("after"))
    finally:
        store.stop()


_CHILD = """
import pathlib, sys
from mqstore import failpoints
from mqstore.config import StoreConfig
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store
store = build_store(StoreConfig(data_dir=pathlib.Path(sys.argv[1]), segment_size_bytes=16 * 1024,
                                 cq_entries_per_file=64, flush_mode=sys.argv[3], warm_ahead_bytes=0,
                                 checkpoint_interval_ms=600_000, disk_max_used_ratio=float(sys.argv[4])))
store.start()
failpoints.arm(sys.argv[2], "exit")
store.append("t", [MessageIn(body=f"crash-{i}".encode() * 100, queue_id=i % 2) for i in range(5)])
"""


@scenario("log.after_write", "log.after_flush")
def _append_dies(name, tmp_path, failpoint):
    """A process exit once a batch is copied into the log (ASYNC), or fsynced but not yet acknowledged
    (SYNC): the crash that matters is the process dying there, so it runs in a child process."""
    flush_mode = "ASYNC" if name == "log.after_write" else "SYNC"
    config = _config(tmp_path, flush_mode=flush_mode)
    store, acked = _started(config, 3)
    store.stop()
    child = subprocess.run([sys.executable, "-c", _CHILD, str(config.data_dir), name, flush_mode,
                            str(config.disk_max_used_ratio)],
                           capture_output=True, timeout=60)
    assert child.returncode == 137, child.stderr.decode()
    crashed = [m.body for m in _batch("crash")]
    _check_store(config, acked, crashed)


@scenario("checkpoint.before_rename")
def _checkpoint_cut(name, tmp_path, failpoint):
    config = _config(tmp_path)
    store, acked = _started(config, 3)
    # The maintenance duty's first checkpoint, late on a loaded machine, would otherwise meet the
    # failpoint too, and its retry would write the checkpoint this scenario cuts.
    assert store.maintenance.stop(10.0)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        store.write_checkpoint()
    store.halt()  # as if killed there: the new checkpoint is a .tmp file, the old one stays
    assert (config.data_dir / "checkpoint.tmp").exists()
    _check_store(config, acked)


@scenario("segment.after_create")
def _segment_created(name, tmp_path, failpoint):
    config = _config(tmp_path)
    store, acked = _started(config, 2)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        for b in range(10):  # until a batch needs the next segment
            store.append("t", _batch(f"late{b}"))
            acked += [m.body for m in _batch(f"late{b}")]
    store.halt()
    _check_store(config, acked)


@scenario("repair.after_copy")
def _repair_cut(name, tmp_path, failpoint):
    config = _config(tmp_path)
    store, acked = _started(config, 4)
    victim = store.append("t", _batch("victim"))[0]
    _fill(store, 1)
    store.stop()
    segment = config.commitlog_dir / f"{victim.physical_offset - victim.physical_offset % (16 * 1024):020d}"
    with open(segment, "r+b") as f:  # a body byte: corruption with data after it
        f.seek(victim.physical_offset % (16 * 1024) + 100)
        f.write(b"\xff\x00\xff")
    with pytest.raises(CorruptLog):
        build_store(config).start()
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        repair(config.data_dir)
    assert repair(config.data_dir).corrupt  # run again after the crash: it finishes
    assert list(config.commitlog_dir.glob("*.broken*"))
    _check_store(config, acked)


# ---- the index --------------------------------------------------------------------------------------------

class _Index:
    """An IndexStore over tmp_path with a model of everything fed; ``reopen`` is the restart after a
    crash (the old object is dropped, not closed), followed by the follower's re-feed."""

    def __init__(self, tmp_path: pathlib.Path, with_tier: bool = False):
        self.tmp_path = tmp_path
        self.config = tiny_config(tmp_path, entry_count=9, max_keys_per_message=2)
        self.with_tier = with_tier
        self.model = Model()
        self.fed: list = []
        self.opened: list[IndexStore] = []
        self.tiers: list = []

    def open(self) -> IndexStore:
        (self.tmp_path / "tier").mkdir(exist_ok=True)  # (a file:// tier's directory exists, as a bucket does)
        tier = open_tier(IndexTierConfig(tier_url=dir_url(self.tmp_path / "tier"))) if self.with_tier else None
        if tier is not None:
            self.tiers.append(tier)
        store = IndexStore(self.config, clock=FakeClock(BASE_MS + 10**9), tier=tier)
        store.start()
        self.opened.append(store)
        return store

    def records(self, first: int, count: int) -> list:
        records = [record(100 * i, [f"k{i % 5}", f"k{i * 3 % 5}"]) for i in range(first, first + count)]
        for rec in records:
            self.model.add(rec)
        self.fed += records
        return records

    def feed(self, store: IndexStore, first: int, count: int) -> None:
        store.apply(self.records(first, count), 100 * (first + count))

    def reopen_and_check(self) -> IndexStore:
        store = self.open()
        resume = store.resume_physical_offset()
        store.apply([r for r in self.fed if r.physical_offset >= resume], self.fed[-1].physical_offset + 100)
        for key in (f"k{i}" for i in range(5)):
            assert all_pages(store, "T", key) == self.model.query("T", key, 0, 1 << 62), key
        if store.tier is not None:  # the first maintenance round leaves exactly the objects the manifest names
            store.tidy_tier()
            assert set(store.tier.keys()) == {f.key for f in store.tier_manifest.finished.values()}
        return store

    def close(self) -> None:
        for store in self.opened:
            store.close()
        for tier in self.tiers:
            tier.close()


def _index_crash(name, tmp_path, failpoint, action, prepare=lambda store: None, with_tier=False):
    harness = _Index(tmp_path, with_tier)
    try:
        store = harness.open()
        harness.feed(store, 1, 12)
        prepare(store)
        with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
            action(harness, store)
        harness.reopen_and_check()
    finally:
        harness.close()


@scenario("index.checkpoint.before_rename")
def _index_checkpoint(name, tmp_path, failpoint):
    _index_crash(name, tmp_path, failpoint, lambda h, s: s.checkpoint())


@scenario("index.roll.after_create")
def _index_roll(name, tmp_path, failpoint):
    def apply_until_a_roll(h, store):
        for first in range(13, 200, 2):
            h.feed(store, first, 2)
    _index_crash(name, tmp_path, failpoint, apply_until_a_roll, prepare=lambda s: s.checkpoint())


@scenario("index.compact.after_write", "index.compact.after_rename")
def _index_compact(name, tmp_path, failpoint):
    _index_crash(name, tmp_path, failpoint, lambda h, s: s.convert_sealed(10))


@scenario("index.tier.started", "index.tier.after_put", "index.tier.finished")
def _index_tier(name, tmp_path, failpoint):
    _index_crash(name, tmp_path, failpoint, lambda h, s: s.move_to_tier(10), prepare=lambda s: s.convert_sealed(10),
                 with_tier=True)


@scenario("index.tier_manifest.snapshot_written")
def _index_tier_manifest(name, tmp_path, failpoint):
    """A change of the tier manifest that compacts it dies between the new snapshot and the log's truncation:
    the restart skips the log's records the snapshot holds and truncates it (mqstore.index.tier_manifest)."""
    def prepare(store):
        store.convert_sealed(10)
        assert store.move_to_tier(1) == 1  # a snapshot and records in the log
        store.tier_manifest.max_log_records = 1  # the next change compacts
    _index_crash(name, tmp_path, failpoint, lambda h, s: s.move_to_tier(10), prepare=prepare, with_tier=True)


@scenario("compaction.tier.started", "compaction.tier.after_put", "compaction.tier.finished")
def _compaction_tier(name, tmp_path, failpoint):
    """A pass dies at the step (the process abandoned as it is); the restarted one's pass uploads every sealed
    segment once, deletes what the dead one left, and reads stay byte-identical with the local files gone."""
    crashed = Rig(tmp_path, local_retention_bytes=1)
    fill(crashed.open(), crashed.clock)
    before = everything(crashed.store)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        crashed.tier.run_pass(crashed.store)
    rig = Rig(tmp_path, local_retention_bytes=1)
    rig.open()
    try:
        rig.tier.run_pass(rig.store)
        manifest = rig.tier.segments()
        assert {w[2] for w in manifest} == set(rig.qlog.bases[:-1]) == rig.qlog.tiered
        assert set(rig.objects()) == {s.key for s in manifest.values()}
        assert everything(rig.store) == before
    finally:
        rig.close()


@scenario("compaction.tier_manifest.snapshot_written")
def _compaction_tier_manifest(name, tmp_path, failpoint):
    """A pass dies once a snapshot of the tier's manifest is put, before the objects below the snapshot before it
    are deleted: the restart reads the same entries, its load deletes those objects, and a pass completes."""
    crashed = Rig(tmp_path, local_retention_bytes=1)
    store = crashed.open()
    crashed.tier.manifest.max_deltas = crashed.tier.manifest.min_deltas = 2
    fill(store, crashed.clock, count=120)
    crashed.tier.run_pass(store)  # snapshots exist
    for offset in range(120, 240):
        put(store, f"k{offset % 12}", f"k{offset % 12}@{offset}".encode() * 8, offset, crashed.clock.now_ms())
    store.slot("kv", 0).qlog.seal_active()
    before = everything(store)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        crashed.tier.run_pass(store)
    left = crashed.tier.segments()
    rig = Rig(tmp_path, local_retention_bytes=1)
    rig.open()
    try:
        assert rig.tier.segments() == left
        snapshots = sorted(p.name for p in (tmp_path / "tier").rglob("*.snapshot.json"))
        oldest = min(p.name[:20] for p in (tmp_path / "tier").rglob("*.json"))
        assert len(snapshots) == 2 and oldest == snapshots[0][:20]  # nothing below the snapshot before the newest
        rig.tier.run_pass(rig.store)
        manifest = rig.tier.segments()
        assert {w[2] for w in manifest} == set(rig.qlog.bases[:-1]) == rig.qlog.tiered
        assert set(rig.objects()) == {s.key for s in manifest.values()}
        assert everything(rig.store) == before
    finally:
        rig.close()


@scenario("index.rebuild.after_rename")
def _index_rebuild(name, tmp_path, failpoint):
    harness = _Index(tmp_path)
    try:
        store = harness.open()
        harness.feed(store, 1, 16)
        store.close()
        directory = harness.config.index_dir
        oldest = sorted(p for p in directory.iterdir() if p.suffix == ".idx")[0]
        with open(oldest, "r+b") as f:
            f.truncate(50)  # damaged: quarantined and rebuilt from the log at the next start
        store = harness.open()
        [damaged] = store.rebuild_ranges()

        def rebuild(h, s):
            s.apply_rebuild(damaged.start_physical_offset, [
                r for r in h.fed if damaged.start_physical_offset <= r.physical_offset < damaged.end_physical_offset])
            s.finish_rebuild(damaged.start_physical_offset)
        with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
            rebuild(harness, store)
        again = harness.open()
        assert [r.start_physical_offset for r in again.rebuild_ranges()] == [damaged.start_physical_offset]
        rebuild(harness, again)
        harness.reopen_and_check()
    finally:
        harness.close()


# ---- the staged install -----------------------------------------------------------------------------------

@scenario(*OUTCOME)
def _install(name, tmp_path, failpoint):
    directory, staged = _prepare(tmp_path)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        fs.install(directory, staged, REPLACED)
    fs.recover_install(directory)
    assert _contents(directory) == {**OUTCOME[name], **UNTOUCHED}


# ---- the Transaction service (real processes: tests/crash/txn_crash.py) -------------------------------------

@scenario("txn.prepare.after_half", "txn.commit.before_real", "txn.commit.after_real", "txn.op.before_write",
          "txn.op.after_write", "txn.checkpoint.before_rename")
def _txn(name, tmp_path, failpoint):
    from tests.crash.txn_crash import crash_at
    crash_at(name, tmp_path)


# ---- pop consumption (tests/crash/test_pop_kill9.py crashes real processes at the same points) ---------------

@scenario("pop.receive.after_ck", "pop.ack.after_record", "pop.change.after_ck", "pop.forward.after_copy",
          "pop.revive.after_copy")
def _pop(name, tmp_path, failpoint):
    from tests.crash.pop_crash import crash_at
    crash_at(name, tmp_path)


# ---- compaction logs (tests/crash/test_compaction_crash.py also crashes a round at every install step) ----

@scenario("compaction.round.staged")
def _compaction_round(name, tmp_path, failpoint):
    crash_in_round(name, tmp_path, failpoint)


@scenario("compaction.roll.sealed")
def _compaction_roll(name, tmp_path, failpoint):
    crash_in_roll(name, tmp_path, failpoint)


@scenario("compaction.topic.dropping", "compaction.topic.renamed")
def _compaction_drop(name, tmp_path, failpoint):
    crash_in_drop(name, tmp_path, failpoint)


@scenario("topic.delete.marked", "topic.delete.announced", "topic.delete.queues_dropped")
def _topic_delete(name, tmp_path, failpoint):
    crash_in_delete(name, tmp_path, failpoint)


# ---- replication --------------------------------------------------------------------------------------------

@scenario("replication.epochs.before_rename")
def _epoch_file_replace(name, tmp_path, failpoint):
    """A crash while a new leader records its epoch: the old epoch file is whole, the node did not lead
    (no write of the new epoch happened), and the next election records it."""
    from mqstore.replication import epochs
    from mqstore.replication.config import ReplicationConfig
    from mqstore.replication.node import ReplicationNode
    config = _config(tmp_path)
    store, acked = _started(config, 2)
    path = config.data_dir / "epochs"

    def node() -> ReplicationNode:
        return ReplicationNode(ReplicationConfig(node_id="a"), FakeClock(), path, log_end=store.log_end,
                               flush_sync=False)
    node().become_leader(1, frozenset())
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        node().become_leader(2, frozenset())
    assert [(e.epoch, e.start_offset) for e in epochs.load(path).entries] == [(1, store.log_end())]
    again = node()
    assert not again.is_leader
    again.become_leader(2, frozenset())
    assert epochs.load(path).last_epoch == 2
    store.stop()
    _check_store(config, acked)


@scenario("replication.truncate.after_copy")
def _truncate_after_copy(name, tmp_path, failpoint):
    """A crash between the .broken copies of a diverged tail and the cut: the log is whole; after a
    restart the same truncation runs again and cuts exactly the tail."""
    config = _config(tmp_path)
    store, acked = _started(config, 4)
    point = store.log_end()
    _fill(store, 2)  # the tail a new leader does not have
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        store_ops.truncate(store, point)
    assert store.log_end() > point and list(config.commitlog_dir.glob("*.broken*"))
    store.halt()  # the crash
    store = build_store(config)
    store.start()
    store_ops.truncate(store, point)
    assert store.log_end() == point
    store.stop()
    _check_store(config, acked)


# ---- the object storage tier's uploader -------------------------------------------------------------------

@scenario("tier.upload.started", "tier.upload.after_put")
def _tier_upload_cut(name, tmp_path, failpoint):
    """The uploader dies between its STARTED record and its put, or after the put (the object stored, not yet
    verified nor FINISHED); the node restarts from disk: every sealed segment ends FINISHED exactly once, its
    object the segment's bytes, and no other object is left (mqstore.tier.uploader)."""
    from mqstore.tier.ledger import Ledger
    from mqstore.tier.sealed import sealed_segments
    from mqstore.tier.uploader import Uploader
    from mqstore.tier.urls import open_store
    from tests.support.waiting import wait_until

    def uploader(store, tier):
        return Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=lambda: 0,
                        ready=lambda: True, log_min=store.log_min, interval_ms=600_000)
    config = _config(tmp_path)
    store, acked = _started(config, 12)  # ~ 3 segments of 16 KiB
    wait_until(lambda: sealed_segments(store), "a sealed segment")
    (tmp_path / "tier").mkdir(exist_ok=True)
    tier = open_store(f"file://{tmp_path}/tier", timeout_ms=10_000)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        uploader(store, tier).step()
    store.halt()  # as if killed there
    _check_store(config, acked)
    store = build_store(config)
    store.start()
    try:
        again = uploader(store, tier)
        again.step()
        finished, pending = again.ledger.snapshot()
        sealed = {s.base: s.read() for s in sealed_segments(store)}
        assert not pending and again.ledger.conflicts == 0 and sorted(finished) == sorted(sealed)
        objects = {info.key: tier.get_range(info.key, 0, info.size) for info in tier.list("commitlog")}
        assert objects == {finished[base].key: data for base, data in sealed.items()}
    finally:
        store.stop()
        tier.close()


@scenario("tier.upload.queue_file.started", "tier.upload.queue_file.after_put")
def _tier_queue_file_upload_cut(name, tmp_path, failpoint):
    """The uploader dies between a consume queue file's STARTED record and its put, or after the put; the node
    restarts from disk: every sealed queue file ends FINISHED exactly once, its object the file's bytes, and no
    other object is left under consumequeue/ (mqstore.tier.uploader)."""
    from mqstore.tier.ledger import Ledger
    from mqstore.tier.sealed import sealed_queue_files, sealed_segments
    from mqstore.tier.uploader import Uploader
    from mqstore.tier.urls import open_store
    from tests.support.waiting import wait_until

    def uploader(store, tier):
        return Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=lambda: 0,
                        ready=lambda: True, log_min=store.log_min, interval_ms=600_000,
                        queue_files=lambda: sealed_queue_files(store), segment_size=config.segment_size_bytes)
    config = _config(tmp_path, cq_entries_per_file=8)
    store, acked = _started(config, 12)  # ~ 3 segments of 16 KiB, 30 entries in each of 2 queues
    store.write_checkpoint()  # the queue files flushed
    wait_until(lambda: sealed_segments(store) and sealed_queue_files(store), "a sealed segment and queue file")
    (tmp_path / "tier").mkdir(exist_ok=True)
    tier = open_store(f"file://{tmp_path}/tier", timeout_ms=10_000)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        uploader(store, tier).step()
    store.halt()  # as if killed there
    _check_store(config, acked)
    store = build_store(config)
    store.start()
    try:
        again = uploader(store, tier)
        again.step()
        queues = again.ledger.queue_snapshot()
        assert all(not pending for _, pending in queues.values()) and again.ledger.conflicts == 0
        finished = {(topic, queue_id, base): u for (topic, queue_id), (files, _) in queues.items()
                    for base, u in files.items()}
        assert finished
        objects = {info.key: tier.get_range(info.key, 0, info.size) for info in tier.list("consumequeue")}
        sealed = {(f.topic, f.queue_id, f.file.base): f.file.read() for f in sealed_queue_files(store)}
        assert objects == {u.key: sealed[where] for where, u in finished.items()}  # byte-identical, no orphan
    finally:
        store.stop()
        tier.close()


@scenario("tier.retention.after_delete")
def _tier_retention_cut(name, tmp_path, failpoint):
    """The tier's retention dies after deleting an expired segment's object, before its DELETED record; the node
    restarts from disk: the next pass finishes it, so no object of a segment below the log is left, every one
    above is kept, and the ledger has no conflict (mqstore.tier.uploader)."""
    from mqstore.tier.ledger import Ledger
    from mqstore.tier.sealed import sealed_segments
    from mqstore.tier.uploader import Uploader
    from mqstore.tier.urls import open_store
    from tests.support.waiting import wait_until

    def uploader(store, tier):
        return Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=lambda: 0,
                        ready=lambda: True, log_min=store.log_min, interval_ms=600_000)
    config = _config(tmp_path)
    store, _ = _started(config, 12)  # ~ 3 segments of 16 KiB
    wait_until(lambda: len(sealed_segments(store)) >= 2, "two sealed segments")
    (tmp_path / "tier").mkdir(exist_ok=True)
    tier = open_store(f"file://{tmp_path}/tier", timeout_ms=10_000)
    first = uploader(store, tier)
    store.retention.add_floor("tier", first.retention_floor)
    first.step()
    object.__setattr__(store.retention._config, "retention_ms", 1)  # every uploaded segment expired
    wait_until(lambda: store.retention._expired_end(store.clock.now_ms()), "the segments expired")
    assert store.retention.delete_expired_segments() >= 1
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        first.step()
    store.halt()  # as if killed there
    store = build_store(config)
    store.start()
    try:
        again = uploader(store, tier)
        again.step()
        finished, pending = again.ledger.snapshot()
        low = store.log_min()
        assert not pending and again.ledger.conflicts == 0 and all(base >= low for base in finished)
        objects = {info.key: info for info in tier.list("commitlog")}
        assert set(objects) == {u.key for u in finished.values()}  # the expired ones gone, none other left
        assert all(int(key.split("/")[1]) >= low for key in objects)
    finally:
        store.stop()
        tier.close()
