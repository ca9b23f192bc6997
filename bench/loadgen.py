"""Load generator for the CommitLog benchmark: one client process, ``grpc.aio``, N concurrent tasks.

Run by bench/run.py as ``python bench/loadgen.py '<json spec>'``; prints one JSON object on stdout.
It runs in its own process so that the measuring process (run.py) only waits, and so that run.py can
kill it on a timeout. Several loadgen processes may share one workload: they agree on the measuring
window through wall-clock times (``start_at``), which every process on the machine reads alike.

Kinds (``spec["kind"]``):
  unary   Append with ``batch`` messages per call                      (throughput window + latency)
  stream  AppendStream of ``items`` items of ``batch`` messages each     (throughput window + latency)
  fill    Append batches until ``target_bytes`` of records are stored    (whole run timed)
  pull    Pull ``max_messages`` per call over ``queues``, one task per queue group (whole run timed)
  tail    one Tail stream from the earliest record until ``expected_records`` are seen (whole run timed)
  call    any unary ``method`` with ``requests_hex`` (task i sends request i mod n, responses not
          parsed; bench/concurrency.py: Pull, GetStoreInfo)            (throughput window + latency)
  tails   closed loop of Tail streams from the earliest record, each until ``expected_records``
          (bench/concurrency.py; latency per stream)                   (throughput window + latency)

Optional spec keys (bench/security.py): ``tls_ca`` (a CA file: the channels speak TLS, checking the
server's certificate against it), ``authorization`` (the metadata value ``Bearer user:secret`` sent with
every call, as mqstore_rpc.auth reads it) and ``channel_options`` (more grpc channel arguments,
``[[name, value], ...]``).

The client must not be the bottleneck: requests are serialised once and sent as bytes (no serialiser),
append responses come back as bytes (no deserialiser) and only the first response of every task is
parsed and checked (result count and durability). Every loop stops at a call count and a deadline.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time

import grpc

from mqstore import defaults
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

SERVICE = "/mqstore.v1.CommitLog/"
CHANNEL_OPTIONS = [("grpc.max_send_message_length", defaults.MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", defaults.MAX_MESSAGE_BYTES)]
TOTALSIZE = struct.Struct(">i")  # first field of every commit log record (mqstore.format.record)
RPC_TIMEOUT_S = 30.0
DURABILITY_NAMES = {v: common_pb2.Durability.Name(v) for v in common_pb2.Durability.values()}


class LoadError(Exception):
    """The server answered wrongly (or too slowly to fill); the workload's figure would be meaningless."""


def append_request_bytes(topic: str, batch: int, body_bytes: int) -> bytes:
    """One serialised AppendRequest of ``batch`` messages with the same body (queue: round robin)."""
    body = bytes((i * 131 + 7) & 0xFF for i in range(body_bytes))
    request = commitlog_pb2.AppendRequest(topic=topic)
    for _ in range(batch):
        request.messages.add(body=body)
    return request.SerializeToString()


class Window:
    """Counts calls that complete inside [t0, t1) (wall clock, shared by processes) and their latency."""

    def __init__(self, t0: float, t1: float):
        self.t0, self.t1 = t0, t1
        self.calls = 0
        self.messages = 0
        self.latencies_ms: list[float] = []

    def record(self, end_wall: float, latency_s: float, messages: int) -> None:
        if self.t0 <= end_wall < self.t1:
            self.calls += 1
            self.messages += messages
            self.latencies_ms.append(latency_s * 1000.0)


class Outcome:
    def __init__(self):
        self.errors: dict[str, int] = {}
        self.durability: dict[str, int] = {}
        self.checked_responses = 0
        self.first_error = ""

    def error(self, exc: grpc.aio.AioRpcError) -> None:
        code = exc.code().name
        self.errors[code] = self.errors.get(code, 0) + 1
        self.first_error = self.first_error or f"{code}: {exc.details()}"

    def check_append(self, raw: bytes, expected: int) -> None:
        response = commitlog_pb2.AppendResponse.FromString(raw)
        if len(response.results) != expected:
            raise LoadError(f"append returned {len(response.results)} results for {expected} messages")
        for r in response.results:
            name = DURABILITY_NAMES.get(r.durability, str(r.durability))
            self.durability[name] = self.durability.get(name, 0) + 1
        self.checked_responses += 1


async def _append_task(call, request, per_call: int, window: Window, outcome: Outcome, max_calls: int) -> None:
    checked = False
    for _ in range(max_calls):
        if time.time() >= window.t1:
            return
        started = time.perf_counter()
        try:
            raw = await call(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            outcome.error(exc)
            await asyncio.sleep(0.01)  # do not spin on a failing server
            continue
        window.record(time.time(), time.perf_counter() - started, per_call)
        if not checked:
            outcome.check_append(raw, per_call)
            checked = True


def _channels(target: str, count: int, tls_ca: str = "", extra_options=()) -> list[grpc.aio.Channel]:
    # A local subchannel pool gives every channel its own connection (otherwise they share one).
    options = CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)] + [tuple(o) for o in extra_options]
    if tls_ca:
        with open(tls_ca, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        return [grpc.aio.secure_channel(target, credentials, options=options) for _ in range(count)]
    return [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]


def _authorized(call, spec: dict):
    """The call with the spec's credentials added (as mqstore_rpc.auth expects them), or as it is."""
    value = spec.get("authorization")
    if not value:
        return call
    metadata = (("authorization", value),)
    return lambda request, timeout: call(request, timeout=timeout, metadata=metadata)


async def _ready(channels, timeout_s: float) -> None:
    await asyncio.wait_for(asyncio.gather(*(ch.channel_ready() for ch in channels)), timeout_s)


async def _cpu_at(wall: float) -> float:
    """This process's CPU time at wall-clock time ``wall`` (at once if it has passed)."""
    await asyncio.sleep(max(0.0, wall - time.time()))
    return time.process_time()


async def run_append(spec: dict) -> dict:
    """unary / stream: closed loop of ``concurrency`` tasks; counts what completes inside the window."""
    batch, items = spec["batch"], spec.get("items", 1)
    request = append_request_bytes(spec["topic"], batch, spec["body_bytes"])
    channels = _channels(spec["target"], max(1, min(spec["concurrency"], spec.get("channels", 4))),
                         spec.get("tls_ca", ""), spec.get("channel_options", ()))
    try:
        await _ready(channels, 10.0)
        if spec["kind"] == "stream":
            stubs = [ch.stream_unary(SERVICE + "AppendStream") for ch in channels]
            requests = [request] * items
            calls = [lambda _r, timeout, s=s: s(iter(requests), timeout=timeout) for s in stubs]
        else:
            calls = [_authorized(ch.unary_unary(SERVICE + "Append"), spec) for ch in channels]
        ready = time.time()
        if spec["start_at"] and ready > spec["start_at"]:
            raise LoadError(f"connected {ready - spec['start_at']:.2f} s after the agreed start; raise the lead time")
        t0 = max(spec["start_at"], ready) + spec["warmup_s"]
        window = Window(t0, t0 + spec["duration_s"])
        cpu0, wall0 = time.process_time(), time.perf_counter()
        edges = [asyncio.ensure_future(_cpu_at(t)) for t in (window.t0, window.t1)]
        outcome = Outcome()
        tasks = [_append_task(calls[i % len(calls)], request, batch * items, window, outcome, spec["max_calls"])
                 for i in range(spec["concurrency"])]
        await asyncio.gather(*tasks)
        window_cpu = await edges[1] - await edges[0]
    finally:
        for ch in channels:
            await ch.close()
    cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return {"calls": window.calls, "messages": window.messages, "window_s": spec["duration_s"], "client_cores": cores,
            "window_client_cores": window_cpu / spec["duration_s"],
            "latencies_ms": window.latencies_ms, "errors": outcome.errors, "first_error": outcome.first_error,
            "durability": outcome.durability, "checked_responses": outcome.checked_responses}


async def run_fill(spec: dict) -> dict:
    """Append batches from ``concurrency`` tasks until the records stored add up to ``target_bytes``."""
    request = append_request_bytes(spec["topic"], spec["batch"], spec["body_bytes"])
    channels = _channels(spec["target"], min(spec["concurrency"], 4))
    stored = {"bytes": 0, "messages": 0, "calls": 0}
    deadline = time.monotonic() + spec["timeout_s"]

    async def worker(call) -> None:
        while stored["bytes"] < spec["target_bytes"] and stored["calls"] < spec["max_calls"]:
            if time.monotonic() >= deadline:
                raise LoadError(f"fill: only {stored['bytes']} of {spec['target_bytes']} bytes stored in "
                                 f"{spec['timeout_s']} s")
            response = commitlog_pb2.AppendResponse.FromString(await call(request, timeout=RPC_TIMEOUT_S))
            stored["calls"] += 1
            stored["messages"] += len(response.results)
            stored["bytes"] += sum(r.size_bytes for r in response.results)

    try:
        await _ready(channels, 10.0)
        calls = [ch.unary_unary(SERVICE + "Append") for ch in channels]
        started = time.perf_counter()
        await asyncio.gather(*(worker(calls[i % len(calls)]) for i in range(spec["concurrency"])))
        elapsed = time.perf_counter() - started
    finally:
        for ch in channels:
            await ch.close()
    return {**stored, "elapsed_s": elapsed}


async def run_pull(spec: dict) -> dict:
    """``concurrency`` consumers; consumer i reads queues i, i+concurrency, ... from offset 0 to their end."""
    channel = _channels(spec["target"], 1)[0]
    pull = channel.unary_unary(SERVICE + "Pull", request_serializer=commitlog_pb2.PullRequest.SerializeToString,
                               response_deserializer=commitlog_pb2.PullResponse.FromString)
    deadline = time.monotonic() + spec["timeout_s"]
    totals = {"messages": 0, "calls": 0, "bytes": 0}
    latencies: list[float] = []

    async def consumer(queues: list[int]) -> None:
        for queue_id in queues:
            offset, end = 0, spec["queue_ends"][queue_id]
            while offset < end and totals["calls"] < spec["max_calls"] and time.monotonic() < deadline:
                started = time.perf_counter()
                response = await pull(commitlog_pb2.PullRequest(
                    topic=spec["topic"], queue_id=queue_id, offset=offset, max_messages=spec["max_messages"],
                    max_bytes=spec["max_bytes"]), timeout=RPC_TIMEOUT_S)
                latencies.append((time.perf_counter() - started) * 1000.0)
                if not response.messages:
                    raise LoadError(f"pull: queue {queue_id} offset {offset} < end {end} returned nothing")
                totals["calls"] += 1
                totals["messages"] += len(response.messages)
                totals["bytes"] += sum(len(m.body) for m in response.messages)
                offset = response.next_offset

    try:
        await _ready([channel], 10.0)
        n = spec["concurrency"]
        started = time.perf_counter()
        await asyncio.gather(*(consumer(spec["queues"][i::n]) for i in range(n)))
        elapsed = time.perf_counter() - started
    finally:
        await channel.close()
    return {**totals, "elapsed_s": elapsed, "latencies_ms": latencies}


def count_records(records: bytes) -> int:
    """Walk whole records back to back by their TOTALSIZE field."""
    position, count, end = 0, 0, len(records)
    unpack = TOTALSIZE.unpack_from
    while position < end:
        size = unpack(records, position)[0]
        if size <= 0:
            raise LoadError(f"tail: record at frame position {position} has TOTALSIZE {size}")
        position += size
        count += 1
    if position != end:
        raise LoadError(f"tail: frame of {end} bytes ends inside a record (walked to {position})")
    return count


async def run_tail(spec: dict) -> dict:
    """One Tail stream from the earliest record; stops after ``expected_records`` (or the deadline)."""
    channel = _channels(spec["target"], 1)[0]
    tail = channel.unary_stream(SERVICE + "Tail", request_serializer=commitlog_pb2.TailRequest.SerializeToString,
                                response_deserializer=commitlog_pb2.TailFrame.FromString)
    totals = {"records": 0, "bytes": 0, "frames": 0, "declared_records": 0}
    try:
        await _ready([channel], 10.0)
        request = commitlog_pb2.TailRequest(start=commitlog_pb2.TAIL_START_EARLIEST,
                                            max_frame_bytes=spec["max_frame_bytes"], heartbeat_ms=100)
        started = time.perf_counter()
        call = tail(request, timeout=spec["timeout_s"])
        try:
            async for frame in call:
                totals["frames"] += 1
                totals["records"] += count_records(frame.records)
                totals["declared_records"] += frame.record_count
                totals["bytes"] += len(frame.records)
                if totals["records"] >= spec["expected_records"] or totals["frames"] >= spec["max_frames"]:
                    break
        finally:
            call.cancel()
        elapsed = time.perf_counter() - started
    finally:
        await channel.close()
    return {**totals, "elapsed_s": elapsed}


async def _windowed(spec: dict, make_call, one_call) -> dict:
    """A closed loop of ``concurrency`` tasks doing ``one_call(call, i)`` (it returns the messages it
    counted) until the window ends; what completes inside the window is counted, with its latency."""
    channels = _channels(spec["target"], max(1, min(spec["concurrency"], spec.get("channels", 4))))
    try:
        await _ready(channels, 10.0)
        calls = [make_call(ch) for ch in channels]
        t0 = time.time() + spec["warmup_s"]
        window, outcome = Window(t0, t0 + spec["duration_s"]), Outcome()
        cpu0, wall0 = time.process_time(), time.perf_counter()

        async def task(i: int) -> None:
            call = calls[i % len(calls)]
            for _ in range(spec["max_calls"]):
                if time.time() >= window.t1:
                    return
                started = time.perf_counter()
                try:
                    messages = await one_call(call, i)
                except grpc.aio.AioRpcError as exc:
                    outcome.error(exc)
                    await asyncio.sleep(0.01)  # do not spin on a failing server
                    continue
                window.record(time.time(), time.perf_counter() - started, messages)

        await asyncio.gather(*(task(i) for i in range(spec["concurrency"])))
    finally:
        for ch in channels:
            await ch.close()
    return {"calls": window.calls, "messages": window.messages, "window_s": spec["duration_s"],
            "client_cores": (time.process_time() - cpu0) / (time.perf_counter() - wall0),
            "latencies_ms": window.latencies_ms, "errors": outcome.errors, "first_error": outcome.first_error,
            "durability": {}, "checked_responses": 0}


async def run_call(spec: dict) -> dict:
    """call: the same unary ``method`` again and again; task i sends ``requests_hex[i % n]``."""
    requests = [bytes.fromhex(r) for r in spec["requests_hex"]]

    async def one(call, i: int) -> int:
        await call(requests[i % len(requests)], timeout=RPC_TIMEOUT_S)
        return spec.get("per_call", 1)
    return await _windowed(spec, lambda ch: ch.unary_unary(SERVICE + spec["method"]), one)


async def run_tails(spec: dict) -> dict:
    """tails: each task opens a Tail from the earliest record, reads ``expected_records`` records and
    cancels it, then the next; a call is one such stream, its messages the records read."""
    request = commitlog_pb2.TailRequest(start=commitlog_pb2.TAIL_START_EARLIEST,
                                        max_frame_bytes=spec["max_frame_bytes"], heartbeat_ms=100)

    async def one(tail, _i: int) -> int:
        records = 0
        call = tail(request, timeout=RPC_TIMEOUT_S)
        try:
            async for frame in call:
                records += frame.record_count
                if records >= spec["expected_records"]:
                    return records
        finally:
            call.cancel()
        raise LoadError(f"tails: the stream ended after {records} of {spec['expected_records']} records")
    return await _windowed(spec, lambda ch: ch.unary_stream(
        SERVICE + "Tail", request_serializer=commitlog_pb2.TailRequest.SerializeToString, response_deserializer=
                                                              commitlog_pb2.TailFrame.FromString), one)


RUNNERS = {"unary": run_append, "stream": run_append, "fill": run_fill, "pull": run_pull, "tail": run_tail,
           "call": run_call, "tails": run_tails}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        result = asyncio.run(RUNNERS[spec["kind"]](spec))
    except (LoadError, grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
        print(f"loadgen {spec['kind']}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
