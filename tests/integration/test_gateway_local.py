"""Local mode of the gateway (the v2 MessagingService served by the commit log process, --gateway-port), in
this process over real gRPC on 127.0.0.1: what differs from Cluster mode only in where it runs. A replica's
gateway accepts no send (the store's NotLeader, answered PRECONDITION_FAILED as the Cluster gateway answers
it; receives too), and the gateway's RPCs are counted in the commit log's metrics. The protocol, the clients,
the crashes and the born host are checked in both modes by the other test_gateway* suites."""

from __future__ import annotations

import dataclasses
import pathlib

import grpc
import pytest

from commitlog_service.main import CommitLogConfig, serving
from mqstore.config import StoreConfig
from mqstore.replication.config import ReplicationConfig
from mqstore_launcher.node import LocalMode
from gateway_service.composition import LocalGatewayConfig
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.support.gateway import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
CLIENT = (("x-mq-client-id", "local-mode-test"),)
TIMEOUT_S = 10


def node_config(root: pathlib.Path, node_id: str, replica_of: str = "", gateway: bool = False) -> CommitLogConfig:
    store = StoreConfig(data_dir=root / node_id, segment_size_bytes=64 * 1024, preallocate_segments=False,
                        metadata_url=f"sqlite:///{root / 'metadata.db'}")
    local = LocalGatewayConfig(port=0, txn_address=f"127.0.0.1:{free_port()}") if gateway else None
    return CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=0.5), hosted=(LocalMode(gateway=local),),
                           replication=ReplicationConfig(node_id=node_id, replica_of=replica_of,
                                                         replication_heartbeat_ms=50))


def send(stub, message_id: str, topic: str = "t") -> s.SendMessageResponse:
    m = d.Message(topic=d.Resource(name=topic), body=b"local")
    m.system_properties.message_id = message_id
    m.system_properties.message_type = d.NORMAL
    return stub.SendMessage(s.SendMessageRequest(messages=[m]), metadata=CLIENT, timeout=TIMEOUT_S)


def receive_request(group: str, topic: str) -> s.ReceiveMessageRequest:
    request = s.ReceiveMessageRequest(group=d.Resource(name=group), message_queue=d.MessageQueue(
        topic=d.Resource(name=topic)), filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=8)
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(1_000)
    return request


def log_end(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return commitlog_pb2_grpc.CommitLogStub(channel).GetStoreInfo(
            pb.GetStoreInfoRequest(), timeout=TIMEOUT_S).max_physical_offset


def test_a_replicas_local_gateway_refuses_sends_and_its_leaders_takes_them(tmp_path):
    with serving(node_config(tmp_path, "a", gateway=True)) as (leader, leader_port):
        with grpc.insecure_channel(f"127.0.0.1:{leader_port}") as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2),
                                                                  timeout=TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{leader.extra_ports['gateway']}") as channel:
            assert send(service_pb2_grpc.MessagingServiceStub(channel), "01LOCAL0000000000000000000000001") \
                .status.code == d.OK
        replica_config = node_config(tmp_path, "b", replica_of=f"127.0.0.1:{leader_port}", gateway=True)
        with serving(replica_config) as (replica, replica_port):
            wait_until(lambda: log_end(replica_port) == log_end(leader_port), "the replica to catch up")
            before = log_end(leader_port)
            with grpc.insecure_channel(f"127.0.0.1:{replica.extra_ports['gateway']}") as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)
                reply = send(stub, "01LOCAL0000000000000000000000002")
                received = list(stub.ReceiveMessage(receive_request("g", "t"), metadata=CLIENT, timeout=TIMEOUT_S))
            # pop consumption runs on the leader only: a receive is refused in the status as well
            assert [r.status.code for r in received] == [d.PRECONDITION_FAILED], received
            assert reply.entries[0].status.code == d.PRECONDITION_FAILED, reply
            assert reply.status.code == d.PRECONDITION_FAILED
            assert "leader" in reply.entries[0].status.message.lower()
            assert log_end(leader_port) == before and log_end(replica_port) == before  # nothing written anywhere


def test_the_gateways_rpcs_are_counted_in_the_commit_logs_metrics(tmp_path):
    config = dataclasses.replace(node_config(tmp_path, "a", gateway=True), replication=ReplicationConfig())
    with serving(config) as (server, _):
        with grpc.insecure_channel(f"127.0.0.1:{server.extra_ports['gateway']}") as channel:
            reply = send(service_pb2_grpc.MessagingServiceStub(channel), "01LOCAL0000000000000000000000003",
                         topic="missing")
        assert reply.status.code == d.TOPIC_NOT_FOUND
        handled = next(f for f in server.registry.collect() if f.name == "grpc_server_handled_total")
        counted = {labels: value for labels, value in handled.samples}
        key = ("unary", "apache.rocketmq.v2.MessagingService", "SendMessage", "OK")
        assert counted.get(key) == 1, counted
