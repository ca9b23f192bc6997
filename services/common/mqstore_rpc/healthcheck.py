"""``python -m mqstore_rpc.healthcheck``: exit 0 when a local mqstore server reports SERVING over gRPC health.

The container health check of docker-compose.yml. It asks ``--address`` if given, else
``127.0.0.1:$MQSTORE_PORT``: the variable the service itself reads for the port to bind, so changing
the port setting moves the check with it. Without either it fails (a check that guesses a port
would test the wrong server). Exit status 0 when the service (``--service``, default "": the server
as a whole) is SERVING; 1 when it is not, is not listening or does not answer within ``--timeout-s``;
one line on stdout says which. 2 for bad arguments.

TLS: when the service serves TLS, the check trusts ``MQSTORE_TLS_CA`` (the same variable the services
read for their calls to each other), presents ``MQSTORE_TLS_CLIENT_CERT``/``_KEY`` when the server
requires client certificates, and checks the name ``MQSTORE_TLS_SERVER_NAME`` when set. Health needs no
credentials, also with authentication on.

Only grpc and grpc_health are imported: Docker runs this every few seconds, so it starts fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mqstore import defaults

DEFAULT_TIMEOUT_S = 3.0


def target(address: str | None, env: Mapping[str, str]) -> str:
    """``address``, else 127.0.0.1 at MQSTORE_PORT; ValueError when neither says where."""
    if address:
        return address
    port = env.get("MQSTORE_PORT", "").strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"no --address and MQSTORE_PORT is {port!r}, not a port number: "
                         f"set one of them to the server's port")
    return defaults.address(int(port))


def _channel(address: str, env: Mapping[str, str]) -> grpc.Channel:
    ca = env.get("MQSTORE_TLS_CA", "")
    if not ca:
        return grpc.insecure_channel(address)
    cert, key = env.get("MQSTORE_TLS_CLIENT_CERT", ""), env.get("MQSTORE_TLS_CLIENT_KEY", "")

    def read(path: str) -> bytes | None:
        with open(path, "rb") as f:
            return f.read()
    credentials = grpc.ssl_channel_credentials(read(ca), read(key) if key else None, read(cert) if cert else None)
    name = env.get("MQSTORE_TLS_SERVER_NAME", "")
    return grpc.secure_channel(address, credentials, [("grpc.ssl_target_name_override", name)] if name else [])


def check(address: str, service: str = "", timeout_s: float = DEFAULT_TIMEOUT_S,
          env: Mapping[str, str] = os.environ) -> str:
    """The health status name (SERVING, NOT_SERVING, ...), or ``UNREACHABLE: <why>``."""
    try:
        channel = _channel(address, env)
    except OSError as exc:
        return f"UNREACHABLE: cannot read a TLS file: {exc}"
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s,
                               wait_for_ready=False)
        except grpc.RpcError as exc:
            return f"UNREACHABLE: {exc.code().name}: {exc.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqstore_rpc.healthcheck",
                                     description="exit 0 when an mqstore server is SERVING (gRPC health)")
    parser.add_argument("--address", help="host:port (default: 127.0.0.1 at $MQSTORE_PORT)")
    parser.add_argument("--service", default="", help="a service name, e.g. mqstore.v1.Index (default: the server)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)
    try:
        address = target(args.address, env)
    except ValueError as exc:
        parser.error(str(exc))
    status = check(address, args.service, args.timeout_s, env)
    print(f"{address} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
