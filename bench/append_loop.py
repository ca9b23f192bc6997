"""The comparison loop of bench/gateway.py: ``append_loop.py ADDRESS TOPIC WARMUP COUNT BODY_BYTES [barrier]``.

The same shape as a RocketMQ client's send loop, on mqstore's own API: one process, one blocking unary
``CommitLog.Append`` of one message at a time (a plain grpc client). Prints ``{"elapsed_s": ...}`` for the
COUNT calls after WARMUP calls. With ``barrier`` it prints ``ready`` after the warm-up and starts the measured
calls when a line comes on stdin (bench/gateway.py starts many loops at once so).
"""

from __future__ import annotations

import json
import sys
import time

import grpc

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2


def main(argv: list[str]) -> int:
    address, topic, warmup, count, body_bytes = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    with grpc.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        body = b"x" * body_bytes

        def send() -> None:
            # a new request per message, as a client builds one per send
            stub.Append(commitlog_pb2.AppendRequest(topic=topic, messages=[common_pb2.MessageInput(body=body)]),
                        timeout=10)
        for _ in range(warmup):
            send()
        if argv[5:] == ["barrier"]:
            print("ready", flush=True)
            sys.stdin.readline()
        start = time.perf_counter()
        for _ in range(count):
            send()
        elapsed = time.perf_counter() - start
    print(json.dumps({"elapsed_s": elapsed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
