"""gRPC health means ready, for every service: from the first moment a server answers health, SERVING
implies its main RPC is answered (not UNAVAILABLE "starting" or "recovering"). The Transaction service
is NOT_SERVING until its follower has read the log up to the end it saw at start (it answered SERVING
while Prepare still said "recovering" before); the others are ready once started (the commit log
recovers before it serves; the index and the compactor answer from their own files, the commit log away
or not). Each server here is in this process, on 127.0.0.1 port 0."""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from compactor_service.main import serving as compactor_serving
from index_service.main import serving as index_serving
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2, compactor_pb2_grpc, index_pb2, index_pb2_grpc, txn_pb2
from tests.integration.test_compactor_service import compactor_config
from tests.integration.test_index_service import index_config
from tests.integration.txn_testing import RPC_TIMEOUT_S, commitlog, prepare, txn_service
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S).status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_txn_is_serving_only_once_prepare_is_answered(tmp_path):
    log_port = _free_port()  # the commit log is not running yet: the service cannot recover
    with txn_service(tmp_path / "txn", log_port) as (server, stub):
        assert health(server.port) == NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            prepare(stub, "orders", [b"x"])
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "recovering" in info.value.details()
        with commitlog(tmp_path / "log", port=log_port) as (_, log_stub):
            log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_TIMEOUT_S)
            wait_until(lambda: health(server.port) == SERVING, "the txn service to turn SERVING")
            assert prepare(stub, "orders", [b"x"]).transaction_id  # answered the moment health says so
            assert not stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_TIMEOUT_S).recovering


def test_commitlog_index_and_compactor_answer_when_they_first_say_serving(tmp_path):
    with commitlog(tmp_path / "log") as (log_port, log_stub):
        assert health(log_port) == SERVING
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        with index_serving(index_config(tmp_path / "index", log_port)) as (_, port):
            assert health(port) == SERVING
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                answer = index_pb2_grpc.IndexStub(channel).QueryByKey(
                    index_pb2.QueryByKeyRequest(topic="t", key="nothing"), timeout=RPC_TIMEOUT_S)
            assert list(answer.locators) == []
        with compactor_serving(compactor_config(tmp_path / "compactor", log_port)) as (_, port):
            assert health(port) == SERVING
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                compactor_pb2_grpc.CompactorStub(channel).Stats(compactor_pb2.CompactorStatsRequest(),
                                                                timeout=RPC_TIMEOUT_S)
