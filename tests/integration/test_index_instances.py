"""Two Index instances following one commit log (issue 34, item 3): a client given both
(``host:port,host:port``: mqstore_rpc.endpoints.Failover, the ``mqstore`` CLI's ``--index-address``) keeps
getting answers when one is killed with kill -9 while queries run, page tokens included.

Processes on 127.0.0.1 (the commit log, two Index instances, each its own data dir and its own file sizes,
so their files roll at different records), the CLI as a subprocess."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import threading

import grpc
import pytest
from mqstore_cli.index import _portable
from mqstore_rpc.endpoints import Failover
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, index_pb2, index_pb2_grpc

from tests.crash.test_index_crash import crash, start_index, start_log
from tests.support.processes import ServiceProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

MQSTORE = pathlib.Path(sys.executable).with_name("mqstore")
TOPIC = "ha"
KEYS = 4
PER_KEY = 12
RPC_TIMEOUT_S = 10
WAIT_S = 120
CLI_TIMEOUT_S = 60
AFTER_KILL = 20          # answers the survivor must give after the kill


def _start_index(data_dir, log_address: str, *flags: str) -> ServiceProcess:
    """As test_index_crash.start_index, with ``flags`` after its own (the last of a flag wins)."""
    args = ["--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", "--commitlog", log_address,
            "--slot-count", "64", "--checkpoint-interval-ms", "50", "--heartbeat-ms", "50", *flags]
    return ServiceProcess("index_service.main", args).started()


@pytest.fixture
def instances(tmp_path):
    """(commit log address, [index A, index B]) with TOPIC's messages indexed by both."""
    with start_log(tmp_path / "log") as log:
        with grpc.insecure_channel(log.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=RPC_TIMEOUT_S)
            for i in range(PER_KEY):
                stub.Append(pb.AppendRequest(topic=TOPIC, messages=[
                    common_pb2.MessageInput(body=b"m%d-%d" % (i, k), keys=[f"k-{k}"]) for k in range(KEYS)]),
                    timeout=RPC_TIMEOUT_S)
            end = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).visible_physical_offset
        # A rolls a file every 3000 entries, B every 10: A's page tokens name a file B does not have.
        a = start_index(tmp_path / "index-a", log.address)
        with a, _start_index(tmp_path / "index-b", log.address, "--entry-count", "10",
                             "--max-keys-per-message", "2") as b:
            for index in (a, b):
                with grpc.insecure_channel(index.address) as channel:
                    stats = index_pb2_grpc.IndexStub(channel).Stats
                    wait_until(lambda stats=stats: stats(index_pb2.IndexStatsRequest(), timeout=RPC_TIMEOUT_S)
                               .indexed_physical_offset >= end, f"{index.address} indexed the log", WAIT_S)
            yield log.address, [a, b]


def _failover(addresses: str) -> Failover:
    return Failover(addresses, grpc.insecure_channel, index_pb2_grpc.IndexStub)


def test_queries_go_on_through_the_other_instance_after_a_kill_9(instances):
    _, (a, b) = instances
    answers, failures, stop = [], [], threading.Event()

    def query() -> None:
        with _failover(f"{a.address},{b.address}") as index:
            n = 0
            while not stop.is_set() and len(answers) < 100_000:
                n += 1
                try:
                    response = index.call("QueryByKey", index_pb2.QueryByKeyRequest(
                        topic=TOPIC, key=f"k-{n % KEYS}"), timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as exc:
                    failures.append(f"{exc.code()}: {exc.details()}")
                    continue
                answers.append(len(response.locators))

    thread = threading.Thread(target=query, name="test-index-queries")
    thread.start()
    try:
        wait_until(lambda: len(answers) >= 10 or failures, "queries answered before the kill", WAIT_S)
        crash(a)
        killed_at = len(answers)
        wait_until(lambda: len(answers) >= killed_at + AFTER_KILL or failures, "queries answered after the kill",
                   WAIT_S)
    finally:
        stop.set()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert failures == []
    assert set(answers) == {PER_KEY}  # every answer whole, before and after the kill

    # The CLI, given the dead instance first: answered by the other.
    run = subprocess.run([str(MQSTORE), "--index-address", f"{a.address},{b.address}", "--json",
                          "query", "key", TOPIC, "k-1"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count('"msg_id"') == PER_KEY


def test_a_page_token_continues_on_the_other_instance_with_nothing_skipped_or_repeated(instances):
    _, (a, b) = instances
    request = index_pb2.QueryByKeyRequest(topic=TOPIC, key="k-2", max_num=5)
    with _failover(f"{a.address},{b.address}") as index:
        first = index.call("QueryByKey", request, _portable, timeout=RPC_TIMEOUT_S)
        assert first.next_page_token
        crash(a)  # the instance that issued the token is gone
        seen = [loc.physical_offset for loc in first.locators]
        token = first.next_page_token
        for _ in range(PER_KEY):
            if not token:
                break
            request.page_token = token
            page = index.call("QueryByKey", request, _portable, timeout=RPC_TIMEOUT_S)
            seen += [loc.physical_offset for loc in page.locators]
            token = page.next_page_token
    with grpc.insecure_channel(b.address) as channel:
        whole = index_pb2_grpc.IndexStub(channel).QueryByKey(
            index_pb2.QueryByKeyRequest(topic=TOPIC, key="k-2", max_num=100), timeout=RPC_TIMEOUT_S)
    assert seen == [loc.physical_offset for loc in whole.locators]
    assert len(seen) == PER_KEY
