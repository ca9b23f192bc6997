"""CommitLogInternal's AppendBatches and AppendBatchesStream (the txn service's and the gateway's way into the
log in Cluster mode) are answered on the port's event loop, as CommitLog.Append is: each batch is written on the
loop's thread, with no hand-off to a handler thread and back per request, under ASYNC and under SYNC flush (whose
fsync is awaited there, not blocked on). A store in this process, served by a port of its own on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading

import grpc
import pytest

from commitlog_service.internal import TOKEN_METADATA, CommitLogInternalServicer, add_to_server
from mqstore import system_writers  # noqa: F401  (registers the txn writer's rules, as the commit log's main does)
from mqstore.config import FLUSH_ASYNC, FLUSH_SYNC
from mqstore.store_parts import build_store
from mqstore.txn.records import HALF_TOPIC
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ManagedServer, ServerConfig
from tests.support.waiting import WAIT_S

pytestmark = pytest.mark.integration

TOKEN = "loop-token"
LOOP = "grpc-aio-loop"  # mqstore_rpc.aio.LoopThread's thread
METADATA = ((TOKEN_METADATA, TOKEN),)


@contextlib.contextmanager
def serving(small_config, flush_mode: str):
    """(the store, the threads its commit log's appends ran on, a CommitLogInternal stub)."""
    store = build_store(small_config(flush_mode=flush_mode))
    store.start()
    threads: list[str] = []
    real = store.commitlog.append

    def append(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)
    store.commitlog.append = append
    server = ManagedServer(ServerConfig(port=0, grace_s=0.5))
    try:
        store.topic_admin.create("orders", 1)
        add_to_server(CommitLogInternalServicer(store, TOKEN), server.grpc_server)
        server.start()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield store, threads, commitlog_pb2_grpc.CommitLogInternalStub(channel)
    finally:
        server.stop()
        store.stop()


def _request(*bodies: bytes) -> pb.InternalAppendBatchesRequest:
    return pb.InternalAppendBatchesRequest(writer="txn", batches=[pb.InternalAppendBatch(
        topic=HALF_TOPIC, messages=[pb.InternalMessage(message=common_pb2.MessageInput(body=b)) for b in bodies])])


@pytest.mark.parametrize("flush_mode", [FLUSH_ASYNC, FLUSH_SYNC])
def test_internal_appends_are_written_and_answered_on_the_loop(small_config, flush_mode):
    with serving(small_config, flush_mode) as (store, threads, internal):
        answers = list(internal.AppendBatchesStream(iter([_request(b"1", b"2"), _request(b"3")]), timeout=WAIT_S,
                                                    metadata=METADATA))
        offsets = [[r.queue_offset for r in a.results[0].appended.results] for a in answers]
        assert offsets == [[0, 1], [2]]  # each request answered, in order
        one = internal.AppendBatches(_request(b"4"), timeout=WAIT_S, metadata=METADATA)
        assert [r.queue_offset for r in one.results[0].appended.results] == [3]
        assert threads == [LOOP] * 3  # every batch written on the loop, none in the handler pool
        if flush_mode == FLUSH_SYNC:  # answered once its fsync covered it, awaited on the loop
            durable = [r.durability for a in [*answers, one] for r in a.results[0].appended.results]
            assert durable == [common_pb2.DURABILITY_FLUSHED] * 4
            assert store.flusher.flushed_offset >= store.log_end()
