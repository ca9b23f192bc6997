"""Consumer offsets fail over with the log (mqstore.consumer_offsets): three CommitLog nodes through etcd,
SYNC replication by default, committers streaming CommitOffsets to the leader, then kill -9 of the leader,
twice. A replica answers QueryOffset from its own map (warm, from the records it copied); the new leader
answers every acknowledged offset (or the one in flight at the kill), never an older one, with no shared
database holding offsets (the SQL table stays empty)."""

from __future__ import annotations

import sqlite3
import threading
import time

import grpc
import pytest

from mqstore.clock import SystemClock
from mqstore.meta import MetadataStore
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from tests.crash.test_failover import TTL_FLAGS
from tests.support.ha import Group, group_on_etcd
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.e2e]

QUEUES = 2
COMMITTERS = 3
# Far more than the test waits for (about 120 values of the sum, twice), so the committers are still
# committing at each kill: at 200 they could finish before the second target and the wait timed out.
MAX_OFFSET = 2000


@pytest.fixture
def group(tmp_path):
    # Topics in SQL (accepted by --shared-sql-metadata): an earlier version's offsets table is SQL's alone
    with group_on_etcd(tmp_path, *TTL_FLAGS, "--metadata-url", f"sqlite:///{tmp_path / 'metadata.db'}",
                       "--shared-sql-metadata") as g:
        yield g


class Committers:
    """Commit 1, 2, 3... for every queue of groups g0..g2 through whichever node leads; ``acked`` and
    ``pending`` (the commit in flight) per (group, queue)."""

    def __init__(self, group: Group):
        self.group = group
        self.acked: dict[tuple[str, int], int] = {}
        self.pending: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(f"g{c}",)) for c in range(COMMITTERS)]

    def _run(self, name: str) -> None:
        offset = 0
        while not self.stop.is_set() and offset < MAX_OFFSET:
            found = self.group.leader()
            if found is None:
                time.sleep(0.02)
                continue
            queue_id = offset % QUEUES
            value = offset // QUEUES + 1
            with self.lock:
                self.pending[(name, queue_id)] = value
            try:
                self.group.log(found[0]).CommitOffset(pb.CommitOffsetRequest(
                    group=name, topic="ha", queue_id=queue_id, offset=value), timeout=5)
            except grpc.RpcError:
                continue  # not acknowledged (the leader died or a replica answered): commit it again
            with self.lock:
                self.acked[(name, queue_id)] = value
            offset += 1

    def count(self) -> int:
        with self.lock:
            return sum(self.acked.values())

    def caught_up(self, stub) -> bool:
        try:
            self.check(stub)
        except AssertionError:
            return False
        return True

    def check(self, stub) -> None:
        """Every key reads back at least what was acknowledged before the read, at most what was sent by its end
        (the committers may go on meanwhile)."""
        with self.lock:
            acked = dict(self.acked)
        for (name, queue_id), value in sorted(acked.items()):
            got = stub.QueryOffset(pb.QueryOffsetRequest(group=name, topic="ha", queue_id=queue_id), timeout=10).offset
            with self.lock:
                sent = self.pending[(name, queue_id)]
            assert value <= got <= sent, f"{name}/{queue_id}: read {got}, acknowledged {value}, sent {sent}"


def test_the_new_leader_answers_every_acknowledged_offset(group, tmp_path):
    group.start_all()
    leader, epoch = group.wait_leader()
    stub = group.log(leader)
    stub.CreateTopic(pb.CreateTopicRequest(name="ha", queue_count=QUEUES), timeout=10)
    wait_until(lambda: len(group.state(leader).in_sync) == 3, "all three nodes in sync", timeout_s=30)
    for _ in range(QUEUES * 2 * MAX_OFFSET // 1000):  # batches of 1000, the limit
        group.append(leader, "ha", [b"m"] * 1000)  # the queues hold the offsets committed
    committers = Committers(group)
    for t in committers.threads:
        t.start()
    try:
        for _ in range(2):
            target = committers.count() + 60
            wait_until(lambda target=target: committers.count() >= target, "acknowledged commits", timeout_s=60)
            group.kill9(leader)
            killed = leader
            leader, epoch = group.wait_leader(above_epoch=epoch, timeout_s=30)
            committers.check(group.log(leader))
            group.start(killed)
    finally:
        committers.stop.set()
        for t in committers.threads:
            t.join(30)
    committers.check(group.log(leader))
    for replica in (n for n in group.procs if n != leader):  # warm maps, from their own logs (the killed ones too)
        wait_until(lambda replica=replica: committers.caught_up(group.log(replica)),
                   f"replica {replica} to answer every acknowledged offset", timeout_s=30)
    with sqlite3.connect(tmp_path / "metadata.db") as db:
        assert db.execute("select count(*) from consumer_offsets").fetchone() == (0,)


def test_a_group_imports_an_earlier_versions_sql_offsets_once_through_its_leader(group, tmp_path):
    group.start_all()
    leader, _ = group.wait_leader()
    stub = group.log(leader)
    stub.CreateTopic(pb.CreateTopicRequest(name="ha", queue_count=QUEUES), timeout=10)
    wait_until(lambda: len(group.state(leader).in_sync) == 3, "all three nodes in sync", timeout_s=30)
    group.append(leader, "ha", [b"m"] * 20)
    group.stop()
    meta = MetadataStore(f"sqlite:///{tmp_path / 'metadata.db'}", SystemClock())
    meta.commit_offsets([("old", "ha", 0, 4), ("old", "ha", 1, 5)])  # what an earlier version's CommitOffset wrote
    meta.close()
    group.start_all()
    leader, _ = group.wait_leader()
    # No check that nothing was imported yet: pop's replay on the new leader asks its offsets as soon as it
    # leads, and that first offsets call may run the import before wait_leader returns. Which node
    # imported (the leader alone, once) is what the end of the test checks.
    # The leader imports on its first offsets call, with SYNC replication: until its replicas are in sync
    # the call is UNAVAILABLE (retriable), never an answer without the imported rows.
    wait_until(lambda: _answers(group.log(leader), [4, 5]), "the leader to import and answer", timeout_s=30)
    for node_id in group.procs:  # the import is a record of the log: every node answers it
        wait_until(lambda node_id=node_id: _answers(group.log(node_id), [4, 5]), f"{node_id} to hold the import")
    imported = [n for n, p in group.procs.items() if any('"offsets.migrated"' in line for line in p.lines)]
    assert imported == [leader]


def _answers(stub, expected: list[int]) -> bool:
    try:
        return [stub.QueryOffset(pb.QueryOffsetRequest(group="old", topic="ha", queue_id=q), timeout=10).offset
                for q in range(QUEUES)] == expected
    except grpc.RpcError:
        return False
