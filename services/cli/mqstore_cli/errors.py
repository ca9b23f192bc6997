"""The ``mqstore`` command line's error line: ``error: <STATUS>: <message>`` (printed on stderr, exit 1).

UNIMPLEMENTED almost always means the address points at another service (``--address`` at the Index's
port, say): the line then names what the server at that address serves, asked over server reflection
(every mqstore server registers it), instead of grpc's bare "Method not found!":

    error: UNIMPLEMENTED: the server at 127.0.0.1:50052 serves mqstore.v1.Index, not mqstore.v1.CommitLog;
    is --address right?
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mqstore_cli.args import CliError
from mqstore_rpc.errors import status_for

REFLECTION_TIMEOUT_S = 5.0


class Target(NamedTuple):
    """Where a command sends its calls: the argument holding the address, its flag, the gRPC service."""

    attribute: str
    flag: str
    service: str


_COMMITLOG = Target("address", "--address", "mqstore.v1.CommitLog")
_TARGETS = {  # by the first word of the command; everything else talks to the commit log
    "query": Target("index_address", "--index-address", "mqstore.v1.Index"),
    "index-stats": Target("index_address", "--index-address", "mqstore.v1.Index"),
    "txn": Target("txn_address", "--txn-address", "mqstore.v1.Transaction"),
    "compact": Target("compactor_address", "--compactor-address", "mqstore.v1.Compactor"),
    "kv": Target("compactor_address", "--compactor-address", "mqstore.v1.Compactor"),
}


def target_of(args: argparse.Namespace) -> Target:
    return _TARGETS.get(args.command, _COMMITLOG)


def served_services(address: str, timeout_s: float = REFLECTION_TIMEOUT_S) -> list[str]:
    """The gRPC services the server at ``address`` lists over reflection (grpc.RpcError when it does not
    answer reflection)."""
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        for response in stub.ServerReflectionInfo(iter([request]), timeout=timeout_s):
            return [s.name for s in response.list_services_response.service]
    return []  # the stream ended without an answer: nothing listed


def unimplemented_text(exc: grpc.RpcError, args: argparse.Namespace) -> str:
    """What UNIMPLEMENTED means here: which services the server at the command's address serves."""
    target = target_of(args)
    address = getattr(args, target.attribute)
    try:
        names = [n for n in served_services(address) if not n.startswith("grpc.")]
    except grpc.RpcError:
        return (f"the server at {address} does not serve {target.service} (and lists no services over "
                f"reflection: not an mqstore server?); is {target.flag} right?")
    if target.service in names:  # the right service, without this method: a server older than this CLI
        return f"{exc.details()} (the server at {address} serves {target.service}, but not this method: an " \
               f"older version?)"
    serves = ", ".join(names) if names else "no mqstore service"
    return f"the server at {address} serves {serves}, not {target.service}; is {target.flag} right?"


def error_line(exc: BaseException, args: argparse.Namespace | None = None) -> str:
    if isinstance(exc, grpc.RpcError):
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED and args is not None:
            return f"error: UNIMPLEMENTED: {unimplemented_text(exc, args)}"
        return f"error: {exc.code().name}: {exc.details()}"
    if isinstance(exc, CliError):
        return f"error: {exc.status}: {exc}"
    return f"error: {status_for(exc).name}: {exc}"  # the same table the servers use
