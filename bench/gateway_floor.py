"""Floors of the gateway's design for bench/gateway.py: ``gateway_floor.py MODE COMMITLOG_ADDRESS``.

A minimal apache.rocketmq.v2 server (bench/noop_v2.py's routes, heartbeats and settings) whose SendMessage
does the least a gateway can: the message id as UNIQ_KEY, the body and born time into one Append, the queue
offset back. It prints its port, then serves until stdin closes. MODE:

  sync     a grpc thread-pool server calling the commit log's unary Append on a plain channel (the design
           of gateway_service: the floor of one RPC hop in Python gRPC)
  aio      the same on grpc.aio: an asyncio server awaiting Append on an aio channel (one event loop, no
           thread pool hop for the send)
  inproc   no hop: a thread-pool server appending into a MessageStore of its own process (a temporary
           directory, ASYNC flush), as a gateway hosted inside the commit log would

None of these is the gateway: no client registry, no checks, no transactions. They show what the design
allows on this machine, measured in the same run as the gateway itself.
"""

from __future__ import annotations

import asyncio
import collections
import os
import queue
import threading
import pathlib
import shutil
import sys
import tempfile
from concurrent import futures

import grpc
from mqstore.config import StoreConfig
from mqstore.errors import NotFound
from mqstore.model import MessageIn
from mqstore.store_parts import build_store

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from noop_v2 import OK, NoopMessaging

APPEND = "/mqstore.v1.CommitLog/Append"
APPEND_BATCHES_STREAM = "/mqstore.v1.CommitLogInternal/AppendBatchesStream"
TOKEN_METADATA = "mqstore-internal-token"
TIMEOUT_S = 10


def born_ms(m: d.Message) -> int:
    born = m.system_properties.born_timestamp
    return born.seconds * 1000 + born.nanos // 1_000_000


def append_request(m: d.Message) -> bytes:
    message = common_pb2.MessageInput(body=m.body, properties={"UNIQ_KEY": m.system_properties.message_id},
                                      born_timestamp_ms=born_ms(m))
    return commitlog_pb2.AppendRequest(topic=m.topic.name, messages=[message]).SerializeToString()


def batches_request(m: d.Message) -> bytes:
    message = common_pb2.MessageInput(body=m.body, properties={"UNIQ_KEY": m.system_properties.message_id},
                                      born_timestamp_ms=born_ms(m))
    return commitlog_pb2.InternalAppendBatchesRequest(writer="gateway", batches=[commitlog_pb2.InternalAppendBatch(
        topic=m.topic.name, messages=[commitlog_pb2.InternalMessage(message=message)])]).SerializeToString()


def answer(m: d.Message, queue_offset: int) -> s.SendMessageResponse:
    return s.SendMessageResponse(status=OK, entries=[s.SendResultEntry(
        status=OK, message_id=m.system_properties.message_id, offset=queue_offset)])


class SyncFloor(NoopMessaging):
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.append = self.channel.unary_unary(APPEND)

    def SendMessage(self, request, context):
        m = request.messages[0]
        raw = self.append(append_request(m), timeout=TIMEOUT_S)
        return answer(m, commitlog_pb2.AppendResponse.FromString(raw).results[0].queue_offset)


class AioFloor(NoopMessaging):
    def __init__(self, address: str):
        self.channel = grpc.aio.insecure_channel(address)
        self.append = self.channel.unary_unary(APPEND)

    async def SendMessage(self, request, context):
        m = request.messages[0]
        raw = await self.append(append_request(m), timeout=TIMEOUT_S)
        return answer(m, commitlog_pb2.AppendResponse.FromString(raw).results[0].queue_offset)


class StreamFloor(NoopMessaging):
    """One CommitLogInternal.AppendBatchesStream kept open (needs MQSTORE_INTERNAL_TOKEN): a handler queues its
    request and waits for the reader thread to hand it its response, in order."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: collections.deque = collections.deque()
        self.lock = threading.Lock()
        call = self.channel.stream_stream(APPEND_BATCHES_STREAM)(
            iter(self.requests.get, None), metadata=((TOKEN_METADATA, os.environ["MQSTORE_INTERNAL_TOKEN"]),))
        threading.Thread(target=self._read, args=(call,), daemon=True).start()

    def _read(self, call) -> None:
        for raw in call:
            waiter = self.pending.popleft()
            waiter[1] = raw
            waiter[0].set()

    def SendMessage(self, request, context):
        m = request.messages[0]
        waiter = [threading.Event(), None]
        with self.lock:
            self.pending.append(waiter)
            self.requests.put(batches_request(m))
        if not waiter[0].wait(TIMEOUT_S):
            raise RuntimeError("no answer from the stream")
        result = commitlog_pb2.InternalAppendBatchesResponse.FromString(waiter[1]).results[0]
        return answer(m, result.appended.results[0].queue_offset)


class InProcessFloor(NoopMessaging):
    def __init__(self, data_dir: pathlib.Path):
        # The commit log's disk limit when the run sets one (a shared machine's disk near the default 90%)
        ratio = float(os.environ.get("MQSTORE_DISK_MAX_USED_RATIO", "0.9"))
        self.store = build_store(StoreConfig(data_dir=data_dir, segment_size_bytes=256 << 20,
                                              disk_max_used_ratio=ratio))
        self.store.start()

    def SendMessage(self, request, context):
        m = request.messages[0]
        try:
            self.store.topics.get(m.topic.name)
        except NotFound:  # the benchmark's topic, created by its first send
            self.store.topic_admin.create(m.topic.name, 8)
        message = MessageIn(m.body, properties={"UNIQ_KEY": m.system_properties.message_id},
                                  born_timestamp_ms=born_ms(m))
        return answer(m, self.store.append(m.topic.name, [message])[0].queue_offset)


def serve_threads(servicer) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()   # until the benchmark closes our stdin
    server.stop(0)


async def serve_aio(address: str) -> None:
    # Routes, heartbeats and Telemetry stay synchronous handlers, run by the migration thread pool.
    server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(max_workers=64))
    service_pb2_grpc.add_MessagingServiceServicer_to_server(AioFloor(address), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


def main(argv: list[str]) -> int:
    mode, address = argv
    if mode == "sync":
        serve_threads(SyncFloor(address))
    elif mode == "stream":
        serve_threads(StreamFloor(address))
    elif mode == "aio":
        asyncio.run(serve_aio(address))
    elif mode == "inproc":
        data_dir = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-gateway-floor-"))
        try:
            floor = InProcessFloor(data_dir)
            try:
                serve_threads(floor)
            finally:
                floor.store.stop()
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)
    else:
        print(f"mode must be sync, aio or inproc, not {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
