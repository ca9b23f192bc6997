"""Issue 32's attacks over mutual TLS: a client certificate of the installation's CA is what every client,
the attacker too, presents, so it identifies no user and authorizes nothing. With every server requiring
one (test_attack_txn's rig: the services, the gateway in both modes, over mTLS), an attacker holding a
valid certificate is still refused another user's client id and another user's transaction, and with
the certificate alone (no credentials) is not authenticated.
"""

from __future__ import annotations

from typing import Iterator

import grpc
import pytest

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d, service_pb2 as v2, service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import txn_pb2 as tpb, txn_pb2_grpc
from tests.integration.test_attack_txn import MODES, PUBT, SECRET, TIMEOUT_S, Rig, _as, _end, _gateway_send, serving
from tests.integration.test_auth_matrix import _bearer, _secret_of
from tests.support.transport import Transport

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def rig(tmp_path_factory, certs) -> Iterator[Rig]:
    with serving(tmp_path_factory.mktemp("attack-mtls"), Transport("mtls", certs)) as r:
        yield r


def _code(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("mode", MODES)
def test_a_valid_client_certificate_does_not_authorize_another_users_session_or_transaction(rig, mode, certs):
    gateway, txn = rig.gateway(mode), rig.txn()          # channels with the CA's client certificate
    # The rig is mutual TLS: without a client certificate the handshake fails, whatever the credentials.
    gateway_port = rig.ports["gateway" if mode == "cluster" else "gateway-local"]
    with Transport("tls", certs).channel(rig.ports["txn"]) as txn_without, \
            Transport("tls", certs).channel(gateway_port) as gateway_without:
        assert _code(lambda: txn_pb2_grpc.TransactionStub(txn_without).Stats(
            tpb.TxnStatsRequest(), timeout=TIMEOUT_S, metadata=_as("bob"))) == grpc.StatusCode.UNAVAILABLE
        assert _code(lambda: service_pb2_grpc.MessagingServiceStub(gateway_without).Heartbeat(
            v2.HeartbeatRequest(client_type=d.PRODUCER), timeout=TIMEOUT_S, metadata=_as("bob", "producer"))) == \
            grpc.StatusCode.UNAVAILABLE
    victims = _gateway_send(rig, mode, "bob", SECRET)     # bob's client id: bob-producer, bound to bob
    # The certificate alone authenticates no one.
    assert _code(lambda: txn.Commit(tpb.EndRequest(transaction_id=victims), timeout=TIMEOUT_S)) == \
        grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: gateway.Heartbeat(v2.HeartbeatRequest(client_type=d.PRODUCER), timeout=TIMEOUT_S,
                                           metadata=(("x-mq-client-id", "bob-producer"),))) == \
        grpc.StatusCode.UNAUTHENTICATED
    # pubonly, certificate and credentials valid: not bob's transaction, neither at the gateway (naming its
    # own topic) nor at the Transaction service, which answers as for an unknown id
    assert _end(rig, mode, "pubonly", PUBT, victims, d.COMMIT).code == d.INVALID_TRANSACTION_ID
    assert _code(lambda: txn.Commit(tpb.EndRequest(transaction_id=victims), timeout=TIMEOUT_S,
                                    metadata=_as("pubonly"))) == grpc.StatusCode.NOT_FOUND
    assert rig.state(victims) == "TRANSACTION_STATE_OPEN"
    # nor bob's session: its client id is refused to pubonly, which cannot end it either
    hijack = (*_bearer("pubonly", _secret_of("pubonly")), ("x-mq-client-id", "bob-producer"))
    assert _code(lambda: gateway.Heartbeat(v2.HeartbeatRequest(client_type=d.PRODUCER), timeout=TIMEOUT_S,
                                           metadata=hijack)) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: gateway.NotifyClientTermination(v2.NotifyClientTerminationRequest(), timeout=TIMEOUT_S,
                                                         metadata=hijack)) == grpc.StatusCode.PERMISSION_DENIED
    # bob's session and transaction are as they were: bob keeps the one alive and commits the other
    assert gateway.Heartbeat(v2.HeartbeatRequest(client_type=d.PRODUCER), timeout=TIMEOUT_S,
                             metadata=_as("bob", "producer")).status.code == d.OK
    assert _end(rig, mode, "bob", SECRET, victims, d.COMMIT).code == d.OK
    assert rig.state(victims) == "TRANSACTION_STATE_COMMITTED"

