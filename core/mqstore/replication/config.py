"""Replication settings of one CommitLog node: frozen, validated, built once in main()."""

from __future__ import annotations

from dataclasses import dataclass, field

from mqstore.errors import InvalidArgument

ASYNC = "ASYNC"
SYNC = "SYNC"
MAX_LINGER_US = 100_000  # replication_linger_us: well inside a heartbeat and the silence watchdog


def fence_margin_s(ttl_s: int) -> float:
    """How long before its lease could lapse in etcd a leader stops acknowledging: 1 s at the default 2 s."""
    return max(1.0, ttl_s * 0.2)


@dataclass(frozen=True)
class ReplicationConfig:
    node_id: str = ""                       # stable id of this node in its group; "" = replication off
    replica_of: str = ""                    # host:port of a fixed leader (static replica, no election)
    advertised_address: str = ""            # host:port other nodes and clients reach this node at
    default_replication: str = ASYNC        # what an Append without a replication mode gets
    min_insync_replicas: int = 1            # copies (leader included) a SYNC append needs in sync
    sync_replication_timeout_ms: int = 5_000  # a SYNC append not confirmed by then: ReplicationTimeout
    isr_max_lag_bytes: int = 64 << 20       # a replica further behind than this is lagging...
    isr_max_lag_ms: int = 3_000             # ...and leaves the in-sync set after lagging this long
    replication_heartbeat_ms: int = 200     # an idle leader's empty data message; the replica acks it
    replication_chunk_bytes: int = 1 << 20  # the most log bytes in one data message (whole records)
    # Coalescing of concurrent appends into one data message per replica (mqstore.replication.leader)
    replication_linger_us: int = field(default=3_000, metadata={"help": (
        "a caught-up replication stream woken by new bytes waits this long first while a SYNC append waits and "
        "its last data message gathered two appends or more (a probe every 16th otherwise, while two SYNC appends "
        "or more wait), ending early once as many SYNC appends wait as did at once lately, so that concurrent "
        "SYNC appends share one data message and one acknowledgement per replica; a lone producer's append goes "
        "at once; while no SYNC append waits, a stream sends at most one data message this long (the appends "
        f"meanwhile gathered into the next); 0 = never; at most {MAX_LINGER_US}")})
    replica_backoff_max_ms: int = 1_000     # a replica reconnects to its leader within this
    replication_data_port: int = field(default=0, metadata={"help": (
        "the port a leader sends each replica the log on, a TCP connection of the stream's own beside its gRPC "
        "call (as RocketMQ's HA port; with the gRPC port's TLS), bound on the gRPC port's host: 0 = any free "
        "port, -1 = none (the log goes on the gRPC stream)")})
    replication_data_address: str = field(default="", metadata={"help": (
        "host:port replicas reach the data port at; \"\" = the advertised address's host and the bound port")})
    etcd_endpoints: str = ""                # host:port[,host:port...]: automatic failover through etcd
    etcd_prefix: str = "/mqstore/commitlog"  # the group's keys: <prefix>/leader, /epoch, /isr, /handover
    lease_ttl_s: int = 2                    # a leader's etcd lease (etcd's smallest); it fences itself 1 s before
    controller_interval_ms: int = 200       # how often each node renews its lease and reads the leader key
    fast_poll_ms: int = 50                  # how often it reads the leader key while the leader is silent or gone
    unclean_election: bool = False          # let an out-of-sync node lead when no in-sync one can (loses data)
    shared_sql_metadata: bool = False       # with etcd_endpoints: accept a SQL metadata/auth database the nodes
                                            # share (one point of failure) instead of etcd:// (the default refuses)

    def __post_init__(self) -> None:
        if self.default_replication not in (ASYNC, SYNC):
            raise InvalidArgument(f"default_replication must be ASYNC or SYNC, not {self.default_replication!r}")
        for name in ("min_insync_replicas", "sync_replication_timeout_ms", "isr_max_lag_bytes", "isr_max_lag_ms",
                     "replication_heartbeat_ms", "replication_chunk_bytes", "replica_backoff_max_ms", "lease_ttl_s",
                     "controller_interval_ms", "fast_poll_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if not 0 <= self.replication_linger_us <= MAX_LINGER_US:
            raise InvalidArgument(f"replication_linger_us must be 0 (off) to {MAX_LINGER_US}, not "
                                  f"{self.replication_linger_us}")
        if not -1 <= self.replication_data_port <= 65535:
            raise InvalidArgument(f"replication_data_port must be a port, 0 (any free one) or -1 (none), not "
                                  f"{self.replication_data_port}")
        host, _, port = self.replication_data_address.rpartition(":")
        if self.replication_data_address and not (host and port.isdigit()):
            raise InvalidArgument(f"replication_data_address must be host:port, not "
                                  f"{self.replication_data_address!r}")
        if self.replica_of and self.etcd_endpoints:
            raise InvalidArgument("give replica_of (a static group) or etcd_endpoints (elections), not both")
        if self.lease_ttl_s < 2:
            raise InvalidArgument(f"lease_ttl_s must be at least 2 (the leader renews it and fences itself a second "
                                  f"before it lapses), not {self.lease_ttl_s}")
        window_ms = 1000 * (self.lease_ttl_s - fence_margin_s(self.lease_ttl_s))
        if self.controller_interval_ms * 4 > window_ms:
            raise InvalidArgument(f"controller_interval_ms must let the leader renew its lease 4 times before it "
                                  f"fences itself ({window_ms:g} ms after a renewal with a {self.lease_ttl_s} s "
                                  f"lease): at most {window_ms // 4:g}, not {self.controller_interval_ms}")
        if self.replica_of and not self.node_id:
            raise InvalidArgument("replica_of needs node_id: every node of a replication group has its own id")

    @property
    def enabled(self) -> bool:
        return bool(self.node_id)
