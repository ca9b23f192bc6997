"""Authentication end to end: a real CommitLog process with auth and TLS on, users and rules managed with
``mqstore user`` and ``mqstore acl`` (first as the services' own identity), SDK keys made, listed and
revoked with ``mqstore user sdk-key``, the rules in force at once,
patterns, and no secret in any line the server logged."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.support.processes import commitlog

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]
TOKEN = "e2e-internal-token-5f3a9c"


def _cli(address: str, certs, *args: str, user: str = "", secret: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "MQSTORE_TLS_CA": str(certs / "ca.pem"), "MQSTORE_USER": user, "MQSTORE_SECRET": secret}
    return subprocess.run([sys.executable, "-m", "mqstore_cli", "--address", address, *args],
                          capture_output=True, text=True, timeout=60, env=env)


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def _refused(done: subprocess.CompletedProcess, status: str) -> str:
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(f"error: {status}: "), done.stderr
    return done.stderr


def test_users_and_rules_from_the_cli_with_auth_and_tls_on(tmp_path, certs):
    tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    with commitlog(tmp_path / "log", "--auth", *tls, env={"MQSTORE_INTERNAL_TOKEN": TOKEN}) as server:
        started = server.wait_for("server.started")
        assert started["auth"] is True and started["tls"] == "on"
        address = f"localhost:{started['port']}"
        as_service = dict(user="service", secret=TOKEN)

        _refused(_cli(address, certs, "topic", "list"), "UNAUTHENTICATED")
        _refused(_cli(address, certs, "topic", "list", user="service", secret="guessed-token"), "UNAUTHENTICATED")
        made = _ok(_cli(address, certs, "user", "create", "alice", **as_service))
        alice = made.split("secret: ", 1)[1].split()[0]
        alice_creds = dict(user="alice", secret=alice)
        _ok(_cli(address, certs, "acl", "grant", "alice", "--topic", "orders-*", "--actions", "PUB,SUB", **as_service))
        _ok(_cli(address, certs, "acl", "deny", "alice", "--topic", "orders-secret", "--actions", "SUB", **as_service))
        for name in ("orders-1", "orders-secret", "payments"):
            _ok(_cli(address, certs, "topic", "create", name, **as_service))

        denied = _refused(_cli(address, certs, "topic", "create", "orders-2", **alice_creds), "PERMISSION_DENIED")
        assert "user 'alice' lacks ADMIN on topic 'orders-2'" in denied
        _ok(_cli(address, certs, "send", "orders-1", "hello", **alice_creds))
        assert "hello" in _ok(_cli(address, certs, "pull", "orders-1", **alice_creds))
        _ok(_cli(address, certs, "send", "orders-secret", "write-only", **alice_creds))   # PUB is allowed...
        denied = _refused(_cli(address, certs, "pull", "orders-secret", **alice_creds), "PERMISSION_DENIED")
        assert "denied by its rule" in denied                                              # ...SUB denied
        denied = _refused(_cli(address, certs, "send", "payments", "x", **alice_creds), "PERMISSION_DENIED")
        assert "mqstore acl grant alice --topic payments --actions PUB" in denied

        rules = _ok(_cli(address, certs, "acl", "list", "alice", **as_service))
        first = rules.split()[0].lstrip("#")
        _ok(_cli(address, certs, "acl", "revoke", first, **as_service))
        _refused(_cli(address, certs, "send", "orders-1", "again", **alice_creds), "PERMISSION_DENIED")  # at once

        made = _ok(_cli(address, certs, "user", "sdk-key", "create", "alice", **as_service))
        access_key = made.split("access key: ", 1)[1].split()[0]
        secret_key = made.split("secret key: ", 1)[1].split()[0]
        kek = tmp_path / "log" / "auth.kek"                        # made on first use, next to the data
        assert stat.S_IMODE(kek.stat().st_mode) == 0o600 and kek.stat().st_size == 32
        listed = _ok(_cli(address, certs, "user", "sdk-key", "list", "alice", **as_service))
        assert access_key in listed and "user=alice" in listed and secret_key not in listed
        denied = _refused(_cli(address, certs, "user", "sdk-key", "create", "alice", **alice_creds),
                          "PERMISSION_DENIED")
        assert "user 'alice' lacks ADMIN" in denied
        _refused(_cli(address, certs, "user", "sdk-key", "create", "nobody", **as_service), "NOT_FOUND")
        _ok(_cli(address, certs, "user", "sdk-key", "revoke", access_key, **as_service))
        assert "(no SDK keys)" in _ok(_cli(address, certs, "user", "sdk-key", "list", **as_service))
        _refused(_cli(address, certs, "user", "sdk-key", "revoke", access_key, **as_service), "NOT_FOUND")
        _refused(_cli(address, certs, "user", "sdk-key", "revoke", "bad key!", **as_service), "INVALID_ARGUMENT")

        renewed = _ok(_cli(address, certs, "user", "update", "alice", "--new-secret", **as_service))
        new_secret = renewed.split("secret: ", 1)[1].split()[0]
        _refused(_cli(address, certs, "pull", "orders-1", **alice_creds), "UNAUTHENTICATED")
        users = _ok(_cli(address, certs, "user", "list", **as_service))
        assert "alice  kind=normal" in users
        _ok(_cli(address, certs, "user", "delete", "alice", **as_service))
        assert server.stop() == 0
    logged = server.stderr()
    assert "auth.denied" in logged
    server_key = (certs / "server.key").read_text().splitlines()[1]
    for secret in (TOKEN, alice, new_secret, secret_key, "guessed-token", server_key):
        assert secret not in logged, "a secret reached the server's log"
