"""Prometheus metrics scraped over HTTP from real services while they work: the per-RPC figures, and
each service's own, move as the calls they count are made."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from commitlog_service.main import serving as commitlog_serving
from compactor_service.main import serving as compactor_serving
from index_service.main import IndexServiceConfig
from index_service.main import serving as index_serving
from mqstore.follow import FollowConfig
from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, compactor_pb2, compactor_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.test_compactor_service import compactor_config
from tests.integration.txn_testing import TOKEN, commit, prepare, txn_config, wait_ready
from tests.support.scrape import scrape
from tests.support.waiting import wait_until
from txn_service.main import serving as txn_serving

pytestmark = pytest.mark.integration
TIMEOUT_S = 10
METRICS = ServerConfig(port=0, grace_s=0.5, metrics_port=0)


def _with_metrics(config):
    return dataclasses.replace(config, server=dataclasses.replace(config.server, metrics_port=0))


@pytest.fixture
def log(tmp_path):
    config = dataclasses.replace(make_config(tmp_path / "log"), server=METRICS, internal_token=TOKEN)
    with commitlog_serving(config) as (server, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield server, port, commitlog_pb2_grpc.CommitLogStub(channel)


def _append(stub, topic: str, bodies: list[bytes], **fields) -> cpb.AppendResponse:
    messages = [common_pb2.MessageInput(body=b, **fields) for b in bodies]
    return stub.Append(cpb.AppendRequest(topic=topic, messages=messages), timeout=TIMEOUT_S)


def _rpc(scraped, method: str, code: str = "") -> float:
    labels = dict(grpc_service="mqstore.v1.CommitLog", grpc_method=method)
    if code:
        return scraped.value("grpc_server_handled_total", grpc_code=code, **labels)
    return scraped.value("grpc_server_started_total", **labels)


def test_per_rpc_and_commitlog_figures_move_with_the_calls(log):
    server, _, stub = log
    before = scrape(server.metrics_port)
    assert before.value("mqstore_commitlog_appended_messages_total") == 0
    assert _rpc(before, "Append") == 0

    stub.CreateTopic(cpb.CreateTopicRequest(name="m", queue_count=2), timeout=TIMEOUT_S)
    sizes = []
    for _ in range(2):
        response = _append(stub, "m", [b"x" * 100] * 5, queue_id=0)
        sizes += [r.size_bytes for r in response.results]
    with pytest.raises(grpc.RpcError) as missing:
        _append(stub, "nope", [b"y"])
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    stub.CommitOffset(cpb.CommitOffsetRequest(group="g1", topic="m", queue_id=0, offset=3), timeout=TIMEOUT_S)

    after = wait_until(lambda: (s := scrape(server.metrics_port)).value("mqstore_commitlog_flushes_total") > 0 and s,
                       "the flush service to flush the appends")
    assert _rpc(after, "Append") == 3
    assert _rpc(after, "Append", "OK") == 2
    assert _rpc(after, "Append", "NOT_FOUND") == 1
    assert after.value("grpc_server_handling_seconds_count", grpc_method="Append") == 3
    assert after.value("grpc_server_msg_received_total", grpc_method="Append") == 3
    # the CommitOffset is a record of RMQ_SYS_CONSUMER_OFFSETS (mqstore.consumer_offsets): one more of each
    assert after.value("mqstore_commitlog_appended_messages_total") == 10 + 1
    assert after.value("mqstore_commitlog_append_batches_total") == 2 + 1
    offsets_bytes = after.value("mqstore_commitlog_topic_bytes", topic="RMQ_SYS_CONSUMER_OFFSETS")
    assert after.value("mqstore_commitlog_appended_bytes_total") == sum(sizes) + offsets_bytes
    assert after.value("mqstore_commitlog_topic_bytes", topic="m") == sum(sizes)
    assert after.value("mqstore_commitlog_physical_offset", position="written") == sum(sizes) + offsets_bytes
    assert after.value("mqstore_consumer_lag_messages", group="g1", topic="m", queue_id="0") == 10 - 3
    assert after.value("mqstore_commitlog_flush_seconds_count") == after.value("mqstore_commitlog_flushes_total")
    assert after.value("mqstore_commitlog_read_only", reason="disk_full") == 0
    assert 0 < after.value("mqstore_commitlog_disk_used_ratio") < 1
    assert after.has("process_resident_memory_bytes")  # prometheus-client's process collector

    stub.CommitOffset(cpb.CommitOffsetRequest(group="g1", topic="m", queue_id=0, offset=10), timeout=TIMEOUT_S)
    stub.DeleteTopic(cpb.DeleteTopicRequest(name="m"), timeout=TIMEOUT_S)
    gone = scrape(server.metrics_port)
    assert not gone.has("mqstore_commitlog_topic_bytes", topic="m")
    assert not gone.has("mqstore_consumer_lag_messages", topic="m")


def test_sync_fsyncs_show_their_group_commit(tmp_path):
    # Under SYNC each fsync counts the appends it acknowledged, and the flush delay how its waits ended.
    # Appends one after another: each fsync acknowledges one, too few for a delay (an append that an
    # interval's flush happened to cover first is in no fsync's count).
    config = dataclasses.replace(make_config(tmp_path / "log", flush_mode="SYNC"), server=METRICS)
    with commitlog_serving(config) as (server, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(cpb.CreateTopicRequest(name="s", queue_count=1), timeout=TIMEOUT_S)
        for i in range(3):
            assert _append(stub, "s", [b"m%d" % i]).results[0].durability == common_pb2.DURABILITY_FLUSHED
        scraped = scrape(server.metrics_port)
    fsyncs = scraped.value("mqstore_commitlog_flush_appends_count")
    assert fsyncs in (2, 3) and scraped.value("mqstore_commitlog_flush_appends_sum") == fsyncs
    assert scraped.value("mqstore_commitlog_flush_appends_bucket", le="1.0") == fsyncs
    assert scraped.value("mqstore_commitlog_flush_delays_total", ended="joined") == 0
    assert scraped.value("mqstore_commitlog_flush_delays_total", ended="ran_out") == 0


def test_a_full_disk_shows_as_read_only_with_its_reason(tmp_path):
    config = dataclasses.replace(make_config(tmp_path / "log", disk_max_used_ratio=0.0001), server=METRICS)
    with commitlog_serving(config) as (server, _):
        scraped = scrape(server.metrics_port)
        assert scraped.value("mqstore_commitlog_read_only", reason="disk_full") == 1
        assert scraped.value("mqstore_commitlog_read_only", reason="allocation_failed") == 0


def test_index_build_lag_and_follower_figures(tmp_path, log):
    _, log_port, stub = log
    stub.CreateTopic(cpb.CreateTopicRequest(name="k", queue_count=1), timeout=TIMEOUT_S)
    config = IndexServiceConfig(
        index=IndexConfig(tmp_path / "index", slot_count=16, entry_count=64, max_keys_per_message=8), server=METRICS,
        commitlog_address=f"127.0.0.1:{log_port}",
        follower=FollowerConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))
    with index_serving(config) as (server, _):
        _append(stub, "k", [b"v%d" % i for i in range(7)], keys=["key"])
        indexed = wait_until(lambda: (s := scrape(server.metrics_port)).value(
            "mqstore_index_records_indexed_total") == 7 and s, "the index to index the 7 records")
        follower = "index-follower"
        assert indexed.value("mqstore_follower_connected", follower=follower) == 1
        caught_up = wait_until(lambda: (s := scrape(server.metrics_port)).has(  # absent before the first frame
            "mqstore_follower_lag_bytes", follower=follower) and s.value(
            "mqstore_follower_lag_bytes", follower=follower) == 0 and s, "the index to catch up")
        assert caught_up.value("mqstore_follower_lag_seconds", follower=follower) == 0
        assert caught_up.value("grpc_server_started_total", grpc_service="mqstore.v1.Index") == 0


def test_transaction_figures(tmp_path, log):
    _, log_port, stub = log
    stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=1), timeout=TIMEOUT_S)
    config = _with_metrics(txn_config(tmp_path / "txn", log_port))
    with txn_serving(config) as (server, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        from mqstore_rpc.gen.mqstore.v1 import txn_pb2_grpc
        txn = txn_pb2_grpc.TransactionStub(channel)
        wait_ready(txn)
        opened = prepare(txn, "t", [b"a", b"b"])
        middle = scrape(server.metrics_port)
        assert middle.value("mqstore_txn_transactions", state="OPEN") == 1
        assert middle.value("mqstore_txn_halves_written_total") == 2
        commit(txn, opened.transaction_id)
        done = wait_until(lambda: (s := scrape(server.metrics_port)).value(
            "mqstore_txn_op_messages_written_total") >= 1 and s, "the OP record of the commit")
        assert done.value("mqstore_txn_transactions", state="COMMITTED") == 1
        assert done.value("mqstore_txn_transactions", state="OPEN") == 0
        assert done.value("mqstore_txn_cache_hits_total") == 2     # both halves served from the cache
        assert done.value("mqstore_txn_cache_hit_ratio") == 1.0
        assert done.value("mqstore_txn_half_to_op_ratio") == 2 / done.value("mqstore_txn_op_messages_written_total")
        assert done.value("mqstore_follower_lag_bytes", follower="txn-follower") >= 0


def test_compactor_round_figures(tmp_path, log):
    _, log_port, stub = log
    stub.CreateTopic(cpb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION),
                     timeout=TIMEOUT_S)
    for i in range(20):
        _append(stub, "kv", [b"value-%d" % i], keys=[f"key-{i % 4}"])
    config = dataclasses.replace(_with_metrics(compactor_config(tmp_path / "compactor", log_port)),
                                 follow=FollowConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))
    with compactor_serving(config) as (server, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        compactor = compactor_pb2_grpc.CompactorStub(channel)
        def following() -> bool:
            scraped = scrape(server.metrics_port)
            return (scraped.has("mqstore_follower_lag_bytes", follower="compactor-follower")
                    and scraped.value("mqstore_follower_lag_bytes", follower="compactor-follower") == 0
                    and scraped.has("mqstore_compactor_dirty_ratio", topic="kv"))
        wait_until(following, "the compactor to follow the log")
        report = compactor.Compact(compactor_pb2.CompactRequest(topic="kv", seal_active=True), timeout=60).rounds[0]
        after = scrape(server.metrics_port)
        assert after.value("mqstore_compactor_round_passes", topic="kv", queue_id="0") == report.passes >= 1
        assert after.value("mqstore_compactor_round_running", topic="kv") == 0
        assert after.value("mqstore_compactor_dirty_ratio", topic="kv", queue_id="0") == 0
        assert after.value("mqstore_compactor_last_round_seconds", topic="kv") >= 0
        assert after.value("mqstore_compactor_quarantined_queues") == 0
        assert after.value("mqstore_compactor_round_records", topic="kv", direction="in") == 20
        assert after.value("mqstore_compactor_round_records", topic="kv", direction="out") == 4  # a value per key
