"""The permission table names every RPC of every service the project serves, and nothing else."""

from __future__ import annotations

import importlib
import pkgutil

import mqstore_rpc.gen
from mqstore_rpc.permissions import OPEN_PREFIXES, PERMISSIONS


def served_methods() -> set[str]:
    """Every RPC of every service in the generated stubs (protos/, and any other package generated
    into mqstore_rpc.gen: the gateway's apache.rocketmq.v2 once it is there)."""
    found = set()
    for info in pkgutil.walk_packages(mqstore_rpc.gen.__path__, "mqstore_rpc.gen."):
        if not info.name.endswith("_pb2"):
            continue
        descriptor = importlib.import_module(info.name).DESCRIPTOR
        for service in descriptor.services_by_name.values():
            found |= {f"/{service.full_name}/{method.name}" for method in service.methods}
    return found


def test_every_rpc_has_an_entry_and_every_entry_an_rpc():
    served = served_methods()
    assert "/mqstore.v1.CommitLog/Append" in served
    missing = sorted(served - set(PERMISSIONS))
    assert missing == [], f"RPCs with no entry in mqstore_rpc.permissions.PERMISSIONS: {missing}"
    stale = sorted(set(PERMISSIONS) - served)
    assert stale == [], f"entries naming no RPC: {stale}"


def test_only_health_and_reflection_are_open():
    assert all(need is not None for need in PERMISSIONS.values())
    assert OPEN_PREFIXES == ("/grpc.health.v1.Health/", "/grpc.reflection.")
