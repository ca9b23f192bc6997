"""The permission table names every RPC of every service the project serves, and nothing else."""

from __future__ import annotations

import importlib
import pathlib
import pkgutil

import mqstore_rpc.gen
from mqstore_rpc.permissions import OPEN_PREFIXES, PERMISSIONS

SERVICES_DIR = pathlib.Path(__file__).resolve().parents[3] / "services"


def _registered() -> str:
    """The project's server code (not the stubs), where a servicer is added to a server."""
    return "\n".join(p.read_text() for p in SERVICES_DIR.rglob("*.py")
                     if "gen" not in p.relative_to(SERVICES_DIR).parts)


def served_methods() -> set[str]:
    """Every RPC of every service of the generated stubs (protos/: mqstore.v1 and the gateway's
    apache.rocketmq.v2) that some server registers (``add_<Name>Servicer_to_server`` in services/): the
    RocketMQ Admin service, which nothing serves, is left out."""
    code = _registered()
    found = set()
    for info in pkgutil.walk_packages(mqstore_rpc.gen.__path__, "mqstore_rpc.gen."):
        if not info.name.endswith("_pb2"):
            continue
        descriptor = importlib.import_module(info.name).DESCRIPTOR
        for service in descriptor.services_by_name.values():
            if f"add_{service.name}Servicer_to_server" in code:
                found |= {f"/{service.full_name}/{method.name}" for method in service.methods}
    return found


def test_every_rpc_has_an_entry_and_every_entry_an_rpc():
    served = served_methods()
    assert {"/mqstore.v1.CommitLog/Append", "/mqstore.v1.Consumer/Receive",
            "/apache.rocketmq.v2.MessagingService/SendMessage"} <= served
    missing = sorted(served - set(PERMISSIONS))
    assert missing == [], f"RPCs with no entry in mqstore_rpc.permissions.PERMISSIONS: {missing}"
    stale = sorted(set(PERMISSIONS) - served)
    assert stale == [], f"entries naming no RPC: {stale}"


def test_only_health_and_reflection_are_open():
    assert all(need is not None for need in PERMISSIONS.values())
    assert OPEN_PREFIXES == ("/grpc.health.v1.Health/", "/grpc.reflection.")
