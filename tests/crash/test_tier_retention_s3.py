"""The tier's own retention (mqstore.tier.uploader, step 3) with a real commit log process and a real S3-compatible
server (moto's server mode on 127.0.0.1): segments uploaded to s3:// expire by ``--retention-ms``; the first life
dies (os._exit, as kill -9) at ``tier.retention.after_delete``, after an expired segment's object was deleted and
before its DELETED record: the ledger still holds that upload FINISHED while its object is gone. The restarted
process finishes it: every expired upload ends DELETED, the bucket holds exactly the objects of the FINISHED
uploads (none below the log's start, none missing), the ledger has no conflict, and the topic's queue starts past
what expired. One module, two process lives, ~64 KiB segments: a few seconds."""

from __future__ import annotations

import grpc
import pytest

from mqstore.config import StoreConfig
from mqstore.format.tier_upload import DELETED, FINISHED
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.s3 import moto_s3
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.integration]

SEGMENT = 64 * 1024
PREFIX = "node1"
RETENTION_MS = 1500


def _spawn(data_dir, s3, bucket, failpoints=""):
    env = {**s3.env(), **({"MQSTORE_FAILPOINTS": failpoints} if failpoints else {})}
    return commitlog(data_dir, "--tier-url", f"s3://{bucket}/{PREFIX}", "--tier-upload-interval-ms", "100",
                     "--segment-size-bytes", str(SEGMENT), "--warm-ahead-bytes", "0", "--retention-ms",
                     str(RETENTION_MS), "--clean-interval-ms", "100", env=env)


def _ledger(data_dir) -> tuple[Ledger, int]:
    """The ledger as the log holds it (read in this process, the node stopped or dead), and the log's start."""
    # the processes' consume queue files (tests/support/processes.py: MQSTORE_CQ_ENTRIES_PER_FILE)
    store = build_store(StoreConfig(data_dir=data_dir, segment_size_bytes=SEGMENT, cq_entries_per_file=50_000))
    store.start()
    try:
        ledger = Ledger.of_store(store)
        ledger.catch_up()
        return ledger, store.log_min()
    finally:
        store.stop()


def _keys(s3, bucket) -> set[str]:
    """The object keys under the node's prefix (listed with boto3 only: the node deletes meanwhile)."""
    listed = s3.client.list_objects_v2(Bucket=bucket, Prefix=PREFIX + "/", MaxKeys=1000)
    return {item["Key"].removeprefix(PREFIX + "/") for item in listed.get("Contents", [])}


def test_expired_objects_are_deleted_and_recorded_and_a_kill_between_the_two_is_finished_after_restart(tmp_path):
    data_dir = tmp_path / "node"
    with moto_s3() as s3:
        bucket = s3.bucket()
        node = _spawn(data_dir, s3, bucket, "tier.retention.after_delete=exit").started()
        try:
            channel = grpc.insecure_channel(node.address)
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
            for batch in range(24):  # 24 x 16 KB: six segments of 64 KiB
                if node.process.poll() is not None:
                    break  # the first expiry came while appending (a loaded machine)
                try:
                    stub.Append(pb.AppendRequest(topic="t", messages=[
                        common_pb2.MessageInput(body=bytes([batch]) * 4000) for _ in range(4)]), timeout=10)
                except grpc.RpcError:
                    break  # it died at the failpoint
            channel.close()
            assert node.wait_exit(60) == 137, node.stderr()  # retention deleted an object, then the process died
        finally:
            node.stop()

        ledger, _ = _ledger(data_dir)
        finished, _ = ledger.snapshot()
        left = _keys(s3, bucket)
        cut = [upload for upload in finished.values() if upload.key not in left]
        assert len(cut) == 1, (finished, left)  # FINISHED in the ledger, its object deleted: DELETED not recorded
        assert not ledger.deleted().get(cut[0].segment_base)

        with _spawn(data_dir, s3, bucket).started() as again:
            channel = grpc.insecure_channel(again.address)
            stub = commitlog_pb2_grpc.CommitLogStub(channel)

            def settled():
                status = stub.GetTierStatus(pb.GetTierStatusRequest(segments=True), timeout=30)
                keys = _keys(s3, bucket)
                tiered = {r.key for r in status.segments if r.tiered}
                return (status.expired_segments >= 1 and status.pending_uploads == 0 and keys == tiered
                        and all(r.base >= status.local_min for r in status.segments if r.tiered) and status)
            status = wait_until(settled, "the expired objects deleted and recorded, the rest kept", 60)
            assert status.expired_bytes >= SEGMENT
            with pytest.raises(grpc.RpcError) as below:  # the queue starts past what expired, as expired local data
                stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=1), timeout=30)
            assert below.value.code() == grpc.StatusCode.OUT_OF_RANGE, below.value
            channel.close()
            assert again.stop() == 0

    ledger, log_min = _ledger(data_dir)
    finished, pending = ledger.snapshot()
    states = ledger.states()
    assert states[cut[0].upload_id] == DELETED and cut[0].segment_base in ledger.deleted()  # finished after restart
    assert not pending and ledger.conflicts == 0
    assert all(base >= log_min for base in finished) and all(states[u.upload_id] == FINISHED for u in finished.values())
    assert all(base + upload.segment_size <= log_min for base, upload in ledger.deleted().items())
    assert left - {cut[0].key} <= {u.key for u in finished.values()} | {u.key for u in ledger.deleted().values()}
