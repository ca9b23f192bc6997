"""Every default address, port and size limit of mqstore, in one place (issue 33, item 5).

Each flag's default, each client's default address and the launcher's ports come from here; nothing else
spells them (tests/unit/test_defaults.py greps the code for these literals). Changing one here changes
every flag, client and printed default that names it.

  name                      value              what
  ------------------------- ------------------ -------------------------------------------------------------
  HOST                      127.0.0.1          where a service listens and a client looks by default (0.0.0.0
                                               only inside containers, by flag)
  COMMITLOG_PORT            50051              CommitLog (and Local mode's mqstore-commitlog); also the port
                                               an offset message id names by default (StoreConfig.store_port)
  INDEX_PORT                50052              Index
  TXN_PORT                  50053              Transaction
  COMPACTOR_PORT            50054              Compactor
  GATEWAY_PORT              8081               the RocketMQ 5 gateway (RocketMQ's proxy port)
  *_ADDRESS                 HOST:<its port>    what a client or a following service dials by default
  METRICS_PORT_OFFSET       100                /metrics is on the gRPC port + 100 (50151 for the commit log)
  HA_NODE_PORT_STEP         10                 ``make run-ha``: n1 on the commit log port, n2 10 above, n3 20
  ETCD_PORT                 2379               ``make run-ha``'s etcd member e1's client port (etcd's own);
                                               its peer port 1 above; e2 and e3 HA_NODE_PORT_STEP apart
  ETCD_CATALOG_PREFIX       /mqstore/meta      where an HA group keeps its topics, users, rules and SDK keys in
                                               etcd (etcd://members/PREFIX; mqstore_rpc.etcd_meta)
  MAX_MESSAGE_BYTES         64 MiB             a gRPC message, sent or received, on every server and client
  MAX_BODY_BYTES            4 MiB              a message body (the store's and the gateway's max_body_bytes)

This module imports nothing: every layer (core, services, CLI, launcher, bench) may use it.
"""

from __future__ import annotations

MiB = 1 << 20

HOST = "127.0.0.1"

COMMITLOG_PORT = 50051
INDEX_PORT = 50052
TXN_PORT = 50053
COMPACTOR_PORT = 50054
GATEWAY_PORT = 8081


def address(port: int, host: str = HOST) -> str:
    """``host:port``, the form every ``--commitlog``/``--address`` flag takes."""
    return f"{host}:{port}"


COMMITLOG_ADDRESS = address(COMMITLOG_PORT)
INDEX_ADDRESS = address(INDEX_PORT)
TXN_ADDRESS = address(TXN_PORT)
COMPACTOR_ADDRESS = address(COMPACTOR_PORT)
GATEWAY_ADDRESS = address(GATEWAY_PORT)

METRICS_PORT_OFFSET = 100
HA_NODE_PORT_STEP = 10
ETCD_PORT = 2379
ETCD_CATALOG_PREFIX = "/mqstore/meta"

MAX_MESSAGE_BYTES = 64 * MiB
MAX_BODY_BYTES = 4 * MiB
