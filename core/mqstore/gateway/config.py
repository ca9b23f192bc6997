"""The gateway's domain settings: one frozen, validated dataclass (each field is a flag of the service)."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore import defaults
from mqstore.errors import InvalidArgument

MiB = 1024 * 1024


@dataclass(frozen=True)
class GatewayConfig:
    # Clients: every one is known by its x-mq-client-id; one not heard of for client_ttl_ms is forgotten
    # (its Telemetry stream closed). The clients heartbeat every 10 s.
    max_clients: int = 10_000
    client_ttl_ms: int = 120_000
    telemetry_outbox_limit: int = 1_000     # commands queued for one client's Telemetry stream
    # Per user, with authentication on (a client id belongs to the user who first presented it), so that
    # one user cannot deny another; over a quota that user's call gets TOO_MANY_REQUESTS. Each Telemetry
    # stream and each long poll holds a handler thread (--max-workers, 256): one user's streams plus
    # receives should stay well below it. Without authentication there are no users and no quotas.
    max_clients_per_user: int = 1_000       # client ids (sessions); must be below max_clients
    max_streams_per_user: int = 64          # open Telemetry streams
    max_receives_per_user: int = 64         # ReceiveMessage long polls in flight
    # Publishing: advertised to producers as publishing.max_body_size, and refused above it (must not
    # exceed the commit log's max_body_bytes, 4 MiB by default).
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    topic_cache_ms: int = 5_000             # how long a DescribeTopic answer is reused for routes and sends
    # A send the commit log refused without writing it (an election: no leader yet, or one not yet confirmed)
    # is sent again for up to this long, ending 0.5 s before the client's deadline; 0: never (publishing.py)
    send_leader_wait_ms: int = 3_000
    # Consuming (clamped as the Java proxy clamps them)
    long_poll_min_ms: int = 5_000
    long_poll_max_ms: int = 20_000
    long_poll_reserve_ms: int = 100         # a receive answers this long before the client's deadline
    receive_batch_max: int = 32
    max_delivery_attempts: int = 17         # deliveries before the DLQ (RocketMQ: 16 retries + the first)
    auto_renew_invisible_ms: int = 60_000   # invisible time of a receive with auto_renew (push consumers)
    # ... renewed by that much again when within auto_renew_ahead_ms of its end, for at most
    # auto_renew_max_ms after the receive (the proxy: 10 s ahead, 3 h), for at most auto_renew_max_messages
    auto_renew_ahead_ms: int = 10_000
    auto_renew_max_ms: int = 3 * 3_600_000
    auto_renew_max_messages: int = 100_000
    # Check-back
    max_checkback_topics: int = 1_000       # CheckBack streams to the Transaction service at once
    pending_checks_max: int = 10_000        # checks relayed and not yet answered, remembered (oldest dropped)
    checkback_retry_max_ms: int = 5_000     # backoff cap when the Transaction service cannot be reached

    def __post_init__(self) -> None:
        for name in ("max_clients", "client_ttl_ms", "telemetry_outbox_limit", "max_clients_per_user",
                     "max_streams_per_user", "max_receives_per_user", "max_body_bytes", "topic_cache_ms",
                     "long_poll_min_ms", "long_poll_max_ms", "receive_batch_max", "max_delivery_attempts",
                     "auto_renew_invisible_ms", "auto_renew_ahead_ms", "auto_renew_max_ms", "auto_renew_max_messages",
                     "max_checkback_topics", "pending_checks_max",
                     "checkback_retry_max_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if self.send_leader_wait_ms < 0:
            raise InvalidArgument(f"send_leader_wait_ms must be 0 (never wait) or positive, not "
                                  f"{self.send_leader_wait_ms}")
        if self.max_clients_per_user >= self.max_clients:
            raise InvalidArgument(f"max_clients_per_user ({self.max_clients_per_user}) must be below max_clients "
                                  f"({self.max_clients}): one user must not be able to fill the client table; "
                                  f"lower --max-clients-per-user or raise --max-clients")
        if self.long_poll_min_ms > self.long_poll_max_ms:
            raise InvalidArgument(f"long_poll_min_ms ({self.long_poll_min_ms}) must not exceed long_poll_max_ms "
                                  f"({self.long_poll_max_ms})")
        if not 0 <= self.long_poll_reserve_ms < self.long_poll_min_ms:
            raise InvalidArgument(f"long_poll_reserve_ms must be in [0, long_poll_min_ms), not "
                                  f"{self.long_poll_reserve_ms}")
        if self.auto_renew_ahead_ms >= self.auto_renew_invisible_ms:
            raise InvalidArgument(f"auto_renew_ahead_ms ({self.auto_renew_ahead_ms}) must be less than "
                                  f"auto_renew_invisible_ms ({self.auto_renew_invisible_ms}): a renewal comes that "
                                  f"long before the invisible time ends")
        if self.max_body_bytes > defaults.MAX_MESSAGE_BYTES:
            raise InvalidArgument(f"max_body_bytes is at most {defaults.MAX_MESSAGE_BYTES // MiB} MiB (the gRPC "
                                  f"message limit), not "
                                  f"{self.max_body_bytes}")
        if self.max_delivery_attempts > 1000:
            raise InvalidArgument(f"max_delivery_attempts is at most 1000, not {self.max_delivery_attempts}")
