"""CommitLogClient leaves a leader that stopped answering (issue 34, item 4): stand-in servers on 127.0.0.1, one
that never answers a write (a SIGSTOP'd leader as its clients see it: the connection open, no answer) and one
that says, through Replication.GetReplicationState, that it leads (or that it does not). A write is given
up within a few leader_probe_s once another node leads, raising Unavailable, and the next calls go to that
node; with no other leader the write keeps its call until its own deadline (a slow leader is not left)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import grpc
import pytest
from mqstore import model
from mqstore.errors import Unavailable

from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, replication_pb2

PROBE_S = 0.2


class Servers:
    def __init__(self, other_role: str):
        self.released = threading.Event()
        self.frozen = self._server({
            "mqstore.v1.CommitLog": {"Append": grpc.unary_unary_rpc_method_handler(
                self._never, request_deserializer=commitlog_pb2.AppendRequest.FromString,
                response_serializer=commitlog_pb2.AppendResponse.SerializeToString)},
            "mqstore.v1.CommitLogInternal": {"AppendBatchesStream": grpc.stream_stream_rpc_method_handler(
                self._never_stream, request_deserializer=commitlog_pb2.InternalAppendBatchesRequest.FromString,
                response_serializer=commitlog_pb2.InternalAppendBatchesResponse.SerializeToString)}})
        state = replication_pb2.ReplicationState(node_id="n2", role=other_role, epoch=2)
        answer = grpc.unary_unary_rpc_method_handler(
            lambda request, context: state, request_deserializer=replication_pb2.GetReplicationStateRequest.FromString,
            response_serializer=replication_pb2.ReplicationState.SerializeToString)
        self.other = self._server({"mqstore.v1.Replication": {"GetReplicationState": answer}})

    def _server(self, services):
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
        server.add_generic_rpc_handlers(tuple(grpc.method_handlers_generic_handler(name, methods)
                                              for name, methods in services.items()))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        return server, f"127.0.0.1:{port}"

    def _never(self, request, context):
        ended = threading.Event()
        context.add_callback(ended.set)
        ended.wait(30)  # no answer until the caller gives up
        context.abort(grpc.StatusCode.CANCELLED, "gone")

    def _never_stream(self, request_iterator, context):
        for _ in request_iterator:
            pass  # read, never answered
        return iter(())

    @property
    def addresses(self) -> str:
        return f"{self.frozen[1]},{self.other[1]}"

    def stop(self) -> None:
        for server, _ in (self.frozen, self.other):
            server.stop(0)


@pytest.fixture
def leader_elsewhere():
    servers = Servers("LEADER")
    yield servers
    servers.stop()


def test_a_write_on_a_silent_leader_is_given_up_once_another_node_leads(leader_elsewhere):
    client = CommitLogClient(leader_elsewhere.addresses, rpc_timeout_s=20, leader_probe_s=PROBE_S)
    try:
        began = time.monotonic()
        with pytest.raises(Unavailable, match="leads now: the write may or may not have been written"):
            client.append("t", [model.MessageIn(body=b"x")])
        assert time.monotonic() - began < 10 * PROBE_S  # not its 20 s deadline
        assert client.address == leader_elsewhere.other[1]  # the next calls go to the new leader
    finally:
        client.close()


def test_an_append_batches_request_on_a_silent_leader_is_given_up_once_another_node_leads(leader_elsewhere):
    client = CommitLogClient(leader_elsewhere.addresses, rpc_timeout_s=20, leader_probe_s=PROBE_S)

    async def run():
        try:
            await client.internal_append_batches_async([("t", [model.MessageIn(body=b"x")])], writer="w",
                                                       token="secret")
        finally:
            await client.close_async()
    try:
        began = time.monotonic()
        with pytest.raises(Unavailable, match="leads now"):
            asyncio.run(run())
        assert time.monotonic() - began < 10 * PROBE_S
        assert client.address == leader_elsewhere.other[1]
    finally:
        client.close()


def test_a_slow_leader_keeps_the_write_when_no_other_node_leads():
    servers = Servers("REPLICA")
    client = CommitLogClient(servers.addresses, rpc_timeout_s=1.5, leader_probe_s=PROBE_S)
    try:
        began = time.monotonic()
        with pytest.raises(Exception) as err:
            client.append("t", [model.MessageIn(body=b"x")])
        assert "leads now" not in str(err.value)
        assert time.monotonic() - began >= 1.4  # waited its own deadline: no node claimed the leadership
        assert client.address == servers.frozen[1]
    finally:
        client.close()
        servers.stop()


def test_an_append_batches_request_on_a_silent_lone_node_is_given_up_at_its_deadline_and_the_stream_renewed():
    """One address (no leader to probe for): unanswered within rpc_timeout_s, the request is Unavailable
    (may or may not have been written), its stream is torn down, and the next request opens another."""
    servers = Servers("REPLICA")
    client = CommitLogClient(servers.frozen[1], rpc_timeout_s=0.5, leader_probe_s=PROBE_S)

    async def run():
        try:
            for _ in range(2):
                began = time.monotonic()
                with pytest.raises(Unavailable, match="did not answer AppendBatches within 0.5 s"):
                    await client.internal_append_batches_async([("t", [model.MessageIn(body=b"x")])], writer="w",
                                                               token="secret")
                assert 0.4 < time.monotonic() - began < 10
            assert len(client._aio._batch_streams) == 1  # the second request's stream, the first one's ended
        finally:
            await client.close_async()
    try:
        asyncio.run(run())
    finally:
        client.close()
        servers.stop()
