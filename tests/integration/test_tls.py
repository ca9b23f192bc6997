"""TLS and mutual TLS on real servers: accepted with the right CA (and client certificate), refused in
plaintext and with another CA; the services follow each other over mutual TLS, and the CLI and grpcurl
talk TLS."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import grpc
import pytest

from commitlog_service.main import serving as commitlog_serving
from index_service.main import IndexServiceConfig
from index_service.main import serving as index_serving
from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig
from mqstore_launcher.node import LocalMode
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, index_pb2, index_pb2_grpc, txn_pb2, txn_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.server import ServerConfig
from mqstore_rpc.tls import ClientTls, ServerTls
from txn_service.composition import LocalTxnConfig
from mqstore.txn.config import TxnConfig
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.test_grpcurl import _grpcurl_binary
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
TIMEOUT_S = 5


def _server_tls(certs, mutual: bool) -> ServerTls:
    return ServerTls.from_files(str(certs / "server.pem"), str(certs / "server.key"),
                                str(certs / "ca.pem") if mutual else "")


def _client_tls(ca_dir, cert_dir=None) -> ClientTls:
    if cert_dir is None:
        return ClientTls.from_files(str(ca_dir / "ca.pem"))
    return ClientTls.from_files(str(ca_dir / "ca.pem"), str(cert_dir / "client.pem"), str(cert_dir / "client.key"))


def _log(tmp_path, certs, mutual: bool):
    server = ServerConfig(port=0, grace_s=0.5, tls=_server_tls(certs, mutual))
    return commitlog_serving(dataclasses.replace(make_config(tmp_path / "log"), server=server))


def _info(port: int, peers: Peers) -> cpb.StoreInfo:
    with peers.channel(f"localhost:{port}") as channel:
        return commitlog_pb2_grpc.CommitLogStub(channel).GetStoreInfo(cpb.GetStoreInfoRequest(), timeout=TIMEOUT_S)


def _refused(port: int, peers: Peers) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        _info(port, peers)
    return refused.value.code()


def test_tls_is_accepted_with_the_ca_and_refused_in_plaintext_or_with_another_ca(tmp_path, certs, other_certs):
    with _log(tmp_path, certs, mutual=False) as (_, port):
        assert _info(port, Peers(_client_tls(certs))).codec
        assert _refused(port, Peers()) == grpc.StatusCode.UNAVAILABLE                    # plaintext
        assert _refused(port, Peers(_client_tls(other_certs))) == grpc.StatusCode.UNAVAILABLE  # wrong CA


def test_mutual_tls_needs_a_client_certificate_of_the_ca(tmp_path, certs, other_certs):
    with _log(tmp_path, certs, mutual=True) as (_, port):
        assert _info(port, Peers(_client_tls(certs, certs))).codec
        assert _refused(port, Peers(_client_tls(certs))) == grpc.StatusCode.UNAVAILABLE              # no certificate
        assert _refused(port, Peers(_client_tls(certs, other_certs))) == grpc.StatusCode.UNAVAILABLE  # another CA's
        assert _refused(port, Peers()) == grpc.StatusCode.UNAVAILABLE


def test_the_local_transaction_port_on_grpc_aio_takes_mutual_tls_only(tmp_path, certs, other_certs):
    server = ServerConfig(port=0, grace_s=0.5, tls=_server_tls(certs, mutual=True))
    local = LocalTxnConfig(port=0, txn=TxnConfig(data_dir=tmp_path / "txn"))
    config = dataclasses.replace(make_config(tmp_path / "log"), server=server, hosted=(LocalMode(txn=local),))
    with commitlog_serving(config) as (log_server, _):
        address = f"localhost:{log_server.extra_ports['txn']}"

        def stats(peers: Peers) -> txn_pb2.TxnStats:
            with peers.channel(address) as channel:
                return txn_pb2_grpc.TransactionStub(channel).Stats(txn_pb2.TxnStatsRequest(), timeout=TIMEOUT_S)
        wait_until(lambda: not stats(Peers(_client_tls(certs, certs))).recovering, "the transaction service")
        for peers in (Peers(), Peers(_client_tls(certs)), Peers(_client_tls(certs, other_certs))):
            with pytest.raises(grpc.RpcError) as refused:
                stats(peers)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_index_follows_a_commit_log_over_mutual_tls(tmp_path, certs):
    with _log(tmp_path, certs, mutual=True) as (_, log_port):
        client = Peers(_client_tls(certs, certs))
        with client.channel(f"localhost:{log_port}") as channel:
            log = commitlog_pb2_grpc.CommitLogStub(channel)
            log.CreateTopic(cpb.CreateTopicRequest(name="secure", queue_count=1), timeout=TIMEOUT_S)
            log.Append(cpb.AppendRequest(topic="secure", messages=[common_pb2.MessageInput(body=b"x", keys=["k"])]),
                       timeout=TIMEOUT_S)
        server = ServerConfig(port=0, grace_s=0.5, tls=_server_tls(certs, mutual=True), peers=client)
        config = IndexServiceConfig(
            index=IndexConfig(tmp_path / "index", slot_count=16, entry_count=64, max_keys_per_message=8),
            server=server, commitlog_address=f"localhost:{log_port}",
            follower=FollowerConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))
        with index_serving(config) as (_, index_port), client.channel(f"localhost:{index_port}") as channel:
            index = index_pb2_grpc.IndexStub(channel)
            found = wait_until(lambda: index.QueryByKey(index_pb2.QueryByKeyRequest(
                topic="secure", key="k", include_messages=True), timeout=TIMEOUT_S).messages,
                "the index to index the message over mutual TLS")
            assert found[0].body == b"x"   # indexed through Tail, verified through GetMessages: both over mTLS


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqstore_cli", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_the_cli_and_grpcurl_speak_tls(tmp_path, certs):
    with _log(tmp_path, certs, mutual=False) as (_, port):
        address = f"localhost:{port}"
        ok = _cli("--address", address, "store-info", env={"MQSTORE_TLS_CA": str(certs / "ca.pem")})
        assert ok.returncode == 0, ok.stderr
        assert "codec:" in ok.stdout
        plain = _cli("--address", address, "--timeout", "3", "store-info")
        assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
        grpcurl = subprocess.run([_grpcurl_binary(), "-cacert", str(certs / "ca.pem"), address,
                                  "mqstore.v1.CommitLog/GetStoreInfo"], capture_output=True, text=True, timeout=60)
        assert grpcurl.returncode == 0, grpcurl.stderr
        assert '"flush_mode": "ASYNC"' in grpcurl.stdout


def test_the_container_health_check_speaks_tls(tmp_path, certs):
    from mqstore_rpc.healthcheck import check
    with _log(tmp_path, certs, mutual=True) as (_, port):
        env = {"MQSTORE_TLS_CA": str(certs / "ca.pem"), "MQSTORE_TLS_CLIENT_CERT": str(certs / "client.pem"),
               "MQSTORE_TLS_CLIENT_KEY": str(certs / "client.key")}
        assert check(f"127.0.0.1:{port}", env=env) == "SERVING"
        assert check(f"127.0.0.1:{port}", env={}).startswith("UNREACHABLE")
