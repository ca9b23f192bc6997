"""CommitLogInternal (the token-protected way into system topics and COMMIT records), the Tail filter by
transaction type and the batch GetMessages, through real gRPC on 127.0.0.1 (port 0) and real files."""

from __future__ import annotations

import asyncio
import dataclasses
import gc

import grpc
import pytest

from commitlog_service.main import serving
from mqstore.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from mqstore.format import record
from mqstore.model import MessageIn
from mqstore.txn.records import HALF_TOPIC, OP_TOPIC
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from tests.integration.test_commitlog_grpc import create, decode_frame, make_config

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"


@pytest.fixture
def served(tmp_path):
    config = dataclasses.replace(make_config(tmp_path / "data"), internal_token=TOKEN)
    with serving(config) as (_, port):
        client = CommitLogClient(f"127.0.0.1:{port}", rpc_timeout_s=10)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield client, commitlog_pb2_grpc.CommitLogStub(channel), commitlog_pb2_grpc.CommitLogInternalStub(channel)
        finally:
            channel.close()
            client.close()


def run_aio(main):
    """``asyncio.run(main())``, then the grpc.aio objects it left are collected at once: collected later,
    their finalizers could run inside pytest's assertion rewriting (an ast.parse at the session's end),
    which CPython 3.11.7 fails with "AST constructor recursion depth mismatch"."""
    try:
        return asyncio.run(main())
    finally:
        gc.collect()


def half(body: bytes = b"half") -> MessageIn:
    return MessageIn(body, properties={"REAL_TOPIC": "orders", "REAL_QID": "0", "TRAN_MSG": "true"})


def commit_of(phys: int) -> MessageIn:
    return MessageIn(b"real", queue_id=0, sys_flag=record.SYSFLAG_TX_COMMIT, prepared_transaction_offset=phys,
                     born_host=b"\x0a\x00\x00\x07", born_port=4242)


def test_no_wrong_or_missing_token_is_permission_denied(served, tmp_path):
    client, _, internal = served
    with pytest.raises(PermissionDenied, match="does not match"):
        client.internal_append(HALF_TOPIC, [half()], writer="txn", token="wrong")
    request = pb.InternalAppendRequest(topic=HALF_TOPIC, writer="txn",
                                       messages=[pb.InternalMessage(message=common_pb2.MessageInput(body=b"x"))])
    with pytest.raises(grpc.RpcError) as info:
        internal.Append(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "no mqstore-internal-token" in info.value.details()
    with serving(make_config(tmp_path / "other")) as (_, port):  # no token configured: refuses everything
        other = CommitLogClient(f"127.0.0.1:{port}")
        try:
            with pytest.raises(PermissionDenied, match="no internal token configured"):
                other.internal_append(HALF_TOPIC, [half()], writer="txn", token="")
        finally:
            other.close()
    assert client.queue_info(HALF_TOPIC, 0).max_offset == 0  # nothing written by the refused calls


def test_owner_writes_its_topics_and_commit_records_carry_flag_offset_and_born_host(served):
    client, stub, _ = served
    create(stub, "orders")
    (h,) = client.internal_append(HALF_TOPIC, [half()], writer="txn", token=TOKEN)
    assert h.queue_offset == 0  # NOT_TYPE: a queue offset in the half topic
    (c,) = client.internal_append("orders", [commit_of(h.physical_offset)], writer="txn", token=TOKEN)
    stored = client.get_messages_batch([c.physical_offset])[0].message.record
    assert stored.sys_flag & record.SYSFLAG_TX_MASK == record.SYSFLAG_TX_COMMIT
    assert stored.prepared_transaction_offset == h.physical_offset
    assert (stored.born_host, stored.born_port) == (b"\x0a\x00\x00\x07", 4242)
    assert client.queue_info("orders", 0).max_offset == 1  # visible to consumers with a queue offset


def test_reconsume_times_go_through_the_internal_way_only(served):
    client, stub, internal = served
    create(stub, "orders")
    (c,) = client.internal_append("orders", [dataclasses.replace(commit_of(0), reconsume_times=3)], writer="txn",
                                  token=TOKEN)
    assert client.get_messages_batch([c.physical_offset])[0].message.record.reconsume_times == 3
    bad = pb.InternalAppendRequest(topic=HALF_TOPIC, writer="txn", messages=[pb.InternalMessage(
        message=common_pb2.MessageInput(body=b"x"), reconsume_times=-1)])
    with pytest.raises(grpc.RpcError) as info:
        internal.Append(bad, timeout=10, metadata=(("mqstore-internal-token", TOKEN),))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reconsume_times" in info.value.details()
    (plain,) = client.append("orders", [MessageIn(b"public")])  # the public Append has no such field: 0
    assert client.get_messages_batch([plain.physical_offset])[0].message.record.reconsume_times == 0


def test_refusals_name_the_rule(served):
    client, stub, _ = served
    create(stub, "orders")
    create(stub, "kv", kind=common_pb2.TOPIC_KIND_COMPACTION)
    with pytest.raises(FailedPrecondition, match="system topic"):
        client.append(HALF_TOPIC, [MessageIn(b"x")])  # the public door stays shut
    with pytest.raises(FailedPrecondition, match="Transaction service"):
        client.internal_append(HALF_TOPIC, [half()], writer="schedule", token=TOKEN)
    with pytest.raises(InvalidArgument, match="writer 'nobody'"):
        client.internal_append(HALF_TOPIC, [half()], writer="nobody", token=TOKEN)
    with pytest.raises(InvalidArgument, match="only COMMIT records"):
        client.internal_append("orders", [MessageIn(b"plain")], writer="txn", token=TOKEN)
    with pytest.raises(InvalidArgument, match="COMPACTION"):
        client.internal_append("kv", [dataclasses.replace(commit_of(0), keys=("k",))], writer="txn", token=TOKEN)
    with pytest.raises(InvalidArgument, match="NOT_TYPE"):
        client.internal_append(OP_TOPIC, [commit_of(0)], writer="txn", token=TOKEN)
    with pytest.raises(FailedPrecondition, match="only its own system topics"):
        client.internal_append("orders", [commit_of(0)], writer="schedule", token=TOKEN)
    for topic in ("orders", "kv", HALF_TOPIC, OP_TOPIC):
        assert client.queue_info(topic, 0).max_offset == 0  # nothing partial written


def test_append_batches_gives_each_batch_its_own_outcome_all_or_nothing(served):
    """CommitLogInternal.AppendBatches through the client's grpc.aio call: a refused batch fails alone
    with the error Append would have given it, whole (its good messages are not written either), and
    the batches after it are appended."""
    client, stub, _ = served
    create(stub, "orders")
    port = client.address.rsplit(":", 1)[1]

    async def run():
        aio = CommitLogClient(f"127.0.0.1:{port}", rpc_timeout_s=10)
        try:
            return await aio.internal_append_batches_async([
                (HALF_TOPIC, [half(b"h1"), half(b"h2")]),
                ("orders", [commit_of(0), MessageIn(b"plain")]),   # one bad message: the whole batch refused
                ("nowhere", [commit_of(0)]),
                ("orders", [commit_of(7)]),
            ], writer="txn", token=TOKEN)
        finally:
            await aio.close_async()

    halves, mixed, missing, commit = run_aio(run)
    assert [r.queue_offset for r in halves] == [0, 1]
    assert isinstance(mixed, InvalidArgument) and "only COMMIT records" in str(mixed)
    assert isinstance(missing, NotFound) and "nowhere" in str(missing)
    assert len(commit) == 1 and commit[0].queue_offset == 0  # the mixed batch wrote nothing before it
    stored = client.get_messages_batch([commit[0].physical_offset])[0].message.record
    assert stored.prepared_transaction_offset == 7
    assert client.queue_info(HALF_TOPIC, 0).max_offset == 2 and client.queue_info("orders", 0).max_offset == 1


def test_close_async_leaves_no_task_of_the_batch_stream_pending(served):
    """close_async ends each AppendBatches stream in order: the call cancelled, its reader task cancelled
    and awaited, the call's end awaited; so the loop that stops after it (a service's) destroys no pending
    task ("Task was destroyed but it is pending!": issue 38, item 3)."""
    client, stub, _ = served
    create(stub, "orders")

    async def run():
        aio = CommitLogClient(client.address, rpc_timeout_s=10)
        for n in range(3):
            await aio.internal_append_batches_async([(HALF_TOPIC, [half(b"h%d" % n)])], writer="txn", token=TOKEN)
        await aio.close_async()
        return [repr(task) for task in asyncio.all_tasks() if task is not asyncio.current_task()]

    assert run_aio(run) == []


def test_append_batches_falls_back_to_one_append_per_batch_on_an_older_commit_log():
    """A rolling upgrade: the Transaction service is newer than the commit log, which answers
    AppendBatches UNIMPLEMENTED (it did nothing). The client then sends one Append per batch, with the
    same per-batch outcomes, and does not ask again."""
    calls = []

    class OlderLog(commitlog_pb2_grpc.CommitLogInternalServicer):
        async def AppendBatchesStream(self, requests, context):  # what grpc answers for a method it does not know
            calls.append(("AppendBatchesStream", 0))
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            yield  # an async generator, as a stream handler is

        async def Append(self, request, context):
            calls.append((request.topic, len(request.messages)))
            if request.topic == "nowhere":
                await context.abort(grpc.StatusCode.NOT_FOUND, "topic nowhere does not exist")
            return pb.AppendResponse(results=[pb.AppendResult(queue_offset=i) for i in range(len(request.messages))])

    async def run():
        server = grpc.aio.server()
        commitlog_pb2_grpc.add_CommitLogInternalServicer_to_server(OlderLog(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = CommitLogClient(f"127.0.0.1:{port}", rpc_timeout_s=10)
        try:
            first = await client.internal_append_batches_async(
                [("a", [half(), half()]), ("nowhere", [half()]), ("b", [half()])], writer="txn", token=TOKEN)
            second = await client.internal_append_batches_async([("c", [half()])], writer="txn", token=TOKEN)
            return first, second
        finally:
            await client.close_async()
            await server.stop(0)

    (a, missing, b), (c,) = run_aio(run)
    assert [r.queue_offset for r in a] == [0, 1] and len(b) == 1 and len(c) == 1
    assert isinstance(missing, NotFound) and "nowhere" in str(missing)
    assert calls == [("AppendBatchesStream", 0), ("a", 2), ("nowhere", 1), ("b", 1), ("c", 1)]  # asked once


def test_append_batches_stream_answers_in_order_and_a_request_refused_whole_ends_it(served):
    client, stub, internal = served
    create(stub, "orders")

    def request(writer="txn", body=b"x"):
        return pb.InternalAppendBatchesRequest(writer=writer, batches=[pb.InternalAppendBatch(
            topic=HALF_TOPIC, messages=[pb.InternalMessage(message=common_pb2.MessageInput(body=body))])])

    answers = internal.AppendBatchesStream(iter([request(body=b"1"), request(body=b"2"), request(writer=""),
                                                 request(body=b"never")]),
                                           timeout=10, metadata=(("mqstore-internal-token", TOKEN),))
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for answer in answers:
            got.append(answer.results[0].appended.results[0].queue_offset)
    assert got == [0, 1]  # each request answered in order
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "writer" in info.value.details()
    assert client.queue_info(HALF_TOPIC, 0).max_offset == 2  # the request after the refused one: not processed
    with pytest.raises(grpc.RpcError) as info:  # the token is checked when the stream opens
        list(internal.AppendBatchesStream(iter([request()]), timeout=10))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_batch_stream_follows_the_leader_a_replica_names():
    """NotLeader ends a replica's stream before its request was processed: the client sends the request
    to the leader it names, on a stream of its own, and keeps using that one."""
    calls = []

    class Replica(commitlog_pb2_grpc.CommitLogInternalServicer):
        def __init__(self, leader):
            self.leader = leader

        async def AppendBatchesStream(self, requests, context):
            async for _ in requests:
                calls.append("replica")
                context.set_trailing_metadata((("mqstore-error", "NotLeader"), ("mqstore-leader", self.leader)))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a replica: writes go to the leader")
            yield  # an async generator, as a stream handler is

    class Leader(commitlog_pb2_grpc.CommitLogInternalServicer):
        async def AppendBatchesStream(self, requests, context):
            async for request in requests:
                calls.append("leader")
                yield pb.InternalAppendBatchesResponse(results=[pb.AppendBatchResult(appended=pb.AppendResponse(
                    results=[pb.AppendResult(queue_offset=len(calls))]))] * len(request.batches))

    async def run():
        servers, ports = [], []
        for make in (Leader, None):
            server = grpc.aio.server()
            port = server.add_insecure_port("127.0.0.1:0")
            commitlog_pb2_grpc.add_CommitLogInternalServicer_to_server(
                make() if make else Replica(f"127.0.0.1:{ports[0]}"), server)
            await server.start()
            servers.append(server)
            ports.append(port)
        client = CommitLogClient(f"127.0.0.1:{ports[1]}", rpc_timeout_s=10)
        try:
            first = await client.internal_append_batches_async([("a", [half()])], writer="txn", token=TOKEN)
            second = await client.internal_append_batches_async([("b", [half()])], writer="txn", token=TOKEN)
            return first, second, client.address, ports[0]
        finally:
            await client.close_async()
            for server in servers:
                await server.stop(0)

    ([first], [second], address, leader_port) = run_aio(run)
    assert calls == ["replica", "leader", "leader"] and address == f"127.0.0.1:{leader_port}"
    assert (first[0].queue_offset, second[0].queue_offset) == (2, 3)


def test_append_batches_refuses_a_bad_call_whole(served):
    client, stub, internal = served
    create(stub, "orders")
    token = (("mqstore-internal-token", TOKEN),)

    def batch(topic=HALF_TOPIC, count=1):
        return pb.InternalAppendBatch(topic=topic, messages=[
            pb.InternalMessage(message=common_pb2.MessageInput(body=b"x"))] * count)

    cases = [
        (pb.InternalAppendBatchesRequest(writer="txn", batches=[batch()]), (), grpc.StatusCode.PERMISSION_DENIED,
         "no mqstore-internal-token"),
        (pb.InternalAppendBatchesRequest(batches=[batch()]), token, grpc.StatusCode.INVALID_ARGUMENT, "writer"),
        (pb.InternalAppendBatchesRequest(writer="txn"), token, grpc.StatusCode.INVALID_ARGUMENT,
         "batches: 0 given; send 1..100"),
        (pb.InternalAppendBatchesRequest(writer="txn", batches=[batch()] * 101), token,
         grpc.StatusCode.INVALID_ARGUMENT, "batches: 101 given"),
        (pb.InternalAppendBatchesRequest(writer="txn", batches=[batch(count=1000)] * 10 + [batch()]), token,
         grpc.StatusCode.INVALID_ARGUMENT, "10001 messages in all; send at most 10000"),
    ]
    for request, metadata, code, text in cases:
        with pytest.raises(grpc.RpcError) as info:
            internal.AppendBatches(request, timeout=30, metadata=metadata)
        assert (info.value.code(), text in info.value.details()) == (code, True), info.value.details()
    assert client.queue_info(HALF_TOPIC, 0).max_offset == 0  # nothing written by the refused calls
    answer = internal.AppendBatches(pb.InternalAppendBatchesRequest(writer="txn", batches=[
        batch(count=2), pb.InternalAppendBatch(topic="orders")]), timeout=10, metadata=token)
    assert [r.WhichOneof("outcome") for r in answer.results] == ["appended", "error"]  # the service goes on
    assert answer.results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert answer.results[1].error.error == "InvalidArgument" and answer.results[1].error.message


def test_tail_filters_by_topic_or_transaction_type(served):
    client, stub, _ = served
    create(stub, "orders")
    create(stub, "other")
    client.append("other", [MessageIn(b"plain-1")])
    (h,) = client.internal_append(HALF_TOPIC, [half()], writer="txn", token=TOKEN)
    client.append("orders", [MessageIn(b"plain-2")])
    (c,) = client.internal_append("orders", [commit_of(h.physical_offset)], writer="txn", token=TOKEN)
    client.append("other", [MessageIn(b"plain-3")])
    end = client.store_info().visible_physical_offset
    stream = client.tail(0, max_frame_bytes=1 << 20, heartbeat_ms=50, topics=[HALF_TOPIC],
                         tx_types=[record.SYSFLAG_TX_COMMIT])
    seen = []
    for frame in stream:
        seen += decode_frame(frame.records)
        if frame.next_physical_offset >= end:
            break
    stream.cancel()
    assert [r.physical_offset for r in seen] == [h.physical_offset, c.physical_offset]
    request = pb.TailRequest(start=pb.TAIL_START_EARLIEST, transaction_types=[7])
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Tail(request, timeout=10)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "TransactionType" in info.value.details()


def test_get_messages_answers_each_offset_in_order(served):
    client, stub, _ = served
    create(stub, "orders")
    results = client.append("orders", [MessageIn(b"a"), MessageIn(b"b")])
    end = client.store_info().max_physical_offset
    lookups = client.get_messages_batch([results[1].physical_offset, 1, results[0].physical_offset, end + 10_000])
    assert [lk.message.record.body if lk.message else None for lk in lookups] == [b"b", None, b"a", None]
    assert lookups[1].missing and lookups[3].missing and not lookups[1].damaged
    with pytest.raises(grpc.RpcError) as info:
        stub.GetMessages(pb.GetMessagesRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "1 to 1000" in info.value.details()
