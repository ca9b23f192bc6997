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
