"""``make run-tls`` with authentication on: the launcher makes a throwaway CA, starts every service with
TLS and auth, and prints how to reach them; the CLI works through it as the banner says, and
``mqstore top --once`` shows every service's figures from its /metrics endpoint."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import subprocess
import sys
import time

import grpc
import pytest

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d, service_pb2 as v2, service_pb2_grpc as v2_grpc

from tests.integration.test_readme import Launcher
from tests.support.ports import service_ports

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]


def test_tls_and_auth_from_the_launcher_and_top(tmp_path):
    ports = service_ports(("commitlog", "index", "txn", "compactor", "gateway"))
    data = tmp_path / "data"
    launcher = Launcher(data, ports, tmp_path / "services.log", ("--tls", "--auth"))
    try:
        banner = launcher.banner()
        ca = data / "tls" / "ca.pem"
        assert f"TLS on: clients trust {ca}" in banner and "authentication on" in banner
        assert f"metrics http://127.0.0.1:{ports['commitlog'] + 100}/metrics" in banner
        env = {**os.environ, "MQSTORE_ADDRESS": f"127.0.0.1:{ports['commitlog']}",
               "MQSTORE_INDEX_ADDRESS": f"127.0.0.1:{ports['index']}",
               "MQSTORE_TXN_ADDRESS": f"127.0.0.1:{ports['txn']}",
               "MQSTORE_COMPACTOR_ADDRESS": f"127.0.0.1:{ports['compactor']}",
               "MQSTORE_GATEWAY_ADDRESS": f"127.0.0.1:{ports['gateway']}", "MQSTORE_TLS_CA": str(ca)}

        def cli(*args: str, **extra: str) -> str:
            done = subprocess.run([sys.executable, "-m", "mqstore_cli", *args], capture_output=True, text=True,
                                  timeout=60, env={**env, **extra})
            assert done.returncode == 0, done.stderr
            return done.stdout

        token = (data / "internal-token").read_text().strip()
        made = cli("user", "create", "ops", "--super", MQSTORE_USER="service", MQSTORE_SECRET=token)
        ops = dict(MQSTORE_USER="ops", MQSTORE_SECRET=made.split("secret: ", 1)[1].split()[0])
        cli("send", "demo", "hello", "--key", "k1", **ops)
        refused = subprocess.run([sys.executable, "-m", "mqstore_cli", "topic", "list"], capture_output=True,
                                 text=True, timeout=60, env=env)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
        # An SDK key made through the CommitLog server opens on the gateway: the launcher gave both one kek file.
        made = cli("user", "sdk-key", "create", "ops", MQSTORE_USER="service", MQSTORE_SECRET=token)
        access_key, secret_key = (made.split(f"{label}: ", 1)[1].split()[0] for label in ("access key", "secret key"))
        assert stat.S_IMODE((data / "auth.kek").stat().st_mode) == 0o600
        date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        digest = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
        signed = (("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
                                    f"Signature={digest}"),
                  ("x-mq-date-time", date), ("x-mq-client-id", "launcher-test"))
        with grpc.secure_channel(f"localhost:{ports['gateway']}",
                                 grpc.ssl_channel_credentials(ca.read_bytes())) as channel:
            route = v2_grpc.MessagingServiceStub(channel).QueryRoute(v2.QueryRouteRequest(
                topic=d.Resource(name="demo"), endpoints=d.Endpoints(
                    scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=ports["gateway"])])),
                metadata=signed, timeout=30)
        assert route.status.code == d.OK and route.message_queues, route
        top = cli("top", "--once", "--interval", "0.5")
        for name in ports:
            assert f"{name:<10} 127.0.0.1:{ports[name] + 100}  up" in top, top
        assert "appends" in top and "follower  index-follower" in top and "txns" in top and "rounds" in top
    finally:
        assert launcher.stop() == 0
