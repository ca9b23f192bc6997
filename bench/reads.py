"""The read group: Pull and Tail over a pre-filled log, against the no-op Pull and the append rate.

One ASYNC server is filled with ``fill_bytes`` of 1 KiB messages (topic ``bench-read``, 8 queues,
16 producers sending 100-message Appends: that fill is itself timed, as an append rate). Then:
  Pull x1   one consumer reads queue 0, then 1, ... 7 from offset 0 to the end, 1000 messages per call
            (max_bytes 8 MiB so that 1000 messages fit);
  Pull x8   eight consumers at once, one queue each;
  Tail      one Tail stream from the earliest record until every record has been seen; the client
            counts records by walking TOTALSIZE with struct (and checks the frames' record_count).
The data was just written, so the log is in the page cache for every reader (warm reads).
The no-op server answers the same Pull calls (1000 prebuilt 1 KiB messages each): the ceiling.
With ``--codec both`` (run.py) the Pulls are measured again on the pure-Python codec (``pull_x1-py``,
``pull_x8-py``), on the same log reopened: the compiled and the reference read path side by side.
"""

from __future__ import annotations

import pathlib
import time

import grpc

from append import BODY_BYTES, create_topic
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from procs import CODEC_COMPILED, PY_SUFFIX, BenchError, GrpcServer, cpu_seconds, run_loadgen

TOPIC = "bench-read"
QUEUES = 8
PULL_MESSAGES = 1000
PULL_MAX_BYTES = 8 << 20


def store_info(target: str) -> commitlog_pb2.StoreInfo:
    with grpc.insecure_channel(target) as channel:
        return commitlog_pb2_grpc.CommitLogStub(channel).GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=30)


def queue_ends(target: str, topic: str, queues: int) -> list[int]:
    with grpc.insecure_channel(target) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        return [stub.GetQueueInfo(commitlog_pb2.GetQueueInfoRequest(topic=topic, queue_id=q), timeout=30).max_offset
                for q in range(queues)]


def wait_visible(target: str, timeout_s: float = 60.0) -> commitlog_pb2.StoreInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = store_info(target)
        if info.visible_physical_offset >= info.max_physical_offset:
            return info
        time.sleep(0.05)
    raise BenchError(f"the log did not become visible within {timeout_s} s")


def fill(server: GrpcServer, topic: str, target_bytes: int, timeout_s: float) -> dict:
    """Append 100-message batches from 16 producers until ``target_bytes`` of records are stored."""
    spec = {"kind": "fill", "target": server.target, "topic": topic, "batch": 100, "body_bytes": BODY_BYTES,
            "concurrency": 16, "target_bytes": target_bytes, "max_calls": 1_000_000, "timeout_s": timeout_s}
    result = run_loadgen(spec, 1, timeout_s=timeout_s + 30)[0]
    result["msgs_per_s"] = result["messages"] / result["elapsed_s"]
    return result


def _pull(server: GrpcServer, ends: list[int], consumers: int, timeout_s: float) -> dict:
    spec = {"kind": "pull", "target": server.target, "topic": TOPIC, "queues": list(range(QUEUES)),
            "queue_ends": ends, "concurrency": consumers, "max_messages": PULL_MESSAGES,
            "max_bytes": PULL_MAX_BYTES, "max_calls": 1_000_000, "timeout_s": timeout_s}
    cpu0 = cpu_seconds(server.pid)
    result = run_loadgen(spec, 1, timeout_s=timeout_s + 30)[0]
    result["server_cpu_s"] = cpu_seconds(server.pid) - cpu0
    result["msgs_per_s"] = result["messages"] / result["elapsed_s"]
    result["mb_per_s"] = result["bytes"] / result["elapsed_s"] / 1e6
    lat = sorted(result.pop("latencies_ms"))
    result["p50_ms"] = lat[len(lat) // 2] if lat else None
    result["p99_ms"] = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
    if result["messages"] < sum(ends) and result["elapsed_s"] < timeout_s * 0.99:
        raise BenchError(f"pull read {result['messages']} of {sum(ends)} messages")
    return result


def _tail(server: GrpcServer, records: int, timeout_s: float) -> dict:
    spec = {"kind": "tail", "target": server.target, "concurrency": 1, "expected_records": records,
            "max_frame_bytes": 0,
            "max_frames": 10_000_000, "timeout_s": timeout_s}
    cpu0 = cpu_seconds(server.pid)
    result = run_loadgen(spec, 1, timeout_s=timeout_s + 30)[0]
    result["server_cpu_s"] = cpu_seconds(server.pid) - cpu0
    if result["records"] != result["declared_records"]:
        raise BenchError(f"tail: walked {result['records']} records, frames declared {result['declared_records']}")
    result["msgs_per_s"] = result["records"] / result["elapsed_s"]
    result["mb_per_s"] = result["bytes"] / result["elapsed_s"] / 1e6
    return result


def run(work: pathlib.Path, sizes: dict, log, codecs: tuple[str, ...] = (CODEC_COMPILED,)) -> dict:
    """The first codec's server fills the log and is measured (keys ``pull_x1``, ``pull_x8``, ``tail``;
    ``-py`` appended on the pure-Python codec); each further codec's server reopens the same log after
    a graceful stop and measures the Pulls again (its keys with its suffix)."""
    server = GrpcServer.commitlog(work / "read", "ASYNC", codec=codecs[0]).start().check_codec()
    noop = GrpcServer.noop(work, "noop-read.log").start()
    try:
        create_topic(server.target, TOPIC, QUEUES)
        filled = fill(server, TOPIC, sizes["read_fill_bytes"], timeout_s=sizes["fill_timeout_s"])
        log("read", "fill", filled)
        info = wait_visible(server.target)
        ends = queue_ends(server.target, TOPIC, QUEUES)
        out = {"fill": filled, "log_bytes": info.max_physical_offset - info.min_physical_offset,
               "messages": sum(ends), "queue_ends": ends, "codecs": list(codecs)}
        limit = sizes["read_timeout_s"]
        for consumers in (1, 8):
            out[f"noop_pull_x{consumers}"] = _pull(noop, ends, consumers, limit)
            log("read", f"noop pull x{consumers}", out[f"noop_pull_x{consumers}"])
        for i, codec in enumerate(codecs):
            if i:
                server.stop()
                # its own log file: the port is read from it
                server = GrpcServer.commitlog(work / "read", "ASYNC", codec=codec,
                                              log_name=f"read-{codec}.log").start().check_codec()
                wait_visible(server.target)
            suffix = "" if codec == CODEC_COMPILED else PY_SUFFIX
            for consumers in (1, 8):
                out[f"pull_x{consumers}{suffix}"] = _pull(server, ends, consumers, limit)
                log("read", f"pull x{consumers}{suffix}", out[f"pull_x{consumers}{suffix}"])
            if not i:
                out["tail"] = _tail(server, sum(ends), limit)
                log("read", "tail", out["tail"])
                out["memory_kib"] = server.memory_kib()
        return out
    finally:
        noop.stop()
        server.stop()
