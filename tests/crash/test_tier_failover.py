"""A failover between an upload's two phases, with real processes: a replication group of three commit logs on
etcd with --tier-url on a real S3-compatible server (moto). The leader dies (os._exit, as kill -9) after it put
a segment's object and before its FINISHED record; the new leader, which holds the STARTED record (SYNC
replicated), verifies the object and finishes it, then uploads the rest: one FINISHED upload per sealed
segment, each byte-identical to the new leader's segment, and no other object (mqstore.tier.uploader)."""

from __future__ import annotations

import grpc
import pytest

from mqstore.config import StoreConfig
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from tests.support.ha import Group, etcd_or_skip
from tests.support.processes import commitlog
from tests.support.s3 import moto_s3
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]

PREFIX = "group"
SEGMENT = 64 * 1024


class TierGroup(Group):
    """Group's nodes with the tier on and an environment of their own (the S3 settings; failpoints per node)."""

    def __init__(self, root, etcd_endpoint, s3, bucket):
        super().__init__(root, etcd_endpoint, 3, "--tier-url", f"s3://{bucket}/{PREFIX}", "--tier-upload-interval-ms",
                         "100", "--min-insync-replicas", "2", "--default-replication", "SYNC")
        self.s3 = s3

    def start(self, node_id, failpoints: str = ""):
        env = {**self.s3.env(), **({"MQSTORE_FAILPOINTS": failpoints} if failpoints else {})}
        proc = commitlog(self.root / node_id, "--node-id", node_id, "--etcd-endpoints", self.etcd_endpoint,
                         # topics in SQL (--shared-sql-metadata): the check at the end opens the leader's store
                         "--metadata-url", f"sqlite:///{self.root / 'metadata.db'}", "--shared-sql-metadata",
                         "--segment-size-bytes", "64KiB",
                         "--preallocate-segments", "false", *self.extra, env=env).started()
        self.procs[node_id] = proc
        self.channels[node_id] = grpc.insecure_channel(proc.address)
        return proc


def test_a_new_leader_finishes_the_upload_its_predecessor_left_between_the_phases(tmp_path):
    etcd = etcd_or_skip()
    with moto_s3() as s3:
        bucket = s3.bucket()
        group = TierGroup(tmp_path, etcd.endpoint, s3, bucket)
        try:
            group.start("n1", failpoints="tier.upload.after_put=exit")
            assert group.wait_leader()[0] == "n1"
            group.start("n2")
            group.start("n3")
            wait_until(lambda: len(group.state("n1").in_sync) == 3, "n2 and n3 in sync", 60)
            group.log("n1").CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
            for batch in range(100):  # until the first upload kills n1 (bounded: ~1.6 MB)
                if group.procs["n1"].process.poll() is not None:
                    break
                try:
                    group.append("n1", "t", [bytes([batch]) * 4000] * 4)
                except grpc.RpcError:  # n1 died under the append: what this test waits for
                    break
            assert group.procs["n1"].wait_exit(60) == 137
            assert len(s3.objects(bucket)) == 1  # put, not FINISHED
            group.procs["n1"].stop()
            group.procs["n1"] = None
            leader, _ = group.wait_leader(timeout_s=60)
            for batch in range(40):  # more segments, sealed under the new leader
                group.append(leader, "t", [bytes([batch]) * 4000] * 4)
            # Sealed for sure: all but the last two files (the last full one is sealed once the flush passes its end)
            sealed = {int(p.name): p for p in sorted((tmp_path / leader / "commitlog").iterdir())[:-2]}

            def uploaded():
                by_base = {}
                for key in s3.objects(bucket):
                    by_base.setdefault(int(key.split("/")[2]), []).append(key)
                return all(len(by_base.get(base, ())) == 1 for base in sealed)
            wait_until(uploaded, "every sealed segment uploaded once", 60)
        finally:
            group.stop()
            etcd.stop()
        store = build_store(StoreConfig(data_dir=tmp_path / leader, segment_size_bytes=SEGMENT,
                                         metadata_url=f"sqlite:///{tmp_path / 'metadata.db'}"))
        store.start()
        try:
            ledger = Ledger.of_store(store)
            ledger.catch_up()
            finished, pending = ledger.snapshot()
        finally:
            store.stop()
        assert not pending and ledger.conflicts == 0 and set(sealed) <= set(finished)
        objects = s3.objects(bucket)
        assert sorted(objects) == sorted(f"{PREFIX}/{u.key}" for u in finished.values())  # no orphan
        for base, upload in finished.items():
            assert objects[f"{PREFIX}/{upload.key}"] == (tmp_path / leader / "commitlog" / f"{base:020d}").read_bytes()
