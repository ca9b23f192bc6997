"""Every RPC of every service, through real gRPC servers on 127.0.0.1 (port 0) in this process (CommitLog
with its internal door, Compactor, Index, Transaction):

- each numeric field given a negative value, or one past its range: INVALID_ARGUMENT naming the field
  and the valid range (mqstore.limits), or the RPC's own answer where the proto gives one (OUT_OF_RANGE
  past a queue's end, NOT_FOUND for a queue the topic does not have); a limit past its maximum is
  clamped (the call succeeds);
- each string field given a 40 KB value (a key, a topic, an id, a token, a cursor, a property...): the
  status the RPC documents, with a short message that shows at most the start of the value (gRPC's
  trailers hold about 8 KiB: a message repeating the value came back as RESOURCE_EXHAUSTED instead).

One set of servers serves the whole module; each case runs against servers that have seen the earlier
ones, so they must keep serving.
"""

from __future__ import annotations

import contextlib
import dataclasses

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from compactor_service.main import serving as compactor_serving
from mqstore.message_keys import key_queue
from index_service.main import serving as index_serving
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as cpb, compactor_pb2_grpc, index_pb2, index_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import access_pb2, access_pb2_grpc, consumer_pb2, consumer_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc
from tests.integration.test_compactor_service import applied, compactor_config
from tests.integration.test_index_service import index_config
from tests.integration.txn_testing import TOKEN, commitlog, txn_service, wait_ready
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
T = 10
Code = grpc.StatusCode
HUGE = "h" * 40_000
# A 40 KB sharding key that routes to the other queue of a 2-queue COMPACTION topic than the key HUGE[:20_000].
ELSEWHERE = next(k for k in (HUGE, HUGE + "x", HUGE + "y") if key_queue(k, 2) != key_queue(HUGE[:20_000], 2))
BIG_INT = 2**31 - 1


@dataclasses.dataclass
class Stubs:
    log: commitlog_pb2_grpc.CommitLogStub
    internal: commitlog_pb2_grpc.CommitLogInternalStub
    compactor: compactor_pb2_grpc.CompactorStub
    index: index_pb2_grpc.IndexStub
    txn: txn_pb2_grpc.TransactionStub
    consumer: consumer_pb2_grpc.ConsumerStub
    access: access_pb2_grpc.AccessStub


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    root = tmp_path_factory.mktemp("every-rpc")
    with contextlib.ExitStack() as stack:
        port, log = stack.enter_context(commitlog(root / "log"))
        log_channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{port}"))
        _, compactor_port = stack.enter_context(compactor_serving(compactor_config(root / "compactor", port)))
        _, index_port = stack.enter_context(index_serving(index_config(root / "index", port)))
        _, txn = stack.enter_context(txn_service(root / "txn", port))
        compactor_channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{compactor_port}"))
        index_channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{index_port}"))
        s = Stubs(log, commitlog_pb2_grpc.CommitLogInternalStub(log_channel),
                  compactor_pb2_grpc.CompactorStub(compactor_channel), index_pb2_grpc.IndexStub(index_channel), txn,
                  consumer_pb2_grpc.ConsumerStub(log_channel), access_pb2_grpc.AccessStub(log_channel))
        log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=T)
        log.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"x", keys=["k"])] * 4),
                   timeout=T)
        log.CreateTopic(pb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        log.Append(pb.AppendRequest(topic="kv", messages=[common_pb2.MessageInput(body=b"v", keys=["a"])]), timeout=T)
        log.CreateTopic(pb.CreateTopicRequest(name="kv2", queue_count=2, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        wait_until(lambda: applied(s.compactor, "kv", 1, 1), "the compactor to apply the record")
        wait_ready(txn)
        yield s


def M(**fields) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=b"x", **fields)


def commit(message: common_pb2.MessageInput, **fields) -> pb.InternalMessage:
    """What the Transaction service may write into a user topic (a COMMIT record), but for ``fields``."""
    return pb.InternalMessage(message=message, transaction_type=pb.TRANSACTION_TYPE_COMMIT, **fields)


def R(**fields) -> consumer_pb2.ReceiveRequest:
    """A Receive of topic t for group cg that would succeed (an empty answer at once) but for ``fields``."""
    return consumer_pb2.ReceiveRequest(**{"group": "cg", "topic": "t", "invisible_duration_ms": 30_000, **fields})


class FrameFailed(grpc.RpcError):
    """A Transact frame or an AppendBatches batch answered with an error (a FrameError or BatchError): the
    status its unary call would have ended with."""

    def __init__(self, error):
        super().__init__(error.message)
        self._error = error

    def code(self) -> grpc.StatusCode:
        return next(c for c in grpc.StatusCode if c.value[0] == self._error.code)

    def details(self) -> str:
        return self._error.message


def _transact(stub, request: txn_pb2.TransactRequest) -> txn_pb2.TransactResponse:
    """One frame on a Transact stream; its answer, or FrameFailed when the answer is an error."""
    [answer] = list(stub.Transact(iter([request]), timeout=T))
    assert answer.request_id == request.request_id, answer
    if answer.HasField("error"):
        raise FrameFailed(answer.error)
    return answer


def _append_batches(stub, request: pb.InternalAppendBatchesRequest, metadata):
    """AppendBatches; FrameFailed with the first batch's error, if any."""
    answer = stub.AppendBatches(request, timeout=T, metadata=metadata)
    assert len(answer.results) == len(request.batches), answer
    for result in answer.results:
        if result.HasField("error"):
            raise FrameFailed(result.error)
    return answer


class _StreamOfOne:
    """AppendBatchesStream with one request, called as AppendBatches."""

    def __init__(self, stub):
        self._stub = stub

    def AppendBatches(self, request, timeout, metadata):
        [answer] = list(self._stub.AppendBatchesStream(iter([request]), timeout=timeout, metadata=metadata))
        return answer


def _call(stubs: Stubs, service: str, method: str, request):
    stub = getattr(stubs, service)
    metadata = (("mqstore-internal-token", TOKEN),) if service == "internal" else None
    if method == "AppendStream":
        response = stub.AppendStream(iter([request]), timeout=T)
    elif method == "Transact":
        response = _transact(stub, request)
    elif method == "AppendBatches":
        response = _append_batches(stub, request, metadata)
    elif method == "AppendBatchesStream":
        response = _append_batches(_StreamOfOne(stub), request, metadata)
    elif method == "CheckBack":  # the stream's first message says whose producer it is
        hello = txn_pb2.CheckBackMessage(hello=txn_pb2.CheckBackHello(producer_group="pg"))
        response = stub.CheckBack(iter([hello, request]), timeout=T)
    else:
        response = getattr(stub, method)(request, timeout=T, metadata=metadata)
    return list(response) if method in ("Tail", "Scan", "CheckBack") else response


# AppendBatches, and AppendBatchesStream with the same requests (NUMERIC below)
BATCHES_NUMERIC = [
    ("batches flag -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(writer="txn", batches=[
        pb.InternalAppendBatch(topic="t", messages=[commit(M(flag=-1))])]), None, ""),
    ("batches queue_id -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(writer="txn", batches=[
        pb.InternalAppendBatch(topic="t", messages=[commit(M())]),
        pb.InternalAppendBatch(topic="t", messages=[commit(M(queue_id=-1))])]),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("batches born -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(writer="txn", batches=[
        pb.InternalAppendBatch(topic="t", messages=[commit(M(born_timestamp_ms=-1))])]),
     Code.INVALID_ARGUMENT, "born_timestamp_ms"),
    ("batches reconsume_times -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(
        writer="txn", batches=[pb.InternalAppendBatch(topic="t", messages=[commit(M(), reconsume_times=-1)])]),
     Code.INVALID_ARGUMENT, "reconsume_times -1 is outside [0, "),
    ("batches delay_ms -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(writer="txn", batches=[
        pb.InternalAppendBatch(topic="t", messages=[commit(M(delay_ms=-1))])]), Code.INVALID_ARGUMENT, "delay_ms"),
    ("batches deliver_at_ms -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(writer="txn", batches=[
        pb.InternalAppendBatch(topic="t", messages=[commit(M(deliver_at_ms=-1))])]), Code.INVALID_ARGUMENT,
     "deliver_at_ms"),
    ("batches prepared offset -1", "internal", "AppendBatches", pb.InternalAppendBatchesRequest(
        writer="txn", batches=[pb.InternalAppendBatch(topic="t", messages=[pb.InternalMessage(
            message=M(), transaction_type=pb.TRANSACTION_TYPE_COMMIT, prepared_transaction_offset=-1)])]),
     Code.INVALID_ARGUMENT, "prepared_transaction_offset"),
]

# (id, service, method, request, expected code or None for OK, a fragment the message must hold)
NUMERIC = [
    ("create queue_count -1", "log", "CreateTopic", pb.CreateTopicRequest(name="n1", queue_count=-1),
     Code.INVALID_ARGUMENT, "between 1 and 1024"),
    ("create queue_count 2000", "log", "CreateTopic", pb.CreateTopicRequest(name="n2", queue_count=2000),
     Code.INVALID_ARGUMENT, "between 1 and 1024"),
    ("create retention -1", "log", "CreateTopic", pb.CreateTopicRequest(name="n3", retention_ms=-1),
     Code.INVALID_ARGUMENT, "retention_ms"),
    ("update queue_count -1", "log", "UpdateTopic", pb.UpdateTopicRequest(name="t", queue_count=-1),
     Code.INVALID_ARGUMENT, "between 1 and 1024"),
    ("update retention -1", "log", "UpdateTopic", pb.UpdateTopicRequest(name="t", retention_ms=-1),
     Code.INVALID_ARGUMENT, "retention_ms"),
    ("append queue_id -1", "log", "Append", pb.AppendRequest(topic="t", messages=[M(queue_id=-1)]),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("append queue_id 99", "log", "Append", pb.AppendRequest(topic="t", messages=[M(queue_id=99)]),
     Code.INVALID_ARGUMENT, "[0, 2)"),
    ("append born -1", "log", "Append", pb.AppendRequest(topic="t", messages=[M(born_timestamp_ms=-1)]),
     Code.INVALID_ARGUMENT, "born_timestamp_ms"),
    ("append delay_ms -1", "log", "Append", pb.AppendRequest(topic="t", messages=[M(delay_ms=-1)]),
     Code.INVALID_ARGUMENT, "delay_ms is -1"),
    ("append deliver_at_ms -1", "log", "Append", pb.AppendRequest(topic="t", messages=[M(deliver_at_ms=-1)]),
     Code.INVALID_ARGUMENT, "deliver_at_ms is -1"),
    ("append stream delay_ms -1", "log", "AppendStream", pb.AppendRequest(topic="t", messages=[M(delay_ms=-1)]),
     Code.INVALID_ARGUMENT, "delay_ms is -1"),
    ("append stream deliver_at_ms -1", "log", "AppendStream", pb.AppendRequest(
        topic="t", messages=[M(deliver_at_ms=-1)]), Code.INVALID_ARGUMENT, "deliver_at_ms is -1"),
    ("internal delay_ms -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[commit(M(delay_ms=-1))]), Code.INVALID_ARGUMENT, "delay_ms"),
    ("internal deliver_at_ms -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[commit(M(deliver_at_ms=-1))]), Code.INVALID_ARGUMENT, "deliver_at_ms"),
    ("prepare delay_ms -1", "txn", "Prepare", txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                                      messages=[M(delay_ms=-1)]),
     Code.INVALID_ARGUMENT, "delay_ms is -1"),
    ("prepare deliver_at_ms -1", "txn", "Prepare", txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                                           messages=[M(deliver_at_ms=-1)]),
     Code.INVALID_ARGUMENT, "deliver_at_ms is -1"),
    ("transact prepare delay_ms -1", "txn", "Transact", txn_pb2.TransactRequest(
        request_id=11, prepare=txn_pb2.PrepareRequest(topic="t", producer_group="pg", messages=[M(delay_ms=-1)])),
     Code.INVALID_ARGUMENT, "delay_ms is -1"),
    ("transact prepare deliver_at_ms -1", "txn", "Transact", txn_pb2.TransactRequest(
        request_id=12, prepare=txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                      messages=[M(deliver_at_ms=-1)])),
     Code.INVALID_ARGUMENT, "deliver_at_ms is -1"),
    ("pull max_messages -1", "log", "Pull", pb.PullRequest(topic="t", max_messages=-1), Code.INVALID_ARGUMENT,
     "max_messages is -1; give 0 (the default, 32) or 1 to 10000"),
    ("pull max_bytes -1", "log", "Pull", pb.PullRequest(topic="t", max_bytes=-1), Code.INVALID_ARGUMENT,
     "max_bytes is -1"),
    ("pull long_poll_ms -1", "log", "Pull", pb.PullRequest(topic="t", long_poll_ms=-1), Code.INVALID_ARGUMENT,
     "long_poll_ms is -1"),
    ("pull offset -1", "log", "Pull", pb.PullRequest(topic="t", offset=-1), Code.INVALID_ARGUMENT, "offset is -1"),
    ("pull queue_id -1", "log", "Pull", pb.PullRequest(topic="t", queue_id=-1), Code.INVALID_ARGUMENT,
     "queue_id is -1"),
    ("pull queue_id 99", "log", "Pull", pb.PullRequest(topic="t", queue_id=99), Code.NOT_FOUND, "queues 0..1"),
    ("pull offset past the end", "log", "Pull", pb.PullRequest(topic="t", offset=99), Code.OUT_OF_RANGE, "[0, 2]"),
    ("pull limits past their maximum", "log", "Pull", pb.PullRequest(topic="t", max_messages=BIG_INT,
                                                                    max_bytes=2**62, long_poll_ms=2**62), None, ""),
    ("get physical_offset -1", "log", "GetMessage", pb.GetMessageRequest(physical_offset=-1), Code.INVALID_ARGUMENT,
     "physical_offset is -1"),
    ("get physical_offset past the end", "log", "GetMessage", pb.GetMessageRequest(physical_offset=2**62),
     Code.OUT_OF_RANGE, "outside the log"),
    ("get many -1", "log", "GetMessages", pb.GetMessagesRequest(physical_offsets=[0, -1]), Code.INVALID_ARGUMENT,
     "physical_offsets[1] is -1"),
    ("get many 1001", "log", "GetMessages", pb.GetMessagesRequest(physical_offsets=[0] * 1001),
     Code.INVALID_ARGUMENT, "1 to 1000"),
    ("tail from -1", "log", "Tail", pb.TailRequest(from_physical_offset=-1), Code.INVALID_ARGUMENT,
     "from_physical_offset is -1"),
    ("tail max_frame_bytes -1", "log", "Tail", pb.TailRequest(start=pb.TAIL_START_LATEST, max_frame_bytes=-1),
     Code.INVALID_ARGUMENT, "max_frame_bytes is -1"),
    ("tail heartbeat_ms -1", "log", "Tail", pb.TailRequest(start=pb.TAIL_START_LATEST, heartbeat_ms=-1),
     Code.INVALID_ARGUMENT, "heartbeat_ms is -1; give 0 (the default, 1000) or 10 to 60000"),
    ("tail linger_ms -1", "log", "Tail", pb.TailRequest(start=pb.TAIL_START_LATEST, linger_ms=-1),
     Code.INVALID_ARGUMENT, "linger_ms is -1"),
    ("queue info queue_id -1", "log", "GetQueueInfo", pb.GetQueueInfoRequest(topic="t", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("queue info queue_id 99", "log", "GetQueueInfo", pb.GetQueueInfoRequest(topic="t", queue_id=99),
     Code.NOT_FOUND, "queue 99"),
    ("by time queue_id -1", "log", "GetOffsetByTime", pb.GetOffsetByTimeRequest(topic="t", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("by time timestamp -1", "log", "GetOffsetByTime", pb.GetOffsetByTimeRequest(topic="t", timestamp_ms=-1),
     Code.INVALID_ARGUMENT, "timestamp_ms is -1"),
    ("commit queue_id -1", "log", "CommitOffset", pb.CommitOffsetRequest(group="g", topic="t", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("commit offset -1", "log", "CommitOffset", pb.CommitOffsetRequest(group="g", topic="t", offset=-1),
     Code.INVALID_ARGUMENT, "offset is -1"),
    ("commit offset past the end", "log", "CommitOffset", pb.CommitOffsetRequest(group="g", topic="t", offset=99),
     Code.OUT_OF_RANGE, "[0, 2]"),
    ("query queue_id -1", "log", "QueryOffset", pb.QueryOffsetRequest(group="g", topic="t", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("internal prepared offset -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[pb.InternalMessage(message=M(), transaction_type=pb.TRANSACTION_TYPE_COMMIT,
                                                              prepared_transaction_offset=-1)]),
     Code.INVALID_ARGUMENT, "prepared_transaction_offset"),
    ("compacted pull queue_id -1", "compactor", "Pull", cpb.CompactedPullRequest(topic="kv", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("compacted pull offset -1", "compactor", "Pull", cpb.CompactedPullRequest(topic="kv", offset=-1),
     Code.INVALID_ARGUMENT, "offset is -1"),
    ("compacted pull max_messages -1", "compactor", "Pull", cpb.CompactedPullRequest(topic="kv", max_messages=-1),
     Code.INVALID_ARGUMENT, "max_messages is -1; give 0 (the default, 32) or 1 to 1000"),
    ("compacted pull max_bytes -1", "compactor", "Pull", cpb.CompactedPullRequest(topic="kv", max_bytes=-1),
     Code.INVALID_ARGUMENT, "max_bytes is -1"),
    ("compacted pull limits past their maximum", "compactor", "Pull",
     cpb.CompactedPullRequest(topic="kv", max_messages=BIG_INT, max_bytes=BIG_INT), None, ""),
    ("scan page_size -1", "compactor", "Scan", cpb.ScanRequest(topic="kv", page_size=-1), Code.INVALID_ARGUMENT,
     "page_size is -1; give 0 (the default, 500) or 1 to 1000"),
    ("scan page_size 1001", "compactor", "Scan", cpb.ScanRequest(topic="kv", page_size=1001),
     Code.INVALID_ARGUMENT, "page_size is 1001"),
    ("scan max_pages -1", "compactor", "Scan", cpb.ScanRequest(topic="kv", max_pages=-1), Code.INVALID_ARGUMENT,
     "max_pages is -1"),
    ("compact queue_id -1", "compactor", "Compact", cpb.CompactRequest(topic="kv", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("describe queue_id -1", "compactor", "DescribeQueue", cpb.DescribeQueueRequest(topic="kv", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("offsets queue_id -1", "compactor", "GetQueueOffsets", cpb.GetQueueOffsetsRequest(topic="kv", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("offsets timestamp -1", "compactor", "GetQueueOffsets", cpb.GetQueueOffsetsRequest(topic="kv", timestamp_ms=-1),
     Code.INVALID_ARGUMENT, "timestamp_ms is -1"),
    ("batch 1001 keys", "compactor", "BatchGetLatest", cpb.BatchGetLatestRequest(topic="kv", keys=["a"] * 1001),
     Code.INVALID_ARGUMENT, "1000"),
    ("query begin -1", "index", "QueryByKey", index_pb2.QueryByKeyRequest(topic="t", key="k", begin_ms=-1),
     Code.INVALID_ARGUMENT, "begin_ms"),
    ("query end -1", "index", "QueryByKey", index_pb2.QueryByKeyRequest(topic="t", key="k", end_ms=-1),
     Code.INVALID_ARGUMENT, "end_ms"),
    ("query max_num -1", "index", "QueryByKey", index_pb2.QueryByKeyRequest(topic="t", key="k", max_num=-1),
     Code.INVALID_ARGUMENT, "max_num is -1; give 0 (the default, 64) or 1 to 10000"),
    ("query max_num past its maximum", "index", "QueryByKey",
     index_pb2.QueryByKeyRequest(topic="t", key="k", max_num=BIG_INT), None, ""),
    ("by time queue_id -1 (index)", "index", "QueryByTime", index_pb2.QueryByTimeRequest(topic="t", queue_id=-1),
     Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("by time timestamp -1 (index)", "index", "QueryByTime", index_pb2.QueryByTimeRequest(topic="t", timestamp_ms=-1),
     Code.INVALID_ARGUMENT, "timestamp_ms is -1"),
    ("list open older_than -1", "txn", "ListOpen", txn_pb2.ListOpenRequest(older_than_ms=-1), Code.INVALID_ARGUMENT,
     "older_than_ms is -1"),
    ("list open limit -1", "txn", "ListOpen", txn_pb2.ListOpenRequest(limit=-1), Code.INVALID_ARGUMENT,
     "limit is -1; give 0 (the default, 100) or 1 to 10000"),
    ("list open limit past its maximum", "txn", "ListOpen", txn_pb2.ListOpenRequest(limit=BIG_INT), None, ""),
    ("prepare queue_id -1", "txn", "Prepare", txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                                      messages=[M(queue_id=-1)]),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("transact request_id -1 (any number, carried back)", "txn", "Transact", txn_pb2.TransactRequest(
        request_id=-1, prepare=txn_pb2.PrepareRequest(topic="t", producer_group="pg", messages=[M()])), None, ""),
    ("transact prepare queue_id -1", "txn", "Transact", txn_pb2.TransactRequest(
        request_id=1, prepare=txn_pb2.PrepareRequest(topic="t", producer_group="pg", messages=[M(queue_id=-1)])),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("transact prepare flag -1", "txn", "Transact", txn_pb2.TransactRequest(
        request_id=2, prepare=txn_pb2.PrepareRequest(topic="t", producer_group="pg", messages=[M(flag=-1)])),
     None, ""),
    ("transact prepare born -1", "txn", "Transact", txn_pb2.TransactRequest(
        request_id=3, prepare=txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                     messages=[M(born_timestamp_ms=-1)])),
     Code.INVALID_ARGUMENT, "born_timestamp_ms"),
    ("append flag -1 (opaque: any int32)", "log", "Append", pb.AppendRequest(topic="t", messages=[M(flag=-1)]),
     None, ""),
    ("append stream flag -1", "log", "AppendStream", pb.AppendRequest(topic="t", messages=[M(flag=-1)]), None, ""),
    ("internal flag -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[commit(M(flag=-1))]), None, ""),
    ("prepare flag -1", "txn", "Prepare", txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                                  messages=[M(flag=-1)]), None, ""),
    ("append stream queue_id -1", "log", "AppendStream", pb.AppendRequest(topic="t", messages=[M(queue_id=-1)]),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("append stream born -1", "log", "AppendStream", pb.AppendRequest(topic="t", messages=[M(born_timestamp_ms=-1)]),
     Code.INVALID_ARGUMENT, "born_timestamp_ms"),
    ("internal queue_id -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[commit(M(queue_id=-1))]),
     Code.INVALID_ARGUMENT, "queue_id"),
    ("internal born -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[commit(M(born_timestamp_ms=-1))]),
     Code.INVALID_ARGUMENT, "born_timestamp_ms"),
    ("internal reconsume_times -1", "internal", "Append", pb.InternalAppendRequest(
        topic="t", writer="txn", messages=[commit(M(), reconsume_times=-1)]),
     Code.INVALID_ARGUMENT, "reconsume_times -1 is outside [0, "),
    *BATCHES_NUMERIC,
    *[(f"stream {name}", service, "AppendBatchesStream", *rest) for name, service, _, *rest in BATCHES_NUMERIC],
    ("prepare born -1", "txn", "Prepare", txn_pb2.PrepareRequest(topic="t", producer_group="pg",
                                                                  messages=[M(born_timestamp_ms=-1)]),
     Code.INVALID_ARGUMENT, "born_timestamp_ms"),
    ("list audit limit -1", "txn", "ListAudit", txn_pb2.ListAuditRequest(limit=-1), Code.INVALID_ARGUMENT,
     "limit is -1; give 0 (the default, 100) or 1 to 1000"),
    ("list audit limit past its maximum", "txn", "ListAudit", txn_pb2.ListAuditRequest(limit=BIG_INT), None, ""),
    ("receive queue_id -1", "consumer", "Receive", R(queue_id=-1), Code.INVALID_ARGUMENT, "queue_id is -1"),
    ("receive queue_id 99", "consumer", "Receive", R(queue_id=99), Code.NOT_FOUND, "queues 0..1"),
    ("receive batch_size -1", "consumer", "Receive", R(batch_size=-1), Code.INVALID_ARGUMENT,
     "batch_size is -1; give 0 (the default, 32) or 1 to 1000"),
    ("receive batch_size 1001", "consumer", "Receive", R(batch_size=1001), Code.INVALID_ARGUMENT,
     "batch_size is 1001"),
    ("receive invisible -1", "consumer", "Receive", R(invisible_duration_ms=-1), Code.INVALID_ARGUMENT,
     "invisible_duration_ms is -1; give 100 to 43200000"),
    ("receive invisible past 12 h", "consumer", "Receive", R(invisible_duration_ms=2**40), Code.INVALID_ARGUMENT,
     "invisible_duration_ms is 1099511627776"),
    ("receive long_poll_ms -1", "consumer", "Receive", R(long_poll_ms=-1), Code.INVALID_ARGUMENT,
     "long_poll_ms is -1"),
    ("receive max_attempts -1", "consumer", "Receive", R(max_attempts=-1), Code.INVALID_ARGUMENT,
     "max_attempts is -1; give 0 (the default, 17) or 1 to 1000"),
    ("receive max_attempts 1001", "consumer", "Receive", R(max_attempts=1001), Code.INVALID_ARGUMENT,
     "max_attempts is 1001"),
    ("receive max_bytes -1", "consumer", "Receive", R(max_bytes=-1), Code.INVALID_ARGUMENT, "max_bytes is -1"),
    ("receive limits past their maximum", "consumer", "Receive", R(long_poll_ms=2**62, max_bytes=2**62), None, ""),
    ("change invisible -1", "consumer", "ChangeInvisibleDuration", consumer_pb2.ChangeInvisibleDurationRequest(
        group="cg", topic="t", receipt_handle="x", invisible_duration_ms=-1), Code.INVALID_ARGUMENT,
     "invisible_duration_ms is -1"),
    ("check back answer check_id -1", "txn", "CheckBack", txn_pb2.CheckBackMessage(
        answer=txn_pb2.CheckAnswer(check_id=-1, decision=txn_pb2.DECISION_COMMIT)),
     Code.INVALID_ARGUMENT, "check_id -1 was not sent on this stream"),
    ("delete rule id -1", "access", "DeleteRule", access_pb2.DeleteRuleRequest(id=-1), Code.INVALID_ARGUMENT,
     "id is -1"),
]


@pytest.mark.parametrize("service, method, request_, code, fragment", [c[1:] for c in NUMERIC],
                         ids=[c[0] for c in NUMERIC])
def test_every_numeric_field_out_of_its_range(stubs, service, method, request_, code, fragment):
    if code is None:
        _call(stubs, service, method, request_)
        return
    with pytest.raises(grpc.RpcError) as info:
        _call(stubs, service, method, request_)
    assert info.value.code() == code, info.value.details()
    assert fragment in info.value.details()


SERVICE_OF = {"log": "CommitLog", "internal": "CommitLogInternal", "compactor": "Compactor", "index": "Index",
              "txn": "Transaction", "consumer": "Consumer", "access": "Access"}
_NUMERIC_TYPES = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT32,
                  FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64,
                  FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def _numeric_fields(descriptor, prefix: str = "", seen: frozenset = frozenset()):
    """The dotted paths of every numeric field of a request type, nested messages included."""
    for field in descriptor.fields:
        if field.type in _NUMERIC_TYPES:
            yield prefix + field.name
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.full_name not in seen:
            yield from _numeric_fields(field.message_type, f"{prefix}{field.name}.",
                                       seen | {field.message_type.full_name})


def _negative_fields(message, prefix: str = ""):
    """The dotted paths of the numeric fields a request sets to a negative value."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                yield from _negative_fields(item, f"{prefix}{field.name}.")
            elif field.type in _NUMERIC_TYPES and item < 0:
                yield prefix + field.name


def test_the_table_gives_every_numeric_field_of_every_rpc_a_negative_value():
    """Every numeric field of every request of every mqstore.v1 service (from the protos' descriptors, so
    a field or an RPC added later fails this until the table has its case) is tried negative above."""
    tried = {(SERVICE_OF[service], method, path) for _, service, method, request, _, _ in NUMERIC
             for path in _negative_fields(request)}
    missing = []
    for module in (pb, cpb, index_pb2, txn_pb2, consumer_pb2, access_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                missing += [f"{service.name}.{method.name} {path}" for path in _numeric_fields(method.input_type)
                            if (service.name, method.name, path) not in tried]
    assert not missing, f"no negative case in NUMERIC for: {missing}"


HUGE_CASES = [
    ("latest of an unknown key", "compactor", "GetLatest", cpb.GetLatestRequest(topic="kv", key=HUGE), Code.NOT_FOUND),
    ("latest in an unknown topic", "compactor", "GetLatest", cpb.GetLatestRequest(topic=HUGE, key="a"),
     Code.NOT_FOUND),
    ("compacted pull of an unknown topic", "compactor", "Pull", cpb.CompactedPullRequest(topic=HUGE), Code.NOT_FOUND),
    ("scan cursor", "compactor", "Scan", cpb.ScanRequest(topic="kv", cursor=HUGE), Code.INVALID_ARGUMENT),
    ("scan of an unknown topic", "compactor", "Scan", cpb.ScanRequest(topic=HUGE), Code.NOT_FOUND),
    ("compact an unknown topic", "compactor", "Compact", cpb.CompactRequest(topic=HUGE), Code.NOT_FOUND),
    ("describe an unknown topic", "compactor", "DescribeQueue", cpb.DescribeQueueRequest(topic=HUGE), Code.NOT_FOUND),
    ("offsets of an unknown topic", "compactor", "GetQueueOffsets", cpb.GetQueueOffsetsRequest(topic=HUGE),
     Code.NOT_FOUND),
    ("msg id", "log", "GetMessage", pb.GetMessageRequest(msg_id=HUGE), Code.INVALID_ARGUMENT),
    ("retention hold name", "log", "Tail", pb.TailRequest(start=pb.TAIL_START_LATEST, hold_retention_as=HUGE),
     Code.INVALID_ARGUMENT),
    ("topic", "log", "Pull", pb.PullRequest(topic=HUGE), Code.INVALID_ARGUMENT),
    ("pull SQL92 filter", "log", "Pull", pb.PullRequest(topic="t", filter_type=common_pb2.FILTER_TYPE_SQL92,
                                                  filter_expression=HUGE), Code.INVALID_ARGUMENT),
    ("pull SQL92 property", "log", "Pull", pb.PullRequest(topic="t", filter_type=common_pb2.FILTER_TYPE_SQL92,
                                                    filter_expression=HUGE[:4000] + " >"), Code.INVALID_ARGUMENT),
    ("topic of a delete", "log", "DeleteTopic", pb.DeleteTopicRequest(name=HUGE), Code.INVALID_ARGUMENT),
    ("a key with a space", "log", "Append", pb.AppendRequest(topic="t", messages=[M(keys=[HUGE + " x"])]),
     Code.INVALID_ARGUMENT),
    ("keys and KEYS that differ", "log", "Append", pb.AppendRequest(
        topic="t", messages=[M(keys=["k"], properties={"KEYS": HUGE})]), Code.INVALID_ARGUMENT),
    ("tags and TAGS that differ", "log", "Append", pb.AppendRequest(
        topic="t", messages=[M(tags="a", properties={"TAGS": HUGE})]), Code.INVALID_ARGUMENT),
    ("a property name with \\x01", "log", "Append", pb.AppendRequest(
        topic="t", messages=[M(properties={HUGE[:30_000] + "\x01": "v"})]), Code.INVALID_ARGUMENT),
    ("a sharding key elsewhere", "log", "Append", pb.AppendRequest(
        topic="kv2", messages=[M(keys=[HUGE[:20_000]], sharding_key=ELSEWHERE)]), Code.INVALID_ARGUMENT),
    ("group", "log", "CommitOffset", pb.CommitOffsetRequest(group=HUGE, topic="t"), Code.INVALID_ARGUMENT),
    ("writer", "internal", "Append", pb.InternalAppendRequest(topic="t", writer=HUGE, messages=[
        pb.InternalMessage(message=M())]), Code.INVALID_ARGUMENT),
    ("uniq key", "index", "QueryByUniqKey", index_pb2.QueryByUniqKeyRequest(topic="t", uniq_key=HUGE),
     Code.NOT_FOUND),
    ("page token", "index", "QueryByKey", index_pb2.QueryByKeyRequest(topic="t", key="k", page_token=HUGE),
     Code.INVALID_ARGUMENT),
    ("transaction id of a prepare", "txn", "Prepare", txn_pb2.PrepareRequest(
        topic="t", producer_group="pg", transaction_id=HUGE, messages=[M()]), Code.INVALID_ARGUMENT),
    ("transaction id of a commit", "txn", "Commit", txn_pb2.EndRequest(transaction_id=HUGE), Code.NOT_FOUND),
    ("transaction id of a show", "txn", "Show", txn_pb2.ShowRequest(transaction_id=HUGE), Code.NOT_FOUND),
    ("transaction id of a force", "txn", "ForceResolve", txn_pb2.ForceResolveRequest(
        transaction_id=HUGE, decision=txn_pb2.DECISION_COMMIT, reason=HUGE, operator=HUGE), Code.NOT_FOUND),
    ("audit page token", "txn", "ListAudit", txn_pb2.ListAuditRequest(page_token=HUGE), Code.INVALID_ARGUMENT),
    ("receive group", "consumer", "Receive", R(group=HUGE), Code.INVALID_ARGUMENT),
    ("receive topic", "consumer", "Receive", R(topic=HUGE), Code.INVALID_ARGUMENT),
    ("receive filter", "consumer", "Receive", R(filter_expression=HUGE + " || x"), Code.INVALID_ARGUMENT),
    ("receive SQL92 filter", "consumer", "Receive", R(filter_type=common_pb2.FILTER_TYPE_SQL92,
                                                      filter_expression=HUGE), Code.INVALID_ARGUMENT),
    ("receive SQL92 string", "consumer", "Receive", R(filter_type=common_pb2.FILTER_TYPE_SQL92,
                                                      filter_expression="a = '" + HUGE[:4000]), Code.INVALID_ARGUMENT),
    ("ack handle", "consumer", "Ack", consumer_pb2.AckRequest(group="cg", topic="t", receipt_handles=[HUGE]), None),
    ("ack group", "consumer", "Ack", consumer_pb2.AckRequest(group=HUGE, topic="t", receipt_handles=["x"]),
     Code.INVALID_ARGUMENT),
    ("change handle", "consumer", "ChangeInvisibleDuration", consumer_pb2.ChangeInvisibleDurationRequest(
        group="cg", topic="t", receipt_handle=HUGE, invisible_duration_ms=1000), Code.INVALID_ARGUMENT),
    ("dead letter handle", "consumer", "ForwardToDeadLetter", consumer_pb2.ForwardToDeadLetterRequest(
        group="cg", topic="t", receipt_handle=HUGE), Code.INVALID_ARGUMENT),
    ("pop stats group", "consumer", "Stats", consumer_pb2.PopStatsRequest(group=HUGE, topic="t"),
     Code.INVALID_ARGUMENT),
    ("create user name", "access", "CreateUser", access_pb2.CreateUserRequest(name=HUGE), Code.INVALID_ARGUMENT),
    ("create user secret", "access", "CreateUser", access_pb2.CreateUserRequest(name="u1", secret=HUGE),
     Code.INVALID_ARGUMENT),
    ("update an unknown user", "access", "UpdateUser", access_pb2.UpdateUserRequest(name=HUGE, new_secret=True),
     Code.INVALID_ARGUMENT),
    ("delete an unknown user", "access", "DeleteUser", access_pb2.DeleteUserRequest(name=HUGE),
     Code.INVALID_ARGUMENT),
    ("rule pattern", "access", "AddRule", access_pb2.AddRuleRequest(user="u2", pattern=HUGE,
                                                                     actions=[access_pb2.ACTION_PUB]),
     Code.INVALID_ARGUMENT),
    ("rules of a user", "access", "ListRules", access_pb2.ListRulesRequest(user=HUGE), Code.INVALID_ARGUMENT),
    ("sdk key of a user", "access", "CreateSdkKey", access_pb2.CreateSdkKeyRequest(user=HUGE), Code.INVALID_ARGUMENT),
    ("sdk keys of a user", "access", "ListSdkKeys", access_pb2.ListSdkKeysRequest(user=HUGE), Code.INVALID_ARGUMENT),
    ("revoke an access key", "access", "RevokeSdkKey", access_pb2.RevokeSdkKeyRequest(access_key=HUGE),
     Code.INVALID_ARGUMENT),
]


@pytest.mark.parametrize("service, method, request_, code", [c[1:] for c in HUGE_CASES],
                         ids=[c[0] for c in HUGE_CASES])
def test_a_huge_value_gets_its_status_and_a_short_message(stubs, service, method, request_, code):
    if code is None:  # answered OK, with a result per item whose message is as short
        results = _call(stubs, service, method, request_).results
        assert results and all(len(r.message) < 600 and "h" * 100 not in r.message for r in results), results
        return
    with pytest.raises(grpc.RpcError) as info:
        _call(stubs, service, method, request_)
    details = info.value.details()
    assert info.value.code() == code, details[:300]
    assert len(details) < 600 and "h" * 100 not in details, details[:300]
    assert all(len(value) < 300 for _, value in info.value.trailing_metadata() or ())
