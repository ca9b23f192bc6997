"""``mqstore compact status`` and ``mqstore kv get|scan`` as subprocesses against a real CommitLog server and
a real Compactor server (in this process, 127.0.0.1, port 0); and what the command line says when an
address points at the wrong service (UNIMPLEMENTED)."""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys

import grpc
import pytest
from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from compactor_service.main import CompactorServiceConfig, serving
from mqstore.compaction.policy import CompactionConfig
from mqstore.config import StoreConfig
from mqstore.follow import FollowConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
T = 10             # RPC timeout, s
CLI_TIMEOUT_S = 60


@dataclasses.dataclass
class Servers:
    log_address: str
    compactor_address: str


@pytest.fixture
def servers(tmp_path):
    log_config = CommitLogConfig(store=StoreConfig(data_dir=tmp_path / "log", segment_size_bytes=64 * 1024,
                                                   preallocate_segments=False),
                                 server=ServerConfig(port=0, grace_s=1.0))
    with commitlog_serving(log_config) as (_, log_port):
        config = CompactorServiceConfig(
            data_dir=tmp_path / "compactor", server=ServerConfig(port=0, grace_s=1.0),
            commitlog_address=f"127.0.0.1:{log_port}", checkpoint_interval_ms=50,
            compaction=CompactionConfig(segment_size_bytes=8192, round_interval_ms=3_600_000),
            follow=FollowConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))
        with serving(config) as (_, port):
            yield Servers(f"127.0.0.1:{log_port}", f"127.0.0.1:{port}")


def cli(servers: Servers, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """The mqstore command line as a process (in-process, it would configure logging on pytest's streams)."""
    done = subprocess.run([sys.executable, "-m", "mqstore_cli", "--address", servers.log_address,
                           "--compactor-address", servers.compactor_address, *args],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == expect, f"mqstore {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done


def write_kv(servers: Servers, writes: list[tuple[str, bytes]], wait: bool = True) -> None:
    with grpc.insecure_channel(servers.log_address) as channel:
        log = commitlog_pb2_grpc.CommitLogStub(channel)
        log.CreateTopic(clpb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        log.Append(clpb.AppendRequest(topic="kv", messages=[common_pb2.MessageInput(body=v, keys=[k])
                                                            for k, v in writes]), timeout=T)
    if not wait:
        return
    with grpc.insecure_channel(servers.compactor_address) as channel:
        compactor = compactor_pb2_grpc.CompactorStub(channel)

        def applied() -> bool:
            try:
                return compactor.DescribeQueue(pb.DescribeQueueRequest(topic="kv", queue_id=0),
                                               timeout=T).max_offset == len(writes)
            except grpc.RpcError:
                return False
        wait_until(applied, "the compactor to apply every record")


def test_kv_get_on_a_topic_the_compactor_does_not_have_is_not_found_like_kv_scan(servers):
    write_kv(servers, [("a", b"1")])
    scan = cli(servers, "kv", "scan", "nope", expect=1)
    get = cli(servers, "kv", "get", "nope", "a", "b", expect=1)
    assert scan.stderr.startswith("error: NOT_FOUND: topic 'nope' has no compaction log")
    assert get.stderr == scan.stderr and get.stdout == ""
    assert cli(servers, "kv", "get", "kv", "a", "zz").stdout.splitlines() == ["a: 1  queue=0  offset=0",
                                                                               "zz: (no value)"]


def test_compact_status_prints_a_line_per_field_and_the_last_round_as_one_sentence(servers):
    write_kv(servers, [("a", b"1"), ("a", b"2"), ("b", b"3")])
    before = cli(servers, "compact", "status", "kv").stdout
    assert "  last_round: none yet\n" in before and "  cleaned_up_to_offset: -1 (no round yet)\n" in before
    assert "queue 0: ok" in cli(servers, "compact", "run", "kv", "--seal-active", "--engine", "local").stdout
    lines = cli(servers, "compact", "status", "kv").stdout.splitlines()
    assert lines[0] == "kv queue 0:"
    for line in lines[1:]:  # raw protobuf text printed a nested message over several unindented lines
        assert re.fullmatch(r"  [a-z_]+: \S.*", line), lines
    fields = dict(line.strip().split(": ", 1) for line in lines[1:])
    assert fields["dirty_bytes"] == "0" and fields["records"] == "2" and fields["keys"] == "2"
    assert fields["quarantined"] == "no" and fields["round_running"] == "no"
    assert re.fullmatch(r"ok at 20\d\d-\d\d-\d\dT[\d:.]+\+00:00, took \d+ ms \(engine local, trigger \S.*, "
                        r"1 pass, 2 keys mapped, 1 record and 0 tombstones removed, \d+ bytes reclaimed\)",
                        fields["last_round"]), fields["last_round"]


def test_compact_run_with_catch_up_right_after_a_send_covers_it(servers):
    write_kv(servers, [("a", b"1"), ("a", b"2"), ("b", b"3")], wait=False)
    assert "queue 0: ok" in cli(servers, "compact", "run", "kv", "--seal-active", "--engine", "local",
                                "--catch-up").stdout
    assert cli(servers, "kv", "get", "kv", "a", "b").stdout.splitlines() == ["a: 2  queue=0  offset=1",
                                                                              "b: 3  queue=0  offset=2"]


def test_compact_run_names_the_queue_the_compactor_has_not_applied(servers, tmp_path):
    other = CommitLogConfig(store=StoreConfig(data_dir=tmp_path / "other", segment_size_bytes=64 * 1024,
                                              preallocate_segments=False), server=ServerConfig(port=0, grace_s=1.0))
    with commitlog_serving(other) as (_, port):  # a log the compactor does not follow
        elsewhere = Servers(f"127.0.0.1:{port}", servers.compactor_address)
        write_kv(elsewhere, [("a", b"1"), ("b", b"2")], wait=False)
        done = cli(elsewhere, "--timeout", "2", "compact", "run", "kv", "--catch-up", expect=1)
    assert done.stderr.startswith(f"error: DEADLINE_EXCEEDED: the compactor at {servers.compactor_address} has "
                                  f"applied queue 0 of kv up to offset 0 of 2 after 2 s; is it following the "
                                  f"commit log at {elsewhere.log_address}?"), done.stderr


def test_an_address_of_the_wrong_service_is_named_with_what_it_serves(servers):
    wrong = cli(servers, "--address", servers.compactor_address, "topic", "list", expect=1)
    assert wrong.stderr.strip() == (f"error: UNIMPLEMENTED: the server at {servers.compactor_address} serves "
                                    f"mqstore.v1.Compactor, not mqstore.v1.CommitLog; is --address right?")
    wrong = cli(servers, "kv", "scan", "kv", "--compactor-address", servers.log_address, expect=1)
    assert wrong.stderr.startswith(f"error: UNIMPLEMENTED: the server at {servers.log_address} serves "
                                   f"mqstore.v1.Access, mqstore.v1.CommitLog")  # sorted: the Access service too
    assert wrong.stderr.strip().endswith("not mqstore.v1.Compactor; is --compactor-address right?")


def test_several_compactor_addresses_the_dead_one_first_are_answered_by_the_next(servers):
    """--compactor-address a,b (the compactors of an HA deployment): a call ending UNAVAILABLE goes to the next
    (kv get, kv scan's stream, compact status and run)."""
    write_kv(servers, [("a", b"1"), ("a", b"2"), ("b", b"3")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connection refused
        both = Servers(servers.log_address, f"{dead},{servers.compactor_address}")
        assert cli(both, "kv", "get", "kv", "a").stdout.splitlines() == ["a: 2  queue=0  offset=1"]
        assert cli(both, "kv", "scan", "kv").stdout.splitlines() == ["a: 2  queue=0  offset=1",
                                                                     "b: 3  queue=0  offset=2"]
        assert "queue 0: ok" in cli(both, "compact", "run", "kv", "--seal-active", "--engine", "local").stdout
        assert cli(both, "compact", "status", "kv").stdout.startswith("kv queue 0:")
