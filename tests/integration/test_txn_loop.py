"""Local mode's Transaction port on grpc.aio (mqstore_rpc.aio): Prepare, Commit and Transact's frames answered
on the event loop, what may wait in the handler pool, the other calls in the pool; with the server skeleton's
authentication, per-frame permission checks, error mapping, per-RPC metrics, health and reflection, and a
stop that ends open streams. The protocol itself is checked in both modes by the other test_txn_* suites."""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from commitlog_service.main import serving as commitlog_serving
from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_launcher.node import LocalMode
from mqstore_rpc import auth as rpc_auth
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, txn_pb2, txn_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.server import AuthConfig, ServerConfig
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.txn_testing import RPC_TIMEOUT_S, TOKEN, local_txn_config, msg, wait_ready
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

WRITER, WRITER_SECRET = "writer", "secret-of-the-writer-0123456789"


def _samples(server, name: str) -> dict:
    family = next(f for f in server.registry.collect() if f.name == name)
    return {labels: value for labels, value in family.samples}


def _transact(channel: grpc.Channel, user: str = "", secret: str = ""):
    stub = txn_pb2_grpc.TransactionStub(channel)
    metadata = ((rpc_auth.METADATA_KEY, rpc_auth.token(user, secret)),) if user else None
    return stub, lambda frames: stub.Transact(iter(frames), metadata=metadata, timeout=RPC_TIMEOUT_S)


def _prepare(request_id: int, topic: str) -> txn_pb2.TransactRequest:
    return txn_pb2.TransactRequest(request_id=request_id, prepare=txn_pb2.PrepareRequest(
        topic=topic, messages=[msg(b"m")], producer_group="pg"))


@contextlib.contextmanager
def local_port(tmp_path: pathlib.Path, auth: bool = False, **overrides):
    """A commit log with the Transaction port (Local mode) and the topics orders and secret: (the server, a
    channel to the Transaction port with the service's own credentials, that port's address)."""
    server = ServerConfig(port=0, grace_s=0.5)
    if auth:
        url = f"sqlite:///{tmp_path / 'auth.db'}"
        store = AuthStore(url, SystemClock())
        try:
            admin = AccessAdmin(store)
            admin.create_user(WRITER, access.NORMAL, WRITER_SECRET)
            admin.add_rule(WRITER, access.TOPIC, "orders", frozenset({access.PUB}), access.ALLOW)
            admin.add_rule(WRITER, access.GROUP, "pg", frozenset({access.PUB}), access.ALLOW)  # Prepare's group
        finally:
            store.close()
        server = dataclasses.replace(server, peers=Peers(None, "service", Secret(TOKEN)), auth=AuthConfig(
            enabled=True, url=Secret(url), refresh_ms=100, internal_token=Secret(TOKEN)))
    config = dataclasses.replace(make_config(tmp_path / "log"), internal_token=TOKEN, server=server,
                                 hosted=(LocalMode(txn=local_txn_config(tmp_path / "txn", **overrides)),))
    with commitlog_serving(config) as (log_server, log_port):
        service = [rpc_auth.BearerToken("service", TOKEN)] if auth else []
        with grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{log_port}"), *service) as channel:
            for topic in ("orders", "secret"):
                commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
                    cpb.CreateTopicRequest(name=topic, queue_count=1), timeout=RPC_TIMEOUT_S)
        address = f"127.0.0.1:{log_server.extra_ports['txn']}"
        with grpc.intercept_channel(grpc.insecure_channel(address), *service) as channel:
            wait_ready(txn_pb2_grpc.TransactionStub(channel))
            yield log_server, channel, address


def test_each_frame_is_checked_as_its_call_on_the_loop_and_in_the_pool(tmp_path):
    with local_port(tmp_path, auth=True) as (_, service, address):
        theirs = txn_pb2_grpc.TransactionStub(service).Prepare(txn_pb2.PrepareRequest(
            topic="secret", messages=[msg(b"s")], producer_group="pg"), timeout=RPC_TIMEOUT_S).transaction_id
        with grpc.insecure_channel(address) as channel:
            stub, transact = _transact(channel)
            with pytest.raises(grpc.RpcError) as refused:
                list(transact([_prepare(1, "orders")]))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()

            stub, transact = _transact(channel, WRITER, WRITER_SECRET)
            answers = list(transact([
                _prepare(1, "orders"),                                                  # on the loop: allowed
                _prepare(2, "secret"),                                                  # on the loop: refused
                txn_pb2.TransactRequest(request_id=3, rollback=txn_pb2.EndRequest(transaction_id=theirs)),  # pool
            ]))
            assert [a.request_id for a in answers] == [1, 2, 3]
            assert answers[0].HasField("prepared")
            assert answers[1].error.code == grpc.StatusCode.PERMISSION_DENIED.value[0], answers[1]
            # an end the caller may not make is answered as an unknown id (txn.proto: no existence oracle)
            assert answers[2].error.code == grpc.StatusCode.NOT_FOUND.value[0], answers[2]
            mine = answers[0].prepared.transaction_id
            rolled = list(transact([txn_pb2.TransactRequest(request_id=4, rollback=txn_pb2.EndRequest(
                transaction_id=mine))]))  # a two-way Rollback runs in the pool, the caller checked there
            assert rolled[0].ended.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK, rolled
            # the unary calls run in the pool with the same checks
            with pytest.raises(grpc.RpcError) as denied:
                stub.Rollback(txn_pb2.EndRequest(transaction_id=theirs), timeout=RPC_TIMEOUT_S,
                              metadata=((rpc_auth.METADATA_KEY, rpc_auth.token(WRITER, WRITER_SECRET)),))
            assert denied.value.code() == grpc.StatusCode.NOT_FOUND
        shown = txn_pb2_grpc.TransactionStub(service).Show(txn_pb2.ShowRequest(transaction_id=theirs),
                                                           timeout=RPC_TIMEOUT_S)
        assert shown.state == txn_pb2.TRANSACTION_STATE_OPEN  # the refused Rollback changed nothing


def test_a_users_first_call_is_checked_off_the_loop_while_the_loop_answers_others(tmp_path, monkeypatch):
    """A first call checks its secret against the auth database (a read and a scrypt hash): on a thread,
    so the port's loop answers the calls of users already checked meanwhile. Held here until the other
    call is answered: on the loop, that call would wait for it and miss its deadline."""
    from mqstore.auth import secrets

    checking, release = threading.Event(), threading.Event()
    verify = secrets.verify_secret

    def held(secret: str, stored: str) -> bool:
        if secret == WRITER_SECRET:
            checking.set()
            release.wait(RPC_TIMEOUT_S)
        return verify(secret, stored)

    monkeypatch.setattr(secrets, "verify_secret", held)
    with local_port(tmp_path, auth=True) as (_, service, address):
        with grpc.insecure_channel(address) as channel:
            writer = ((rpc_auth.METADATA_KEY, rpc_auth.token(WRITER, WRITER_SECRET)),)
            first = txn_pb2_grpc.TransactionStub(channel).Prepare.future(txn_pb2.PrepareRequest(
                topic="orders", messages=[msg(b"first")], producer_group="pg"), metadata=writer,
                timeout=RPC_TIMEOUT_S)
            try:
                assert checking.wait(RPC_TIMEOUT_S), "the writer's secret to be checked"
                other = txn_pb2_grpc.TransactionStub(service).Prepare(txn_pb2.PrepareRequest(
                    topic="orders", messages=[msg(b"other")], producer_group="pg"), timeout=RPC_TIMEOUT_S / 2)
                assert other.transaction_id and not first.done()
            finally:
                release.set()
            assert first.result().transaction_id
            _, transact = _transact(channel, WRITER, "not-the-secret")  # a refusal off the loop maps as on it
            with pytest.raises(grpc.RpcError) as refused:
                list(transact([_prepare(1, "orders")]))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()


def test_a_stream_on_the_loop_is_counted_and_its_errors_mapped(tmp_path):
    with local_port(tmp_path, max_transact_streams=1) as (server, channel, _):
        _, transact = _transact(channel)
        prepared = list(transact([_prepare(1, "orders"), _prepare(2, "orders")]))
        txn_id = prepared[0].prepared.transaction_id
        assert list(transact([txn_pb2.TransactRequest(request_id=3, ends=[txn_pb2.CarriedEnd(
            transaction_id=txn_id, decision=txn_pb2.DECISION_COMMIT)])])) == []  # ends only: not answered
        labels = ("bidi_stream", "mqstore.v1.Transaction", "Transact")
        assert _samples(server, "grpc_server_handled_total").get((*labels, "OK")) == 2
        stub = txn_pb2_grpc.TransactionStub(channel)  # the unary calls are answered on the loop too
        stub.Prepare(txn_pb2.PrepareRequest(topic="orders", messages=[msg(b"u")], producer_group="pg"),
                     timeout=RPC_TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Commit(txn_pb2.EndRequest(transaction_id="no-such-transaction"), timeout=RPC_TIMEOUT_S)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        unary = ("unary", "mqstore.v1.Transaction")
        wait_until(lambda: _samples(server, "grpc_server_handled_total").get((*unary, "Commit", "NOT_FOUND")) == 1,
                   "the refused Commit to be counted")
        assert _samples(server, "grpc_server_handled_total").get((*unary, "Prepare", "OK")) == 1
        assert _samples(server, "grpc_server_msg_sent_total").get((*unary, "Prepare")) == 1
        assert _samples(server, "grpc_server_msg_received_total").get(labels) == 3
        assert _samples(server, "grpc_server_msg_sent_total").get(labels) == 2

        raw = channel.stream_stream("/mqstore.v1.Transaction/Transact")
        with pytest.raises(grpc.RpcError) as garbage:
            list(raw(iter([b"\xff\xff\xff"]), timeout=RPC_TIMEOUT_S))
        assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "TransactRequest" in garbage.value.details()

        held = txn_pb2_grpc.TransactionStub(channel).Transact(iter(_held_open()), timeout=RPC_TIMEOUT_S)
        assert next(held).HasField("prepared")  # the one stream admitted is open
        with pytest.raises(grpc.RpcError) as second:
            list(transact([_prepare(1, "orders")]))
        assert second.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_transact_streams" in second.value.details()
        held.cancel()  # grpc.aio ends the request stream as if the client had closed it (counted as OK)
        wait_until(lambda: _samples(server, "grpc_server_handled_total").get((*labels, "RESOURCE_EXHAUSTED")) == 1,
                   "the refused stream to be counted (the status goes out as the handler aborts, before it is counted)")
        assert wait_until(lambda: _answered(transact), "the cancelled stream's slot to be free again")


def _answered(transact) -> list:
    try:
        return list(transact([_prepare(1, "orders")]))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        return []


def _held_open():
    yield _prepare(1, "orders")
    threading.Event().wait(RPC_TIMEOUT_S)  # the stream stays open until the test cancels it


def test_the_loop_port_has_health_reflection_and_stops_with_streams_open(tmp_path):
    with local_port(tmp_path) as (server, channel, _):
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "mqstore.v1.Transaction"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=RPC_TIMEOUT_S)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        listed = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=RPC_TIMEOUT_S)
        names = {s.name for s in next(listed).list_services_response.service}
        assert {"mqstore.v1.Transaction", "grpc.health.v1.Health"} <= names
        held = txn_pb2_grpc.TransactionStub(channel).Transact(iter(_held_open()), timeout=RPC_TIMEOUT_S)
        assert next(held).HasField("prepared")
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        stopper.join(RPC_TIMEOUT_S)
        assert not stopper.is_alive(), "the server did not stop with a Transact stream open"
        with pytest.raises(grpc.RpcError) as ended:
            next(held)
        assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def test_a_one_way_commit_of_a_rolled_back_transaction_does_not_wait_for_its_op_record(tmp_path):
    """A two-way Commit of a rolled-back transaction answers once the rollback is durable (its OP record
    written); a one-way one is refused at once: nobody hears the refusal, and the loop serves other streams."""
    with local_port(tmp_path, op_batch_interval_ms=600_000) as (_, channel, _):  # OP records wait for the stop
        stub, transact = _transact(channel)
        txn_id = list(transact([_prepare(1, "orders")]))[0].prepared.transaction_id
        answers = list(transact([
            txn_pb2.TransactRequest(request_id=2, one_way=True, rollback=txn_pb2.EndRequest(transaction_id=txn_id)),
            txn_pb2.TransactRequest(request_id=3, one_way=True, commit=txn_pb2.EndRequest(transaction_id=txn_id)),
            _prepare(4, "orders")]))  # within RPC_TIMEOUT_S, not after the OP batch interval
        assert [a.request_id for a in answers] == [4]
        counted = stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_TIMEOUT_S)
        assert counted.one_way_failures == 1, counted
        assert (counted.role, counted.active_address) == ("single", "")  # no --etcd-endpoints: runs alone
        shown = stub.Show(txn_pb2.ShowRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S)
        assert shown.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK


def test_a_two_way_commit_of_a_rolled_back_transaction_is_refused_once_the_rollback_is_durable(tmp_path):
    """Tried on the loop without waiting, then taken again in the pool: the refusal comes after the OP record."""
    with local_port(tmp_path, op_batch_interval_ms=1_000) as (_, channel, _):
        stub, transact = _transact(channel)
        for attempt, commit in enumerate(("unary", "frame")):
            txn_id = list(transact([_prepare(1, "orders")]))[0].prepared.transaction_id
            assert list(transact([txn_pb2.TransactRequest(request_id=2, one_way=True, rollback=txn_pb2.EndRequest(
                transaction_id=txn_id))])) == []  # answered at once, its OP record written within the interval
            if commit == "unary":
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Commit(txn_pb2.EndRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            else:
                answer = list(transact([txn_pb2.TransactRequest(request_id=3, commit=txn_pb2.EndRequest(
                    transaction_id=txn_id))]))[0]
                assert answer.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0], answer
            counted = stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_TIMEOUT_S)
            assert counted.op_messages_written >= attempt + 1, counted  # the refusal waited for the OP record
