"""Compact(engine=SPARK) through the Compactor's gRPC API: the job runs as the child process the service
starts (its own SparkSession on local[2]), its manifest is checked and its output installed; the
consumer from offset 0 then sees exactly the latest value per key."""

from __future__ import annotations

import grpc
import pytest

from compactor_service.main import serving
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from tests.integration.test_compactor_service import (  # noqa: F401 - commitlog_port is a fixture
    applied, commitlog_port, compactor_config, read_all, write_kv)
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_spark_round_through_the_api(tmp_path, commitlog_port):  # noqa: F811 - the fixture
    config = compactor_config(tmp_path / "compactor", commitlog_port, spark_master="local[2]")
    writes = [(f"user-{i % 20}", f"v{i}".encode() * 10) for i in range(300)] + [("user-5", b"")]
    with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        log, compactor = commitlog_pb2_grpc.CommitLogStub(log_channel), compactor_pb2_grpc.CompactorStub(channel)
        write_kv(log, "kv", writes, queues=1)
        wait_until(lambda: applied(compactor, "kv", len(writes), 1), "the compactor to apply every record")
        response = compactor.Compact(pb.CompactRequest(topic="kv", engine=pb.COMPACTION_ENGINE_SPARK,
                                                       seal_active=True), timeout=600)
        assert [(r.engine, r.result) for r in response.rounds] == [("spark", "ok")]
        assert response.rounds[0].records_removed == len(writes) - 20
        latest = {key: value for key, value in writes}
        assert {key: body for _, key, body in read_all(compactor, "kv", 0)} == latest
