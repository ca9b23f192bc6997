"""A message sent through the gateway stores the producer's address as its born host (the gateway appends
through CommitLogInternal as writer "gateway" when it has the internal token), and the gateway's own
address without the token (the public Append: what the README says then); in Local mode (the gateway
served by the commit log process) the producer's address, with no token at all. Real gRPC on 127.0.0.1, port 0,
a commit log, a Transaction service and a gateway in this process."""

from __future__ import annotations

import contextlib
import os
import pathlib

import grpc
import pytest

from gateway_service.main import GatewayServiceConfig, serving as gateway_serving
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.server import ServerConfig
from tests.integration.txn_testing import TOKEN, commitlog, commitlog_with_gateway, txn_service
from tests.support.gateway import free_port

pytestmark = pytest.mark.integration
CLIENT = (("x-mq-client-id", "born-host-test"),)
TIMEOUT_S = 10
TCP_ESTABLISHED = "01"


def local_ports_to(port: int) -> set[int]:
    """The local ports of this process's established TCP connections to ``port`` (grpc connects to
    127.0.0.1 from a dual-stack socket: such a connection is listed in /proc/net/tcp6)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    found = set()
    tables = [pathlib.Path(f"/proc/net/{name}").read_text().splitlines()[1:] for name in ("tcp", "tcp6")]
    for line in tables[0] + tables[1]:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        if state == TCP_ESTABLISHED and inode in mine and int(remote.split(":")[1], 16) == port:
            found.add(int(local.split(":")[1], 16))
    return found


@contextlib.contextmanager
def rig(tmp: pathlib.Path, internal_token: str):
    with commitlog(tmp / "log") as (log_port, log_stub):
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=2), timeout=TIMEOUT_S)
        with txn_service(tmp / "txn", log_port) as (txn_server, _):
            config = GatewayServiceConfig(server=ServerConfig(port=0), commitlog_address=f"127.0.0.1:{log_port}",
                                          txn_address=f"127.0.0.1:{txn_server.port}", internal_token=internal_token)
            with gateway_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                yield port, service_pb2_grpc.MessagingServiceStub(channel), log_stub


def send_and_fetch(stub, log_stub, message_id: str):
    """Send one message through the gateway; the StoredMessage the commit log keeps of it."""
    message = d.Message(topic=d.Resource(name="t"), body=b"from the producer")
    message.system_properties.message_id = message_id
    message.system_properties.message_type = d.NORMAL
    reply = stub.SendMessage(s.SendMessageRequest(messages=[message]), metadata=CLIENT, timeout=TIMEOUT_S)
    assert reply.status.code == d.OK, reply.status
    queue_offset = reply.entries[0].offset
    for queue_id in range(2):
        pulled = log_stub.Pull(cpb.PullRequest(topic="t", queue_id=queue_id, offset=queue_offset, max_messages=1),
                               timeout=TIMEOUT_S).messages
        if pulled and pulled[0].uniq_key == message_id:
            return pulled[0]
    raise AssertionError(f"message {message_id} not found at queue offset {queue_offset}")


def test_the_born_host_is_the_producers_address(tmp_path):
    with rig(tmp_path, TOKEN) as (port, stub, log_stub):
        stored = send_and_fetch(stub, log_stub, "01BORNHOST000000000000000000000001")
        producer_ports = local_ports_to(port)   # this test's connection to the gateway
        assert producer_ports, "no connection of this process to the gateway found"
        host, _, born_port = stored.born_host.rpartition(":")
        assert host == "127.0.0.1" and int(born_port) in producer_ports, (stored.born_host, producer_ports)


def test_without_the_internal_token_the_born_host_is_the_gateways(tmp_path):
    with rig(tmp_path, "") as (port, stub, log_stub):
        stored = send_and_fetch(stub, log_stub, "01BORNHOST000000000000000000000002")
        host, _, born_port = stored.born_host.rpartition(":")
        # the address the gateway reached the commit log from: neither the producer's nor unknown
        assert host == "127.0.0.1" and int(born_port) not in local_ports_to(port) | {0}


def test_in_local_mode_the_born_host_is_the_producers_address_without_a_token(tmp_path):
    txn_port = free_port()
    with commitlog_with_gateway(tmp_path / "log", txn_port, internal_token="") as (_, _, port, log_stub):
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=2), timeout=TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            stored = send_and_fetch(stub, log_stub, "01BORNHOST000000000000000000000003")
            producer_ports = local_ports_to(port)
    assert producer_ports, "no connection of this process to the gateway found"
    host, _, born_port = stored.born_host.rpartition(":")
    assert host == "127.0.0.1" and int(born_port) in producer_ports, (stored.born_host, producer_ports)
