"""Ports for processes that a test names before they start, and whose neighbours they use too: each
service's /metrics port is its gRPC port + ``METRICS_PORT_OFFSET`` (mqstore.defaults).

A port from ``bind(("127.0.0.1", 0))`` is free at that moment, but it lies in the kernel's ephemeral range,
so its +100 neighbour may be the source port of any connection a moment later (the other shard's tests
make thousands); the launcher's port check then refused to start, once, in CI. These ports are chosen
below that range, where only an explicit bind takes a port, and each is checked free together with its
/metrics port.
"""

from __future__ import annotations

import pathlib
import random
import socket

from mqstore.defaults import METRICS_PORT_OFFSET

LOWEST = 10_000


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def service_ports(names, besides: int = 0) -> dict[str, int]:
    """A port for each of ``names`` whose /metrics port is free too, all of them (metrics ports included)
    distinct and none ``besides``. Bounded: AssertionError after 1,000 tries for one name."""
    high = _ephemeral_low() - METRICS_PORT_OFFSET - 1
    rng = random.Random()
    ports: dict[str, int] = {}
    used = {besides}
    for name in names:
        for _ in range(1000):
            port = rng.randrange(LOWEST, high)
            pair = {port, port + METRICS_PORT_OFFSET}
            if not pair & used and _bindable(port) and _bindable(port + METRICS_PORT_OFFSET):
                break
        else:
            raise AssertionError(f"no free pair of ports (+{METRICS_PORT_OFFSET}) between {LOWEST} and {high}")
        ports[name] = port
        used |= pair
    return ports
