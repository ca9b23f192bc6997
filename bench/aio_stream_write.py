"""Does a grpc.aio stream write suspend its caller, and what does it cost the caller's thread? (issue 37:
cProfile charges the Transaction service's `_call.py` `_write` 0.41 ms per request to the commit log, but it
measures wall time.) A grpc.aio client writes ``--requests`` requests of ``--bytes`` bytes, one at a time,
on a stream to a grpc.aio echo server in a child process (each answered by 10 bytes, read before the next
write), twice: first with a callback re-scheduling itself on the client's loop (a write during which it ran
suspended), then without it, timing each write's wall time and the loop thread's CPU time.
``bench/aio_stream_write.py [--requests N] [--bytes B]``."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import grpc
from grpc import aio

SERVICE, METHOD = "bench.Echo", "Stream"


async def _echo(requests, context):
    async for request in requests:
        yield request[:10]


async def serve() -> None:
    server = aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.stream_stream_rpc_method_handler(_echo)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await server.stop(None)


async def measure(port: int, requests: int, size: int) -> str:
    loop = asyncio.get_running_loop()
    ticking = [True, 0]

    def tick() -> None:
        ticking[1] += 1
        if ticking[0]:
            loop.call_soon(tick)
    payload = b"x" * size
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = channel.stream_stream(f"/{SERVICE}/{METHOD}")()
        tick()
        suspended = 0
        for _ in range(requests):  # with the ticking callback: which writes suspend
            before = ticking[1]
            await asyncio.wait_for(call.write(payload), 10)
            suspended += ticking[1] != before
            await asyncio.wait_for(call.read(), 10)
        ticking[0] = False
        await asyncio.sleep(0)
        wall = cpu = 0.0
        for _ in range(requests):  # without: what a write costs, the loop idle in epoll while it waits
            start, start_cpu = time.perf_counter(), time.thread_time()
            await asyncio.wait_for(call.write(payload), 10)
            wall += time.perf_counter() - start
            cpu += time.thread_time() - start_cpu
            await asyncio.wait_for(call.read(), 10)
        await call.done_writing()
    return (f"writes that suspended: {suspended} of {requests}; per write {wall / requests * 1e3:.3f} ms of wall "
            f"time, {cpu / requests * 1e3:.3f} ms of the loop thread's CPU ({size} bytes)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=4000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve())
        return 0
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        port = int(server.stdout.readline())
        print(asyncio.run(measure(port, args.requests, args.bytes)))
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
