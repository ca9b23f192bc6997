"""A no-op CommitLog server: the ceiling of Python gRPC on this machine, for the benchmark's ratios.

``python bench/noop_server.py --port 0`` serves ``mqstore.v1.CommitLog`` on 127.0.0.1 with the same
plumbing as the real service (mqstore_rpc.server: the same thread pool, interceptor, message limits,
health and reflection) but stores nothing:

- ``Append`` / ``AppendStream`` return one AppendResult per message (a fixed, realistically sized
  result copied per message), so the response has the real shape and size;
- ``Pull`` returns ``max_messages`` copies of one 1 KiB StoredMessage (built once), with
  ``next_offset = offset + max_messages``, so the ceiling includes building and serialising a
  response of the real size;
- ``GetStoreInfo`` answers (used as a readiness probe); every other RPC is UNIMPLEMENTED.

What is left out is exactly the store: converting messages, encoding records, the lock, the copy into
the log, flushing, dispatching and building the results from what was stored. The ratio of a workload
against this server is the share of the gRPC ceiling the store keeps.

Like the real service it logs ``server.started`` (JSON, stderr) with the bound port, and stops on
SIGTERM / SIGINT.

``--flavour`` picks the gRPC server around the same servicer (bench/grpc_flavours.py compares them):

  flavour     server
  ----------- ------------------------------------------------------------------------------------------
  loop        mqstore_rpc.server as every service builds it (grpc.aio on a uvloop loop of its own, one generic
              handler, metrics + error interceptors), with Append and GetStoreInfo coroutines answered on the
              loop as the CommitLog's are, AppendStream and Pull in the handler pool: the same kind of server
              as the CommitLog port, so the floor its Append could reach with the same gRPC stack (the append
              group's comparison point, bench/README.md *The no-op server's kind*)
  sync        the same server with every handler synchronous, so run in the handler pool (a hand-off from the
              loop to a pool thread and back a call): the append group's comparison point before the loop
              flavour (it was a grpc.server with a thread pool when the ports were), kept beside it
  sync-bare   the same grpc.server, thread pool and options without interceptors (what they cost a call)
  aio         grpc.aio.server, the same options, handlers as coroutines on one event loop, no interceptors
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mqstore import defaults
from mqstore.format.record import PROPERTY_UNIQ_KEY
from mqstore_rpc import logging as mqlogging
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.executor import RUNNING
from mqstore_rpc.server import ServerConfig, create_server

log = structlog.get_logger("noop_server")

# A result the size of a real one: 32-hex msg id, 32-hex uniq key, realistic numbers.
_RESULT = commitlog_pb2.AppendResult(
    msg_id="7F00000100009C4300000000DEADBEEF", uniq_key="7F0000010000" + "AB" * 10, queue_id=3,
    queue_offset=123_456, physical_offset=9_876_543_210, size_bytes=1_150, store_timestamp_ms=1_790_000_000_000,
    durability=common_pb2.DURABILITY_WRITTEN)
MAX_PULL_MESSAGES = 10_000


class NoopCommitLog(commitlog_pb2_grpc.CommitLogServicer):
    """Thread-safe: the only state is a cache of prebuilt, never-modified messages (a benign race)."""

    def __init__(self, burn_us: float = 0.0) -> None:
        self._pull_cache: dict[int, list[common_pb2.StoredMessage]] = {}
        self._burn_s = burn_us / 1e6

    def Append(self, request, context):
        if self._burn_s:
            _burn(self._burn_s)
        return commitlog_pb2.AppendResponse(results=[_RESULT] * len(request.messages))

    def AppendStream(self, request_iterator, context):
        count = 0
        for request in request_iterator:
            count += len(request.messages)
        return commitlog_pb2.AppendResponse(results=[_RESULT] * count)

    def Pull(self, request, context):
        count = min(request.max_messages or 32, MAX_PULL_MESSAGES)
        messages = self._pull_cache.get(count)
        if messages is None:
            messages = self._pull_cache[count] = [_stored_message()] * count
        return commitlog_pb2.PullResponse(messages=messages, next_offset=request.offset + count, min_offset=0,
                                          max_offset=request.offset + count)

    def GetStoreInfo(self, request, context):
        return commitlog_pb2.StoreInfo(flush_mode="NOOP")


def _stored_message(body_bytes: int = 1024) -> common_pb2.StoredMessage:
    body = bytes(i & 0xFF for i in range(body_bytes))
    return common_pb2.StoredMessage(
        topic="bench", queue_id=0, queue_offset=1, physical_offset=1_000_000, size_bytes=body_bytes + 126,
        msg_id="7F00000100009C4300000000000F4240", uniq_key="7F0000010000" + "AB" * 10, body=body,
        properties={PROPERTY_UNIQ_KEY: "7F0000010000" + "AB" * 10}, born_timestamp_ms=1_790_000_000_000,
        store_timestamp_ms=1_790_000_000_000, born_host="127.0.0.1:50000", store_host=defaults.COMMITLOG_ADDRESS,
        body_crc=123_456_789)


class LoopNoopCommitLog(NoopCommitLog):
    """NoopCommitLog whose Append and GetStoreInfo are coroutines: mqstore_rpc.server answers them on the port's
    loop, as it does the CommitLog's (commitlog_service.servicer); AppendStream and Pull stay synchronous (the
    handler pool), as the CommitLog's AppendStream and its Pull of an older segment are."""

    async def Append(self, request, context):
        return commitlog_pb2.AppendResponse(results=[_RESULT] * len(request.messages))

    async def GetStoreInfo(self, request, context):
        return commitlog_pb2.StoreInfo(flush_mode="NOOP")


class AioNoopCommitLog(commitlog_pb2_grpc.CommitLogServicer):
    """The same answers as NoopCommitLog from coroutines (grpc.aio)."""

    def __init__(self) -> None:
        self._sync = NoopCommitLog()

    async def Append(self, request, context):
        return commitlog_pb2.AppendResponse(results=[_RESULT] * len(request.messages))

    async def AppendStream(self, request_iterator, context):
        count = 0
        async for request in request_iterator:
            count += len(request.messages)
        return commitlog_pb2.AppendResponse(results=[_RESULT] * count)

    async def Pull(self, request, context):
        return self._sync.Pull(request, context)

    async def GetStoreInfo(self, request, context):
        return commitlog_pb2.StoreInfo(flush_mode="NOOP")


FLAVOURS = ("loop", "sync", "sync-bare", "aio")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="no-op CommitLog server (benchmark ceiling)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1, 0 = any free port")
    parser.add_argument("--flavour", choices=FLAVOURS, default="sync", help="the gRPC server (module docstring)")
    parser.add_argument("--burn-us", type=float, default=0.0,
                        help="sync flavour: each Append first spends this much thread CPU holding the GIL (bench/"
                             "grpc_flavours.py --burn-us: does a longer handler cost more than its own time?)")
    parser.add_argument("--max-running-handlers", type=int, default=RUNNING,
                        help=f"sync flavour: as the CommitLog service's setting (default {RUNNING}, as its)")
    args = parser.parse_args(argv)
    running = {"max_running_handlers": args.max_running_handlers}
    mqlogging.configure("info")
    if args.flavour == "aio":
        return asyncio.run(_serve_aio(args.port))
    if args.flavour == "sync-bare":
        return _serve_sync_bare(args.port)
    server = create_server(ServerConfig(host="127.0.0.1", port=args.port, **running))
    servicer = LoopNoopCommitLog() if args.flavour == "loop" else NoopCommitLog(args.burn_us)
    commitlog_pb2_grpc.add_CommitLogServicer_to_server(servicer, server.grpc_server)
    server.add_service_names([commitlog_pb2.DESCRIPTOR.services_by_name["CommitLog"].full_name])
    server.start()
    server.mark_serving()
    log.info("server.started", service="noop", flavour=args.flavour, port=server.port, pid=os.getpid())
    _wait_for_signal()
    server.stop()
    log.info("server.stopped", port=server.port)
    return 0


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU in Python bytecode (the GIL held, as a store's handler holds it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _wait_for_signal() -> None:
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    stopping.wait()  # on POSIX a signal interrupts this wait, so the handler runs at once


def _serve_sync_bare(port: int) -> int:
    config = ServerConfig(host="127.0.0.1", port=port)
    executor = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="grpc-handler")
    server = grpc.server(executor, options=_options(config), maximum_concurrent_rpcs=config.max_concurrent_rpcs)
    commitlog_pb2_grpc.add_CommitLogServicer_to_server(NoopCommitLog(), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(config.address)
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    log.info("server.started", service="noop", flavour="sync-bare", port=bound, pid=os.getpid())
    _wait_for_signal()
    server.stop(config.grace_s).wait()
    executor.shutdown(wait=False)
    log.info("server.stopped", port=bound)
    return 0


def _options(config: ServerConfig) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.max_receive_message_length", config.max_message_bytes), ("grpc.so_reuseport", 0)]


async def _serve_aio(port: int) -> int:
    config = ServerConfig(host="127.0.0.1", port=port)
    server = grpc.aio.server(options=_options(config), maximum_concurrent_rpcs=config.max_concurrent_rpcs)
    commitlog_pb2_grpc.add_CommitLogServicer_to_server(AioNoopCommitLog(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(config.address)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    log.info("server.started", service="noop", flavour="aio", port=bound, pid=os.getpid())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop(config.grace_s)
    log.info("server.stopped", port=bound)
    return 0


if __name__ == "__main__":
    sys.exit(main())
