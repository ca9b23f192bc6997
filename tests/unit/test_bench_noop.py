"""bench/noop_server.py's loop flavour, the append group's comparison point: the same kind of server as the CommitLog
port (its Append a coroutine answered on the port's loop, not a synchronous handler handed to the pool and back),
served by mqstore_rpc.server; and bench/report.py's rows against it and against the kind before (noop-pool)."""

from __future__ import annotations

import inspect
import pathlib
import sys

import grpc
from commitlog_service.servicer import CommitLogServicer
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ServerConfig, create_server

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import append  # noqa: E402 - bench/ is a folder of scripts, not a package
import noop_server  # noqa: E402
import procs  # noqa: E402
import report  # noqa: E402


def test_the_loop_noop_answers_each_append_method_where_the_commitlog_does():
    # A coroutine handler runs on the port's loop (mqstore_rpc.aio.on_loop); a synchronous one in the handler pool.
    for name in ("Append", "AppendStream", "GetStoreInfo"):
        ours = inspect.iscoroutinefunction(getattr(CommitLogServicer, name))
        assert inspect.iscoroutinefunction(getattr(noop_server.LoopNoopCommitLog, name)) == ours, name
    # The kind before: Append in the pool (what its figures measured)
    assert not inspect.iscoroutinefunction(noop_server.NoopCommitLog.Append)
    assert inspect.iscoroutinefunction(CommitLogServicer.Append)


def test_the_loop_noop_served_answers_one_result_per_message():
    server = create_server(ServerConfig(host="127.0.0.1", port=0))
    try:
        commitlog_pb2_grpc.add_CommitLogServicer_to_server(noop_server.LoopNoopCommitLog(), server.grpc_server)
        server.start()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            request = commitlog_pb2.AppendRequest(topic="bench", messages=[common_pb2.MessageInput(body=b"x")] * 3)
            response = stub.Append(request, timeout=10)
            info = stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10)
        assert len(response.results) == 3 and info.flush_mode == "NOOP"
    finally:
        server.stop(0)


def test_the_append_group_starts_the_loop_noop_as_its_comparison_point(tmp_path):
    assert procs.GrpcServer.noop(tmp_path, flavour="loop").args[-2:] == ["--flavour", "loop"]
    assert "--flavour" not in procs.GrpcServer.noop(tmp_path).args  # the read group's: the default, unchanged
    assert "loop" in noop_server.FLAVOURS


def _run(mode: str, rate: float, cores: float, shape: str = "unary-100", producers: int = 16) -> dict:
    return {"mode": mode, "shape": shape, "producers": producers, "msgs_per_s": rate, "server_cores": cores,
            "p50_ms": 1.0, "p99_ms": 2.0, "errors": {}}


def test_report_compares_with_the_loop_noop_and_shows_the_pool_noop_beside_it_without_a_target():
    runs = [_run("noop", 200_000, 1.0), _run(append.NOOP_POOL, 150_000, 1.0), _run("ASYNC", 160_000, 1.0),
            _run("noop", 8_000, 1.0, "unary-1", 1), _run("ASYNC", 6_000, 1.0, "unary-1", 1)]
    rows = report.append_rows({"runs": runs, "redis": []})
    main = [r for r in rows if r["section"] == "append"]
    assert [(r["workload"].split(",")[:2], r["ratio"]) for r in main] == [
        (["Append", " 100 msgs/call"], 0.8), (["Append", " 1 msg/call"], 0.75)]
    pool = [r for r in rows if r["section"] == "noop-pool"]
    assert len(pool) == 1 and round(pool[0]["ratio"], 3) == round(160_000 / 150_000, 3) and pool[0]["target"] is None
    targets = report.target_rows(rows, {})
    batched = [r for r in targets if r["workload"].startswith("Append, 100 msgs/call, 16 producers, ASYNC")]
    assert len(batched) == 1 and batched[0]["comparison_figure"] == 200_000
