"""Helpers for the Transaction service tests: a commit log and a txn service in this process, real gRPC
on 127.0.0.1 (port 0), real files; stubs. Both deployments (MODES): "cluster", the txn service on its own
server talking to the commit log over gRPC; "local", the commit log serving the Transaction service itself
(mqstore-commitlog --txn-port)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import pathlib
import queue
import typing

import grpc

from commitlog_service.main import serving as commitlog_serving
from mqstore.gateway.config import GatewayConfig
from mqstore_launcher.node import LocalMode
from gateway_service.composition import LocalGatewayConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc
from mqstore_rpc.executor import RUNNING
from mqstore_rpc.server import ServerConfig
from txn_service.composition import LocalTxnConfig
from mqstore.follow import FollowConfig
from tests.integration.test_commitlog_grpc import make_config
from tests.support.waiting import wait_until
from mqstore.txn.config import TxnConfig
from txn_service.main import TxnServiceConfig, serving as txn_serving

TOKEN = "test-token"
RPC_TIMEOUT_S = 10
MODES = ("cluster", "local")
TEST_FOLLOW = FollowConfig(heartbeat_ms=20, backoff_initial_ms=20, backoff_max_ms=200)


def _split(data_dir: pathlib.Path, overrides: dict) -> tuple[TxnConfig, dict]:
    """The domain's config from the TxnConfig fields of ``overrides`` (with the tests' short intervals),
    and the rest."""
    values = dict(data_dir=data_dir, op_batch_interval_ms=50, check_scan_interval_ms=50, checkpoint_interval_ms=100)
    domain = {f.name for f in dataclasses.fields(TxnConfig)}
    values.update({k: v for k, v in overrides.items() if k in domain})
    return TxnConfig(**values), {k: v for k, v in overrides.items() if k not in domain}


def txn_config(data_dir: pathlib.Path, commitlog_port: int, **overrides) -> TxnServiceConfig:
    """TxnConfig fields in ``overrides`` go to the domain's config, ``port`` to the server's, the rest
    (rpc_timeout_ms, ...) to the service's."""
    port = overrides.pop("port", 0)
    txn, service = _split(data_dir, overrides)
    return TxnServiceConfig(txn=txn, server=ServerConfig(port=port, grace_s=0.5),
                            commitlog_address=f"127.0.0.1:{commitlog_port}", internal_token=TOKEN,
                            follow=TEST_FOLLOW, **service)


def local_txn_config(data_dir: pathlib.Path, **overrides) -> LocalTxnConfig:
    """Local mode's settings: TxnConfig fields in ``overrides`` as txn_config's, the rest (rpc_timeout_ms,
    port, ...) to LocalTxnConfig."""
    txn, rest = _split(data_dir, overrides)
    return LocalTxnConfig(**{"port": 0, **rest}, txn=txn, follow=TEST_FOLLOW)


@contextlib.contextmanager
def commitlog_with_txn(data_dir: pathlib.Path, txn_data_dir: pathlib.Path, port: int = 0,
                       max_running_handlers: int = RUNNING, flush_mode: str | None = None, **overrides):
    """A commit log serving the Transaction service itself (Local mode): (the server, its port, the
    Transaction port, a CommitLog stub). Both ports capped as commitlog_service caps them by default;
    ``flush_mode``: the store's (default make_config's)."""
    config = make_config(data_dir)
    if flush_mode is not None:
        config = dataclasses.replace(config, store=dataclasses.replace(config.store, flush_mode=flush_mode))
    config = dataclasses.replace(config, internal_token=TOKEN,
                                 server=ServerConfig(port=port, grace_s=0.5, max_running_handlers=max_running_handlers),
                                 hosted=(LocalMode(txn=local_txn_config(txn_data_dir, **overrides)),))
    with commitlog_serving(config) as (server, bound):
        channel = grpc.insecure_channel(f"127.0.0.1:{bound}")
        try:
            yield server, bound, server.extra_ports["txn"], commitlog_pb2_grpc.CommitLogStub(channel)
        finally:
            channel.close()


class Stack(typing.NamedTuple):
    log_port: int
    log: commitlog_pb2_grpc.CommitLogStub
    txn: txn_pb2_grpc.TransactionStub
    txn_port: int
    mode: str


@contextlib.contextmanager
def txn_stack(root: pathlib.Path, mode: str, topics: dict[str, int], **overrides):
    """A commit log with ``topics`` (name: queue count) and a recovered Transaction service in ``mode``
    (MODES), data under ``root`` (log/, txn/); ``overrides`` as txn_config's (``clock`` too). A Stack."""
    with contextlib.ExitStack() as stack:
        if mode == "cluster":
            port, log_stub = stack.enter_context(commitlog(root / "log"))
        else:
            _, port, txn_port, log_stub = stack.enter_context(commitlog_with_txn(root / "log", root / "txn",
                                                                                 **overrides))
        for name, queues in topics.items():
            log_stub.CreateTopic(cpb.CreateTopicRequest(name=name, queue_count=queues), timeout=RPC_TIMEOUT_S)
        if mode == "cluster":
            server, _ = stack.enter_context(txn_service(root / "txn", port, **overrides))
            txn_port = server.port
        channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{txn_port}"))
        stub = txn_pb2_grpc.TransactionStub(channel)
        wait_ready(stub)
        yield Stack(port, log_stub, stub, txn_port, mode)


@contextlib.contextmanager
def commitlog(data_dir: pathlib.Path, port: int = 0):
    config = dataclasses.replace(make_config(data_dir), internal_token=TOKEN,
                                 server=ServerConfig(port=port, grace_s=0.5))
    with commitlog_serving(config) as (_, bound):
        channel = grpc.insecure_channel(f"127.0.0.1:{bound}")
        try:
            yield bound, commitlog_pb2_grpc.CommitLogStub(channel)
        finally:
            channel.close()


@contextlib.contextmanager
def commitlog_with_gateway(data_dir: pathlib.Path, txn_port: int, gateway: GatewayConfig | None = None,
                           internal_token: str = TOKEN):
    """A commit log serving the RocketMQ 5 gateway itself (Local mode), told the Transaction service's port
    before that service starts: (the server, its port, the gateway's port, a CommitLog stub)."""
    config = dataclasses.replace(make_config(data_dir), internal_token=internal_token,
                                 server=ServerConfig(port=0, grace_s=0.5),
                                 hosted=(LocalMode(gateway=LocalGatewayConfig(
                                     port=0, txn_address=f"127.0.0.1:{txn_port}", gateway=gateway or GatewayConfig(),
                                 )),))
    with commitlog_serving(config) as (server, bound):
        channel = grpc.insecure_channel(f"127.0.0.1:{bound}")
        try:
            yield server, bound, server.extra_ports["gateway"], commitlog_pb2_grpc.CommitLogStub(channel)
        finally:
            channel.close()


@contextlib.contextmanager
def txn_service(data_dir: pathlib.Path, commitlog_port: int, **overrides):
    with txn_serving(txn_config(data_dir, commitlog_port, **overrides)) as (server, port):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield server, txn_pb2_grpc.TransactionStub(channel)
        finally:
            channel.close()


def stats(stub) -> txn_pb2.TxnStats:
    return stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_TIMEOUT_S)


def wait_ready(stub) -> txn_pb2.TxnStats:
    """Until Stats says the service has recovered (polled, bounded by a deadline)."""
    return wait_until(lambda: (s := stats(stub)) and not s.recovering and s, "the txn service to recover")


def msg(body: bytes, **fields) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=body, **fields)


def prepare(stub, topic: str, bodies, group: str = "pg", txn_id: str = "", **fields) -> txn_pb2.PrepareResponse:
    return stub.Prepare(txn_pb2.PrepareRequest(topic=topic, messages=[msg(b, **fields) for b in bodies],
                                               producer_group=group, transaction_id=txn_id), timeout=RPC_TIMEOUT_S)


def commit(stub, txn_id: str) -> txn_pb2.EndResponse:
    return stub.Commit(txn_pb2.EndRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S)


def rollback(stub, txn_id: str) -> txn_pb2.EndResponse:
    return stub.Rollback(txn_pb2.EndRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S)


def visible(log_stub, topic: str, queue_count: int = 1) -> list:
    """Every message a consumer can Pull from ``topic``."""
    out = []
    for queue_id in range(queue_count):
        offset = 0
        while True:
            r = log_stub.Pull(cpb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=1000),
                              timeout=RPC_TIMEOUT_S)
            out += r.messages
            if not r.messages:
                break
            offset = r.next_offset
    return out


class Frames:
    """One Transact stream: ``ask`` sends a frame and returns its answer; ``send`` sends one without
    waiting (a one-way frame is never answered). ``close`` ends the producer's side and returns the
    answers still on their way; ``cancel`` breaks the stream."""

    def __init__(self, stub, timeout_s: float = 60):
        self._outbox: queue.Queue = queue.Queue()
        self.call = stub.Transact(iter(self._outbox.get, None), timeout=timeout_s)
        self._ids = itertools.count(1)

    def send(self, one_way: bool = False, **kind) -> int:
        request_id = next(self._ids)
        self._outbox.put(txn_pb2.TransactRequest(request_id=request_id, one_way=one_way, **kind))
        return request_id

    def ask(self, **kind) -> txn_pb2.TransactResponse:
        request_id = self.send(**kind)
        answer = next(self.call)
        assert answer.request_id == request_id, (answer, request_id)
        return answer

    def prepare(self, topic: str, bodies, group: str = "pg", txn_id: str = "", ends=(),
                **fields) -> txn_pb2.TransactResponse:
        """A Prepare frame (carrying ``ends``), answered."""
        return self.ask(prepare=txn_pb2.PrepareRequest(topic=topic, messages=[msg(b, **fields) for b in bodies],
                                                       producer_group=group, transaction_id=txn_id), ends=ends)

    def close(self) -> list[txn_pb2.TransactResponse]:
        self._outbox.put(None)
        return list(self.call)

    def cancel(self) -> None:
        self.call.cancel()
        self._outbox.put(None)
