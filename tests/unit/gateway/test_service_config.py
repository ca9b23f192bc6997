"""The gateway service's settings: the internal token (born hosts) from the flag or MQSTORE_INTERNAL_TOKEN,
and never in the server.started event's config."""

from __future__ import annotations

import json

from gateway_service.main import describe, parse_config


def test_the_internal_token_comes_from_the_flag_or_the_variable_and_is_never_described():
    from_env = parse_config([], {"MQSTORE_INTERNAL_TOKEN": "env-secret"})
    assert from_env.internal_token == "env-secret"
    from_flag = parse_config(["--internal-token", "flag-secret"], {"MQSTORE_INTERNAL_TOKEN": "env-secret"})
    assert from_flag.internal_token == "flag-secret"
    described = describe(from_flag, 8081)
    # the log renders what JSON cannot (Secret) by repr, as the server.started event does
    assert described["born_host"] == "producer" and "flag-secret" not in json.dumps(described, default=repr)
    assert describe(parse_config([], {}), 8081)["born_host"] == "gateway"


def test_local_mode_is_off_unless_a_gateway_port_is_given_and_takes_gateway_flags():
    from commitlog_service.main import describe as describe_log
    from mqstore_launcher.node import local_mode, parse_config as parse_log
    assert local_mode(parse_log(["--data-dir", "/tmp/x"], {})).gateway is None
    config = parse_log(["--data-dir", "/tmp/x", "--gateway-port", "18081", "--gateway-txn", "10.0.0.1:50053",
                        "--gateway-max-delivery-attempts", "5", "--max-body-bytes", "1MiB"],
                       {"MQSTORE_GATEWAY_MAX_CLIENTS": "7", "MQSTORE_GATEWAY_MAX_CLIENTS_PER_USER": "3"})
    local = local_mode(config).gateway
    assert (local.port, local.txn_address) == (18081, "10.0.0.1:50053")
    assert (local.gateway.max_delivery_attempts, local.gateway.max_clients) == (5, 7)
    # the gateway advertises the body limit the store takes, unless told otherwise
    assert local.gateway.max_body_bytes == config.store.max_body_bytes == 1024 * 1024
    assert describe_log(config, 50051)["gateway"]["port"] == 18081
    from_env = local_mode(parse_log(["--data-dir", "/tmp/x"], {"MQSTORE_GATEWAY_PORT": "0"})).gateway
    # no --gateway-txn: the process's own Transaction port if it serves one, else 127.0.0.1:50053 (at compose)
    assert from_env is not None and from_env.port == 0 and from_env.txn_address == ""


def test_a_local_gateway_reaches_its_own_transaction_port_on_a_reachable_host():
    from gateway_service.composition import _reachable
    assert [_reachable(h) for h in ("0.0.0.0", "::", "", "127.0.0.1", "10.1.2.3", "::1")] == [
        "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "10.1.2.3", "[::1]"]


def test_the_per_user_quotas_are_flags_of_both_modes_and_below_the_client_table():
    import pytest

    from mqstore_launcher.node import local_mode, parse_config as parse_log
    from mqstore.errors import InvalidArgument
    from mqstore.gateway.config import GatewayConfig
    cluster = parse_config(["--max-clients-per-user", "50", "--max-streams-per-user", "5"],
                           {"MQSTORE_MAX_RECEIVES_PER_USER": "7"}).gateway
    assert (cluster.max_clients_per_user, cluster.max_streams_per_user, cluster.max_receives_per_user) == (50, 5, 7)
    local = local_mode(parse_log(["--data-dir", "/tmp/x", "--gateway-port", "0",
                                  "--gateway-max-receives-per-user", "3"], {}))
    assert local.gateway.gateway.max_receives_per_user == 3
    with pytest.raises(InvalidArgument, match="lower --max-clients-per-user"):  # one user would fill the table
        GatewayConfig(max_clients=100, max_clients_per_user=100)
    with pytest.raises(InvalidArgument, match="max_streams_per_user must be positive"):
        GatewayConfig(max_streams_per_user=0)
