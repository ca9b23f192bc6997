"""kill -9 of the compactor during a real Spark round: the job's process group (its Python, Spark's
JVM, the workers) outlives the compactor; the next start kills it and removes the round's request,
job file and staging/ before it opens the compaction logs."""

from __future__ import annotations

import json
import os
import signal

import grpc
import pytest

from compactor_service import spark_runner
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, compactor_pb2 as pb, compactor_pb2_grpc
from tests.integration.test_compactor_service import (  # noqa: F401 - commitlog_port is a fixture
    applied, commitlog_port, write_kv)
from tests.support.processes import ServiceProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.crash, pytest.mark.integration]


def _compactor(data_dir, log_port: int) -> ServiceProcess:
    return ServiceProcess("compactor_service.main", [
        "--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", "--commitlog", f"127.0.0.1:{log_port}",
        "--spark-master", "local[1]", "--segment-size-bytes", "8192", "--round-interval-ms", "3600000",
        "--checkpoint-interval-ms", "50", "--heartbeat-ms", "50",
        "--min-compaction-lag-ms", "3600000"]).started()  # no background round: only the one asked for


def test_a_spark_job_left_by_a_killed_compactor_is_killed_at_the_next_start(tmp_path, commitlog_port):  # noqa: F811
    data_dir = tmp_path / "compactor"
    topic_dir = data_dir / "logs" / "kv"
    job_file = topic_dir / f".0{spark_runner.JOB_SUFFIX}"
    pgid = None
    compactor = _compactor(data_dir, commitlog_port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
                grpc.insecure_channel(compactor.address) as channel:
            stub = compactor_pb2_grpc.CompactorStub(channel)
            writes = [(f"k{i % 7}", b"v" * 50) for i in range(200)]
            write_kv(commitlog_pb2_grpc.CommitLogStub(log_channel), "kv", writes, queues=1)
            wait_until(lambda: applied(stub, "kv", 200, 1), "the compactor to apply every record")
            call = stub.Compact.future(pb.CompactRequest(topic="kv", engine=pb.COMPACTION_ENGINE_SPARK,
                                                         seal_active=True), timeout=600)
            identity = wait_until(lambda: job_file.exists() and json.loads(job_file.read_text() or "{}"),
                                  "the Spark job to start", timeout_s=120)
            pgid = identity["pgid"]
            compactor.kill9()
            compactor.stop()  # (closes its pipes)
            assert spark_runner._group_members(pgid, identity["start_ticks"]), "the job died with the compactor"
            assert job_file.exists() and (topic_dir / f".0{spark_runner.REQUEST_SUFFIX}").exists()
            with pytest.raises(grpc.RpcError):
                call.result()
        compactor = _compactor(data_dir, commitlog_port)
        assert not spark_runner._group_members(pgid, identity["start_ticks"])
        assert sorted(p.name for p in topic_dir.iterdir()) == ["0", "topic.incarnation"]
        assert not (topic_dir / "0" / "staging").exists()
        assert "compaction.spark_job_killed" in compactor.stderr()
    finally:
        compactor.stop()
        if pgid is not None and spark_runner._group_members(pgid, 0):
            os.killpg(pgid, signal.SIGKILL)
