"""The smoke test of `make compose-check-ops` (scripts/compose_check_ops.sh), through the published ports
of docker-compose.yml + docker-compose.secure.yml: TLS and authentication on every service, Prometheus
scraping them.

  1. plaintext and calls without credentials are refused (UNAVAILABLE: no TLS handshake; UNAUTHENTICATED);
  2. as the services' identity (`service`, the internal token): a user with PUB and SUB on `ops-*`, a topic;
  3. as that user over TLS: Append, Pull; the index (following the commit log over TLS as `service`)
     finds the message by key; an Append to another topic is PERMISSION_DENIED;
  4. Prometheus: every lean service's target is up, the four alert rules are loaded, and the commit log's
     appended-messages counter it scraped counts the append.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sys
import time
import urllib.parse
import urllib.request

import grpc

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as v2d, service_pb2 as v2, service_pb2_grpc as v2_grpc
from mqstore_rpc.gen.mqstore.v1 import access_pb2 as apb, access_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import index_pb2, index_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.tls import client_tls

TIMEOUT_S = 10
DEADLINE_S = 120


def _code(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _expect(what: str, got: grpc.StatusCode, want: grpc.StatusCode) -> None:
    if got != want:
        sys.exit(f"{what}: got {got.name}, expected {want.name}")
    print(f"ok: {what}: {got.name}")


def _prometheus(base: str, path: str, **query) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(query)}" if query else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())["data"]


def _until(what: str, check) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if check():
            print(f"ok: {what}")
            return
        time.sleep(1)
    sys.exit(f"timed out after {DEADLINE_S} s: {what}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commitlog", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--gateway", required=True, help="host:port of the RocketMQ gateway")
    parser.add_argument("--prometheus", required=True, help="host:port of Prometheus")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--token", required=True, help="the internal token (user `service`)")
    args = parser.parse_args()
    tls = client_tls(args.ca)
    service = Peers(tls, "service", Secret(args.token))

    def info(peers: Peers):
        with peers.channel(args.commitlog) as channel:
            return commitlog_pb2_grpc.CommitLogStub(channel).GetStoreInfo(cpb.GetStoreInfoRequest(), timeout=5)
    _expect("plaintext", _code(lambda: info(Peers())), grpc.StatusCode.UNAVAILABLE)
    _expect("TLS without credentials", _code(lambda: info(Peers(tls))), grpc.StatusCode.UNAUTHENTICATED)
    _expect("TLS as service", _code(lambda: info(service)), grpc.StatusCode.OK)

    with service.channel(args.commitlog) as channel:
        access = access_pb2_grpc.AccessStub(channel)
        made = access.CreateUser(apb.CreateUserRequest(name="smoke"), timeout=TIMEOUT_S)
        access.AddRule(apb.AddRuleRequest(user="smoke", resource_kind=apb.RESOURCE_KIND_TOPIC, pattern="ops-*",
                                          actions=[apb.ACTION_PUB, apb.ACTION_SUB]), timeout=TIMEOUT_S)
        log = commitlog_pb2_grpc.CommitLogStub(channel)
        for name in ("ops-1", "other"):
            log.CreateTopic(cpb.CreateTopicRequest(name=name, queue_count=1), timeout=TIMEOUT_S)
    user = Peers(tls, "smoke", Secret(made.generated_secret))
    with user.channel(args.commitlog) as channel:
        log = commitlog_pb2_grpc.CommitLogStub(channel)
        message = common_pb2.MessageInput(body=b"over tls", keys=["smoke-key"])
        log.Append(cpb.AppendRequest(topic="ops-1", messages=[message]), timeout=TIMEOUT_S)
        pulled = log.Pull(cpb.PullRequest(topic="ops-1", queue_id=0, offset=0), timeout=TIMEOUT_S)
        assert pulled.messages[0].body == b"over tls"
        elsewhere = cpb.AppendRequest(topic="other", messages=[message])
        _expect("the user appends to another topic", _code(lambda: log.Append(elsewhere, timeout=TIMEOUT_S)),
                grpc.StatusCode.PERMISSION_DENIED)
    with user.channel(args.index) as channel:
        index = index_pb2_grpc.IndexStub(channel)
        _until("the index found the message by key (it follows the log over TLS as service)",
               lambda: index.QueryByKey(index_pb2.QueryByKeyRequest(topic="ops-1", key="smoke-key"),
                                        timeout=TIMEOUT_S).locators)

    # The RocketMQ SDKs sign each request with an SDK key (HMAC-SHA1 of x-mq-date-time): the key is made on
    # the commit log, sealed under the kek file every service mounts, and opened by the gateway.
    with service.channel(args.commitlog) as channel:
        sdk = access_pb2_grpc.AccessStub(channel).CreateSdkKey(apb.CreateSdkKeyRequest(user="smoke"),
                                                                timeout=TIMEOUT_S)
    route = v2.QueryRouteRequest(topic=v2d.Resource(name="ops-1"), endpoints=v2d.Endpoints(
        scheme=v2d.DOMAIN_NAME, addresses=[v2d.Address(host="localhost", port=8081)]))
    with Peers(tls).channel(args.gateway) as channel:
        gateway = v2_grpc.MessagingServiceStub(channel)
        for what, secret_key, expected in (("an SDK-signed QueryRoute", sdk.secret_key, grpc.StatusCode.OK),
                                           ("a QueryRoute signed with a wrong secret key", "wrong",
                                            grpc.StatusCode.UNAUTHENTICATED)):
            date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            digest = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
            signed = (("authorization", f"MQv2-HMAC-SHA1 Credential={sdk.key.access_key}, "
                                        f"SignedHeaders=x-mq-date-time, Signature={digest}"), ("x-mq-date-time", date),
                      ("x-mq-client-id", "compose-ops-smoke"))
            code = _code(lambda m=signed: gateway.QueryRoute(route, metadata=m, timeout=TIMEOUT_S))
            _expect(f"the gateway answers {what}", code, expected)
            if code == grpc.StatusCode.OK:
                answer = gateway.QueryRoute(route, metadata=signed, timeout=TIMEOUT_S)
                assert answer.status.code == v2d.OK and answer.message_queues, answer

    base = f"http://{args.prometheus}"
    _until("Prometheus scrapes commitlog, index, txn and gateway", lambda: {
        t["labels"]["service"] for t in _prometheus(base, "/api/v1/targets")["activeTargets"]
        if t["health"] == "up"} >= {"commitlog", "index", "txn", "gateway"})
    rules = [r["name"] for g in _prometheus(base, "/api/v1/rules")["groups"] for r in g["rules"]]
    assert {"MqstoreStoreReadOnly", "MqstoreFollowerStalled", "MqstoreHangingTransactions"} <= set(rules), rules
    print(f"ok: alert rules loaded: {', '.join(sorted(rules))}")
    _until("Prometheus has the commit log's appended messages", lambda: any(
        float(r["value"][1]) >= 1 for r in _prometheus(base, "/api/v1/query",
                                                      query="mqstore_commitlog_appended_messages_total")["result"]))
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
