"""CommitLogClient.internal_append_batches (the gateway's sends in Cluster mode): requests of one
AppendBatchesStream kept open to the commit log, each batch with its own outcome; a refused stream (a wrong
token) or one that stops answering (a request unanswered within rpc_timeout_s) fails only the requests it
owed, and the next call opens a new stream; callers take turns on it; a commit log without the stream
(UNIMPLEMENTED) gets one Append per batch.
One real commit log for the module, stand-in servers for what it would never do."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading

import grpc
import pytest
from mqstore.errors import NotFound, PermissionDenied, Unavailable
from mqstore.model import MessageIn

from commitlog_service.main import serving
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.txn_testing import TOKEN

pytestmark = pytest.mark.integration
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def log_address(tmp_path_factory):
    config = dataclasses.replace(make_config(tmp_path_factory.mktemp("log")), internal_token=TOKEN)
    with serving(config) as (_, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
                commitlog_pb2.CreateTopicRequest(name="t", queue_count=1), timeout=TIMEOUT_S)
        yield f"127.0.0.1:{port}"


def test_batches_have_their_own_outcomes_on_one_stream(log_address):
    client = CommitLogClient(log_address, rpc_timeout_s=TIMEOUT_S, transparent_retries=False)
    try:
        first = client.internal_append_batches([("t", [MessageIn(b"a"), MessageIn(b"b")]), ("nope", [MessageIn(b"c")]),
                                                ("t", [MessageIn(b"d")])], writer="gateway", token=TOKEN)
        assert [r.queue_offset for r in first[0]] == [0, 1] and [r.queue_offset for r in first[2]] == [2]
        assert isinstance(first[1], NotFound)
        stream = client._sync_streams[log_address]
        again = client.internal_append_batches([("t", [MessageIn(b"e")])], writer="gateway", token=TOKEN)
        assert again[0][0].queue_offset == 3 and client._sync_streams[log_address] is stream  # the same stream
    finally:
        client.close()


def test_concurrent_callers_take_turns_on_the_stream_and_each_gets_its_own_answer(log_address):
    client = CommitLogClient(log_address, rpc_timeout_s=TIMEOUT_S, transparent_retries=False)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda i: client.internal_append_batches(
                [("t", [MessageIn(f"c{i}".encode())])], writer="gateway", token=TOKEN)[0][0], range(40)))
        assert len({r.queue_offset for r in outcomes}) == 40
        assert len({id(s) for s in client._sync_streams.values()}) == 1
    finally:
        client.close()


def test_a_wrong_token_is_permission_denied_and_the_next_call_opens_a_new_stream(log_address):
    client = CommitLogClient(log_address, rpc_timeout_s=TIMEOUT_S, transparent_retries=False)
    try:
        with pytest.raises(PermissionDenied):
            client.internal_append_batches([("t", [MessageIn(b"x")])], writer="gateway", token="wrong")
        assert client.internal_append_batches([("t", [MessageIn(b"y")])], writer="gateway", token=TOKEN)[0]
    finally:
        client.close()


class StandIn:
    """A commit log that reads AppendBatchesStream requests and never answers them (``silent``), or serves
    only the unary CommitLogInternal.Append (an older commit log)."""

    def __init__(self, silent: bool):
        self.appends = 0
        self.ended = threading.Event()
        methods = {"Append": grpc.unary_unary_rpc_method_handler(
            self._append, request_deserializer=commitlog_pb2.InternalAppendRequest.FromString,
            response_serializer=commitlog_pb2.AppendResponse.SerializeToString)}
        if silent:
            methods = {"AppendBatchesStream": grpc.stream_stream_rpc_method_handler(
                self._silent, request_deserializer=commitlog_pb2.InternalAppendBatchesRequest.FromString,
                response_serializer=commitlog_pb2.InternalAppendBatchesResponse.SerializeToString)}
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("mqstore.v1.CommitLogInternal",
                                                                                  methods),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _append(self, request, context):
        self.appends += 1
        return commitlog_pb2.AppendResponse(results=[commitlog_pb2.AppendResult(queue_offset=self.appends)
                                                     for _ in request.messages])

    def _silent(self, request_iterator, context):
        context.add_callback(self.ended.set)
        for _ in request_iterator:
            pass
        return iter(())


def test_a_request_unanswered_within_the_timeout_is_unavailable_and_ends_the_stream():
    stand_in = StandIn(silent=True)
    client = CommitLogClient(stand_in.address, rpc_timeout_s=0.5, transparent_retries=False)
    try:
        with pytest.raises(Unavailable, match="may or may not have been written"):
            client.internal_append_batches([("t", [MessageIn(b"x")])], writer="gateway", token=TOKEN)
        assert stand_in.ended.wait(TIMEOUT_S)  # torn down: the server saw the call end
    finally:
        client.close()
        stand_in.server.stop(0)


def test_a_commit_log_without_the_stream_gets_one_append_per_batch():
    stand_in = StandIn(silent=False)
    client = CommitLogClient(stand_in.address, rpc_timeout_s=TIMEOUT_S, transparent_retries=False)
    try:
        outcomes = client.internal_append_batches([("t", [MessageIn(b"x")]), ("u", [MessageIn(b"y")])],
                                                  writer="gateway", token=TOKEN)
        assert [o[0].queue_offset for o in outcomes] == [1, 2] and stand_in.appends == 2
        assert client.internal_append_batches([("t", [MessageIn(b"z")])], writer="gateway", token=TOKEN)
        assert stand_in.appends == 3
    finally:
        client.close()
        stand_in.server.stop(0)
