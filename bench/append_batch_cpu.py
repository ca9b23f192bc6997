"""CPU a batched Append costs the commit log in process, without gRPC (issue 37's batched ASYNC row).

``python bench/append_batch_cpu.py [--batches N] [--repeats R] [--profile]`` builds an ASYNC store in a
temporary directory (as the service composes it: build_store, the timer's Scheduler), wraps the body of the
servicer's Append (commitlog_service.servicer.CommitLogServicer.Append; the bench imports no service package)
as the server does (the error interceptor's handler: the compiled request parse, the body, the response bytes)
and sends it the bench's request (bench/loadgen.py: 100 messages of 1 KiB, no keys or properties) N times from
one thread. Prints JSON: CPU microseconds a batch (process CPU: the warmer's and flusher's threads count too),
best of R rounds, beside the same for the no-op server's Append body (bench/noop_server.py: protobuf parse,
response built and serialized), and three parts timed apart: the parse, the store's append (encode, write,
dispatch, results) and the response bytes. ``--profile`` prints a cProfile of the handler (thread CPU clock;
its own cost distorts small functions) by own time.

The store's part is what separates mqstore from the no-op over gRPC in CPU a call; the gRPC call itself
(interceptors, metrics, thread hand-offs) costs both the same and is not here. Old and new code compare by
running this file with PYTHONPATH at each tree (bench/README.md, *Appends*).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import pathlib
import pstats
import sys
import tempfile
import time

import grpc

import structlog
from mqstore import codec, waits
from mqstore.config import StoreConfig
from mqstore.store_parts import build_store
from mqstore.timer.config import TimerConfig
from mqstore.timer.scheduling import Scheduler
from mqstore_rpc import append_wire
from mqstore_rpc.errors import wire_codec, wrap_handler
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from loadgen import append_request_bytes
from noop_server import NoopCommitLog

TOPIC = "bench"
PEER = "ipv4:127.0.0.1:50000"


class _Context:
    def peer(self) -> str:
        return PEER


def append_handler(scheduler: Scheduler):
    """The servicer's Append as the error interceptor wraps it (mqstore_rpc.errors.wrap_handler), a coroutine as on
    the port, run to its end here by mqstore.waits.blocking (an ASYNC append never suspends: as on the loop, one
    step)."""
    @wire_codec(append_wire.parse_request)
    async def append(request, context):  # CommitLogServicer.Append's body
        results = await scheduler.append_async(request.topic, append_wire.messages(request, context.peer()),
                                               replication=append_wire.replication(request))
        return append_wire.append_response((results,))
    method = "/mqstore.v1.CommitLog/Append"
    plain = grpc.unary_unary_rpc_method_handler(append, request_deserializer=commitlog_pb2.AppendRequest.FromString,
                                                response_serializer=commitlog_pb2.AppendResponse.SerializeToString)
    wrapped = wrap_handler(plain, method).unary_unary

    def call(raw: bytes, context):
        return waits.blocking(wrapped(raw, context))
    return call


def _cpu_per_batch(call, raw: bytes, batches: int) -> float:
    ctx = _Context()
    t0 = time.process_time()
    for _ in range(batches):
        call(raw, ctx)
    return (time.process_time() - t0) / batches * 1e6


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--body-bytes", type=int, default=1024)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--dir", default=None, help="where the store goes (default: a temporary directory)")
    args = p.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # stdout: the JSON
    raw = append_request_bytes(TOPIC, args.batch, args.body_bytes)
    with tempfile.TemporaryDirectory(dir=args.dir) as where:
        store = build_store(StoreConfig(data_dir=pathlib.Path(where), segment_size_bytes=256 << 20))
        store.start()
        try:
            store.topic_admin.create(TOPIC, 8)
            scheduler = Scheduler(store, TimerConfig())
            handler = append_handler(scheduler)
            noop = NoopCommitLog()

            def noop_call(data, ctx):
                return noop.Append(commitlog_pb2.AppendRequest.FromString(data), ctx).SerializeToString()

            for _ in range(200):  # warm
                handler(raw, _Context())
            out = {"codec": "compiled" if codec.compiled is not None else "python", "batch": args.batch,
                   "body_bytes": args.body_bytes, "batches": args.batches}
            if args.profile:
                prof = cProfile.Profile(time.thread_time_ns, 1e-9)
                prof.runcall(_cpu_per_batch, handler, raw, args.batches)
                pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
            mq, nop, parse, store_part, respond = [], [], [], [], []
            ctx = _Context()
            for _ in range(args.repeats):
                mq.append(_cpu_per_batch(handler, raw, args.batches))
                nop.append(_cpu_per_batch(noop_call, raw, args.batches))
                parsed = [append_wire.parse_request(raw) for _ in range(args.batches)]
                t0 = time.process_time()
                for _ in range(args.batches):
                    append_wire.parse_request(raw)
                parse.append((time.process_time() - t0) / args.batches * 1e6)
                results = []
                t0 = time.process_time()
                for req in parsed:
                    results.append(scheduler.append(req.topic, append_wire.messages(req, ctx.peer()),
                                                    replication=append_wire.replication(req)))
                store_part.append((time.process_time() - t0) / args.batches * 1e6)
                t0 = time.process_time()
                for r in results:
                    append_wire.append_response((r,))
                respond.append((time.process_time() - t0) / args.batches * 1e6)
            out.update({"mqstore_us_per_batch": min(mq), "noop_us_per_batch": min(nop),
                        "parse_us": min(parse), "store_append_us": min(store_part), "response_us": min(respond),
                        "rounds_mqstore": [round(x, 1) for x in mq], "rounds_noop": [round(x, 1) for x in nop]})
            print(json.dumps(out))
        finally:
            store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
