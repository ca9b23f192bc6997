"""The revocation bound (README, "Authentication"; mqstore.auth.authority): a change of users or rules
made by another process is in force on a server within ``--auth-refresh-ms`` plus one read of the
version, although every call until then was served from the server's caches.

A real CommitLog process with authentication on; the test process changes the auth database through a
store of its own, as another service or ``mqstore user --offline`` would, so the server learns of it
only by polling the version. Fails if a cache outlives a change (no refresh, or a cache that the
refresh does not drop)."""

from __future__ import annotations

import time

import grpc
import pytest

from mqstore.auth.admin import AccessAdmin
from mqstore.access import ALLOW, NORMAL, PUB, TOPIC
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_rpc.auth import token
from mqstore_rpc.gen.mqstore.v1 import common_pb2, commitlog_pb2, commitlog_pb2_grpc
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
INTERNAL = "revocation-internal-token-77"
REFRESH_MS = 300
# What the bound allows beyond REFRESH_MS on a loaded 2-core machine: the version read, the duty's
# wake-up and one Append round trip. Without a refresh (or with a cache it does not drop) the change
# is never seen: the wait below runs out instead.
SLACK_S = 4.0
NEVER_S = 30.0


def _append(stub, secret: str):
    request = commitlog_pb2.AppendRequest(topic="orders", messages=[common_pb2.MessageInput(body=b"x")])
    return stub.Append(request, timeout=30, metadata=(("authorization", token("alice", secret)),))


def _code(stub, secret: str) -> grpc.StatusCode:
    try:
        _append(stub, secret)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _refused_within(stub, secret: str, code: grpc.StatusCode, since: float) -> float:
    wait_until(lambda: _code(stub, secret) == code, f"the server to refuse alice with {code.name}", NEVER_S)
    return time.monotonic() - since


def test_a_revoked_rule_and_a_deleted_user_are_refused_within_the_refresh_interval(tmp_path):
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    elsewhere = AuthStore(url, SystemClock())
    try:
        admin = AccessAdmin(elsewhere)  # no invalidate callback: the server must find the change itself
        secret = "alice-secret-0001"
        admin.create_user("alice", NORMAL, secret)
        rule = admin.add_rule("alice", TOPIC, "orders", frozenset({PUB}), ALLOW)
        with commitlog(tmp_path / "log", "--auth", "--auth-url", url, "--auth-refresh-ms", str(REFRESH_MS),
                       env={"MQSTORE_INTERNAL_TOKEN": INTERNAL}) as server:
            port = server.wait_for("server.started")["port"]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = commitlog_pb2_grpc.CommitLogStub(channel)
                stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name="orders", queue_count=1), timeout=30,
                                 metadata=(("authorization", token("service", INTERNAL)),))
                for _ in range(3):  # cached from the first call on
                    assert _append(stub, secret).results

                admin.delete_rule(rule.rule_id)
                revoked = _refused_within(stub, secret, grpc.StatusCode.PERMISSION_DENIED, time.monotonic())
                assert revoked <= REFRESH_MS / 1000 + SLACK_S, f"rule revoked, still allowed for {revoked:.2f} s"

                admin.add_rule("alice", TOPIC, "orders", frozenset({PUB}), ALLOW)
                wait_until(lambda: _code(stub, secret) == grpc.StatusCode.OK, "alice's new rule", NEVER_S)
                admin.delete_user("alice")
                deleted = _refused_within(stub, secret, grpc.StatusCode.UNAUTHENTICATED, time.monotonic())
                assert deleted <= REFRESH_MS / 1000 + SLACK_S, f"user deleted, still accepted for {deleted:.2f} s"
            assert server.stop() == 0
    finally:
        elsewhere.close()
