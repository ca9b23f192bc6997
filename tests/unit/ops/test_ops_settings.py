"""The operations settings every service has (mqstore_rpc.settings): metrics port, TLS files, auth, and
that no secret shows where the configuration is logged."""

from __future__ import annotations

import dataclasses
import json

import pytest

from commitlog_service.main import parse_config
from mqstore.errors import InvalidArgument


def test_metrics_port_defaults_to_the_grpc_port_plus_100_and_can_be_moved_or_turned_off(tmp_path):
    base = ["--data-dir", str(tmp_path)]
    assert parse_config(base, {}).server.metrics_port == 50151
    assert parse_config([*base, "--port", "7000"], {}).server.metrics_port == 7100
    assert parse_config([*base, "--port", "0"], {}).server.metrics_port is None      # tests: none unless asked
    assert parse_config([*base, "--metrics-port", "0"], {}).server.metrics_port == 0  # any free port
    assert parse_config(base, {"MQSTORE_METRICS_PORT": "off"}).server.metrics_port is None
    with pytest.raises(InvalidArgument, match="metrics_port"):
        parse_config([*base, "--metrics-port", "eighty"], {})


def test_tls_settings_are_checked_when_read(tmp_path, certs_dir):
    base = ["--data-dir", str(tmp_path)]
    with pytest.raises(InvalidArgument, match="tls_key"):
        parse_config([*base, "--tls-cert", str(certs_dir / "server.pem")], {})
    with pytest.raises(InvalidArgument, match="tls_client_ca needs tls_cert"):
        parse_config([*base, "--tls-client-ca", str(certs_dir / "ca.pem")], {})
    with pytest.raises(InvalidArgument, match="cannot read"):
        parse_config([*base, "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key",
                      str(certs_dir / "server.key")], {})
    with pytest.raises(InvalidArgument, match="not a PEM file"):
        (tmp_path / "x.pem").write_text("hello")
        parse_config([*base, "--tls-cert", str(tmp_path / "x.pem"), "--tls-key", str(certs_dir / "server.key")], {})
    config = parse_config([*base, "--tls-cert", str(certs_dir / "server.pem"), "--tls-key",
                           str(certs_dir / "server.key"), "--tls-client-ca", str(certs_dir / "ca.pem")], {})
    assert config.server.tls.mutual


def test_auth_turns_on_with_one_setting_and_the_logged_config_holds_no_secret(tmp_path, certs_dir):
    env = {"MQSTORE_AUTH": "on", "MQSTORE_INTERNAL_TOKEN": "the-internal-token-123",
           "MQSTORE_AUTH_URL": "postgresql+psycopg2://mq:db-password-456@db/mq"}
    config = parse_config(["--data-dir", str(tmp_path), "--tls-cert", str(certs_dir / "server.pem"),
                           "--tls-key", str(certs_dir / "server.key")], env)
    assert config.server.auth.enabled and config.server.peers.user == "service"
    assert parse_config(["--data-dir", str(tmp_path), "--auth"], {}).server.auth.enabled
    assert not parse_config(["--data-dir", str(tmp_path)], {}).server.auth.enabled
    logged = json.dumps(dataclasses.asdict(config.server), default=str)  # as server.started logs it
    key_line = (certs_dir / "server.key").read_text().splitlines()[1]
    for secret in ("the-internal-token-123", "db-password-456", key_line):
        assert secret not in logged
    assert "<secret>" in logged


@pytest.fixture(scope="module")
def certs_dir(tmp_path_factory):
    from mqstore_rpc.tls_certs import make_ca
    return make_ca(tmp_path_factory.mktemp("tls"))
