"""The Index service through real gRPC on 127.0.0.1 (port 0): a real CommitLog server and a real Index
server in this process, real files in tmp_path, tiny index files so that files roll, get converted to
the compact layout and move to the second tier while the tests run."""

from __future__ import annotations

import dataclasses
import pathlib
import threading
import time

import grpc
import pytest
from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig
from mqstore.index.tier import IndexTierConfig, dir_url
from index_service.main import IndexServiceConfig, serving
from mqstore.javahash import java_string_hash
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import (
    commitlog_pb2_grpc,
    common_pb2,
    index_pb2,
    index_pb2_grpc,
)
from mqstore_rpc.server import ServerConfig
from tests.support.s3 import moto_s3

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 10
WAIT_S = 30
POLL_S = 0.02


def index_config(data_dir: pathlib.Path, commitlog_port: int, **index_overrides) -> IndexServiceConfig:
    values = dict(slot_count=16, entry_count=64, max_keys_per_message=8, maintenance_interval_ms=50,
                  maintenance_retry_ms=50, checkpoint_interval_ms=100)
    values.update(index_overrides)
    (data_dir / "tier").mkdir(parents=True, exist_ok=True)
    return IndexServiceConfig(
        index=IndexConfig(data_dir, **values), server=ServerConfig(port=0, grace_s=1.0),
        commitlog_address=f"127.0.0.1:{commitlog_port}", tier=IndexTierConfig(tier_url=dir_url(data_dir / "tier")),
        follower=FollowerConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200,
                                retention_interval_ms=200, rebuild_interval_ms=100))


@dataclasses.dataclass
class Services:
    log: commitlog_pb2_grpc.CommitLogStub
    index: index_pb2_grpc.IndexStub
    config: IndexServiceConfig


@pytest.fixture
def tier_kind(request):
    """The second tier: a file:// directory unless a test asks for s3 (moto's server on 127.0.0.1)."""
    return getattr(request, "param", "file")


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture
def services(request, tmp_path, commitlog_port, tier_kind):
    config = index_config(tmp_path / "index", commitlog_port)
    if tier_kind == "s3":
        s3 = request.getfixturevalue("s3")
        tier = IndexTierConfig(tier_url=f"s3://{s3.bucket()}/idx").with_env(s3.env())
        config = dataclasses.replace(config, tier=tier)
    with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as index_channel:
        yield Services(commitlog_pb2_grpc.CommitLogStub(log_channel), index_pb2_grpc.IndexStub(index_channel),
                       config)


def append(stub, topic: str, messages) -> list[pb.AppendResult]:
    return list(stub.Append(pb.AppendRequest(topic=topic, messages=messages), timeout=RPC_TIMEOUT_S).results)


def stats(index) -> index_pb2.IndexStats:
    return index.Stats(index_pb2.IndexStatsRequest(), timeout=RPC_TIMEOUT_S)


def wait_until(condition, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        pause.wait(POLL_S)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_indexed(s: Services) -> index_pb2.IndexStats:
    end = s.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).visible_physical_offset
    return wait_until(lambda: (st := stats(s.index)).indexed_physical_offset >= end and st, f"index to reach {end}")


def query(index, topic: str, key: str, **fields) -> index_pb2.QueryByKeyResponse:
    return index.QueryByKey(index_pb2.QueryByKeyRequest(topic=topic, key=key, **fields), timeout=RPC_TIMEOUT_S)


def query_all(index, topic: str, key: str, page_size: int, **fields) -> list[index_pb2.MessageLocator]:
    found, token = [], ""
    for _ in range(1000):
        page = query(index, topic, key, max_num=page_size, page_token=token, **fields)
        assert len(page.locators) <= page_size
        found += page.locators
        token = page.next_page_token
        if not token:
            return found
    raise AssertionError("more than 1000 pages")


def keyed(i: int, *keys: str) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=b"body-%d" % i, keys=list(keys))


@pytest.mark.parametrize("tier_kind", ["file", "s3"], indirect=True)
def test_query_by_key_newest_first_with_pages_and_messages(services, tier_kind):
    s = services
    s.log.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=2), timeout=RPC_TIMEOUT_S)
    results = []
    for batch in range(6):  # 6 x 25 messages x 3 keys: 450 entries in files of 63: rolls and conversions
        results += append(s.log, "orders", [keyed(batch * 25 + i, f"k{(batch * 25 + i) % 3}", "all")
                                             for i in range(25)])
    wait_indexed(s)
    newest_first = [r.physical_offset for r in reversed(results)]
    everything = query_all(s.index, "orders", "all", page_size=7)
    assert [loc.physical_offset for loc in everything] == newest_first
    k1 = query_all(s.index, "orders", "k1", page_size=11)
    assert [loc.physical_offset for loc in k1] == [r.physical_offset for i, r in reversed(list(enumerate(results)))
                                                   if i % 3 == 1]
    page = query(s.index, "orders", "k2", max_num=4, include_messages=True)
    assert [m.body for m in page.messages] == [b"body-%d" % i for i in (149, 146, 143, 140)]
    assert [loc.uniq_key for loc in page.locators] == [m.uniq_key for m in page.messages]
    by_offset = {r.physical_offset: r for r in results}
    for loc in page.locators:
        r = by_offset[loc.physical_offset]
        assert (loc.msg_id, loc.queue_id, loc.queue_offset, loc.store_timestamp_ms) == (
            r.msg_id, r.queue_id, r.queue_offset, r.store_timestamp_ms)
    assert page.files_searched >= 1 and page.next_page_token
    st = wait_until(lambda: (x := stats(s.index)).unsealed_files == 1 and x.tiered_files > 0 and x,
                    "sealed files to be converted and moved to the tier")
    assert st.entries == 3 * len(results) and st.records_indexed == len(results) and st.healthy
    after = query_all(s.index, "orders", "all", page_size=50)  # compact files on the tier now
    assert [loc.physical_offset for loc in after] == newest_first
    assert stats(s.index).max_reads_per_file <= 2


def test_health_serving_for_the_service_and_overall(tmp_path, commitlog_port):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with serving(index_config(tmp_path / "index", commitlog_port)) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "mqstore.v1.Index"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_port_is_a_grpc_aio_server_answering_its_synchronous_handlers_in_the_pool(tmp_path, commitlog_port):
    """One concurrency model (mqstore_rpc.aio): the Index port is grpc.aio like every other; its servicer's
    synchronous methods are answered through the handler pool."""
    with serving(index_config(tmp_path / "index", commitlog_port)) as (server, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert isinstance(server.grpc_server, grpc.aio.Server)
        with pytest.raises(grpc.RpcError) as info:
            index_pb2_grpc.IndexStub(channel).QueryByUniqKey(
                index_pb2.QueryByUniqKeyRequest(topic="none", uniq_key="k"), timeout=RPC_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert server.pool.counts()["threads"] >= 1  # the call ran on a thread of the pool


def test_query_by_uniq_key_and_not_found(services):
    s = services
    s.log.CreateTopic(pb.CreateTopicRequest(name="ids", queue_count=1), timeout=RPC_TIMEOUT_S)
    results = append(s.log, "ids", [keyed(i) for i in range(30)])
    wait_indexed(s)
    target = results[17]
    page = s.index.QueryByUniqKey(index_pb2.QueryByUniqKeyRequest(topic="ids", uniq_key=target.uniq_key,
                                                                  include_messages=True), timeout=RPC_TIMEOUT_S)
    assert [loc.physical_offset for loc in page.locators] == [target.physical_offset]
    assert page.messages[0].body == b"body-17"
    with pytest.raises(grpc.RpcError) as missing:
        s.index.QueryByUniqKey(index_pb2.QueryByUniqKeyRequest(topic="ids", uniq_key="0" * 32), timeout=RPC_TIMEOUT_S)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as other_topic:
        s.index.QueryByUniqKey(index_pb2.QueryByUniqKeyRequest(topic="nope", uniq_key=target.uniq_key),
                               timeout=RPC_TIMEOUT_S)
    assert other_topic.value.code() == grpc.StatusCode.NOT_FOUND


def test_query_by_time_and_time_ranges(services):
    s = services
    s.log.CreateTopic(pb.CreateTopicRequest(name="timed", queue_count=1), timeout=RPC_TIMEOUT_S)
    results = []
    for i in range(40):  # one call each, so store times spread over several milliseconds
        results += append(s.log, "timed", [keyed(i, "k")])
    wait_indexed(s)
    for r in results[::7]:
        first = s.index.QueryByTime(index_pb2.QueryByTimeRequest(topic="timed", queue_id=0,
                                                                 timestamp_ms=r.store_timestamp_ms),
                                    timeout=RPC_TIMEOUT_S).offset
        assert first == min(x.queue_offset for x in results if x.store_timestamp_ms >= r.store_timestamp_ms)
    begin, end = results[10].store_timestamp_ms, results[30].store_timestamp_ms
    found = query_all(s.index, "timed", "k", page_size=6, begin_ms=begin, end_ms=end)
    expected = [r.physical_offset for r in reversed(results) if begin <= r.store_timestamp_ms <= end]
    assert [loc.physical_offset for loc in found] == expected
    assert all(begin <= loc.store_timestamp_ms <= end for loc in found)


def colliding_keys() -> tuple[str, str]:
    """"Aa" and "BB" have the same Java hashCode, so "t#Aa" and "t#BB" share an index hash."""
    assert java_string_hash("c#Aa") == java_string_hash("c#BB")
    return "Aa", "BB"


def test_hash_collisions_are_removed_counted_and_pages_refilled(services):
    s = services
    a, b = colliding_keys()
    s.log.CreateTopic(pb.CreateTopicRequest(name="c", queue_count=1), timeout=RPC_TIMEOUT_S)
    results = append(s.log, "c", [keyed(i, a if i % 3 == 0 else b) for i in range(12)])
    wait_indexed(s)
    a_offsets = [r.physical_offset for i, r in reversed(list(enumerate(results))) if i % 3 == 0]
    everything = query(s.index, "c", a, max_num=100)
    assert [loc.physical_offset for loc in everything.locators] == a_offsets
    assert everything.collisions_removed == 8 and not everything.next_page_token
    page = query(s.index, "c", a, max_num=2)  # collisions in between: the page is refilled to 2
    assert [loc.physical_offset for loc in page.locators] == a_offsets[:2] and page.next_page_token
    rest = query_all(s.index, "c", a, page_size=2)
    assert [loc.physical_offset for loc in rest] == a_offsets
    assert len(query(s.index, "c", b, max_num=100).locators) == 8


def test_bad_requests_and_clamped_max_num(services):
    s = services
    s.log.CreateTopic(pb.CreateTopicRequest(name="b", queue_count=1), timeout=RPC_TIMEOUT_S)
    append(s.log, "b", [keyed(i, "k") for i in range(3)])
    wait_indexed(s)
    assert len(query(s.index, "b", "k", max_num=2_000_000_000).locators) == 3  # clamped, not allocated
    for fields in (dict(key=""), dict(max_num=-1), dict(begin_ms=5, end_ms=4), dict(page_token="garbage"),
                   dict(page_token=query(s.index, "b", "k", max_num=1).next_page_token, begin_ms=1)):
        request = dict(topic="b", key="k") | fields
        with pytest.raises(grpc.RpcError) as bad:
            s.index.QueryByKey(index_pb2.QueryByKeyRequest(**request), timeout=RPC_TIMEOUT_S)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
    assert query(s.index, "b", "missing").locators == []


def _wait_for_wall_clock(ms: int) -> None:
    """The index keeps store times in whole seconds: let the wall clock pass ``ms`` (bounded)."""
    pause = threading.Event()
    for _ in range(200):
        if time.time() * 1000 >= ms:
            return
        pause.wait(0.02)
    raise AssertionError("the wall clock did not advance")


def test_damaged_file_is_rebuilt_while_other_ranges_answer(tmp_path, commitlog_port, failpoint):
    config = index_config(tmp_path / "index", commitlog_port, tier_min_age_ms=10**12)  # no tier moves
    with grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as channel:
        log = commitlog_pb2_grpc.CommitLogStub(channel)
        log.CreateTopic(pb.CreateTopicRequest(name="r", queue_count=1), timeout=RPC_TIMEOUT_S)
        old = append(log, "r", [keyed(i, f"old{i}", "all") for i in range(60)])
        with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as ich:
            s = Services(log, index_pb2_grpc.IndexStub(ich), config)
            wait_indexed(s)
            wait_until(lambda: stats(s.index).unsealed_files == 1, "sealed files to be converted")
            _wait_for_wall_clock(old[-1].store_timestamp_ms + 2_000)
            new = append(log, "r", [keyed(i, f"new{i}", "all") for i in range(5)])
            wait_indexed(s)
        files = sorted((tmp_path / "index" / "index").glob("*.cidx"))
        with open(files[1], "r+b") as damaged:  # overwrite its header: not a compact file any more
            damaged.write(b"\xff" * 64)
        with failpoint.armed("index.rebuild.after_rename"):  # the rebuild cannot finish yet
            with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as ich:
                s = Services(log, index_pb2_grpc.IndexStub(ich), config)
                assert stats(s.index).rebuilding_ranges
                wait_indexed(s)
                with pytest.raises(grpc.RpcError) as partial:
                    query(s.index, "r", "all")
                assert partial.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "rebuilt" in partial.value.details()
                recent = query(s.index, "r", "all", begin_ms=new[0].store_timestamp_ms)
                assert [loc.physical_offset for loc in recent.locators] == [r.physical_offset for r in reversed(new)]
                wait_until(lambda: "after_rename" in stats(s.index).last_error, "the rebuild to fail at the failpoint")
                failpoint.disarm()
                st = wait_until(lambda: not (x := stats(s.index)).rebuilding_ranges and x.healthy and x,
                                "the rebuild to finish")
                everything = query_all(s.index, "r", "all", page_size=25)
                assert [loc.physical_offset for loc in everything] == [r.physical_offset for r in reversed(old + new)]
                assert st.entries == 3 * len(old + new)  # UNIQ_KEY, its own key, "all"
                for i in (0, 17, 59):
                    assert [loc.physical_offset for loc in query(s.index, "r", f"old{i}").locators] == [
                        old[i].physical_offset]


def test_stats_after_a_restart_does_not_claim_caught_up_before_it_has_seen_the_log(tmp_path, commitlog_port):
    config = index_config(tmp_path / "index", commitlog_port)
    with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        s = Services(commitlog_pb2_grpc.CommitLogStub(log_channel), index_pb2_grpc.IndexStub(channel), config)
        s.log.CreateTopic(pb.CreateTopicRequest(name="T", queue_count=1), timeout=RPC_TIMEOUT_S)
        append(s.log, "T", [keyed(i, f"k{i}") for i in range(3)])
        caught_up = wait_until(lambda: (st := wait_indexed(s)).HasField("bytes_behind") and st.bytes_behind == 0
                               and st, "the index to be caught up")
        assert caught_up.connected and caught_up.log_end_physical_offset > 0
    # Restarted while the commit log cannot be reached (a port nothing listens on): it knows its checkpoint only.
    with serving(dataclasses.replace(config, commitlog_address="127.0.0.1:1")) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        away = stats(index_pb2_grpc.IndexStub(channel))
        assert not away.connected and away.indexed_physical_offset > 0
        assert not away.HasField("log_end_physical_offset") and not away.HasField("bytes_behind")
    with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        index = index_pb2_grpc.IndexStub(channel)
        back = wait_until(lambda: (st := stats(index)).HasField("bytes_behind") and st, "the follower's first frame")
        assert back.log_end_physical_offset >= caught_up.log_end_physical_offset
