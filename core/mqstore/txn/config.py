"""The Transaction service's domain settings: one frozen, validated dataclass (each field is a flag)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

from mqstore.errors import InvalidArgument


@dataclass(frozen=True)
class TxnConfig:
    data_dir: pathlib.Path
    # OP records (mqstore.txn.opbatch): written at once when an answer (a Rollback) waits and no OP write is
    # in flight, else with the next write (Nagle's rule); entries nobody waits for at the size or the interval
    op_batch_max_bytes: int = field(default=4096, metadata={
        "help": "an OP message carries at most this many bytes of entries (a full one is written at once)"})
    op_batch_interval_ms: int = field(default=3000, metadata={
        "help": "upper bound on how long an OP entry nobody waits for (a Commit's, a one-way end's, a check-back "
                "decision's) is held to share an OP message; a Rollback's is written at once, or right after "
                "the OP write in flight (Nagle's rule), never behind this timer"})
    cache_max_entries: int = 8000           # half-message cache: entries...
    cache_max_bytes: int = 256 << 20        # ...and bytes of bodies (8000 x 4 MiB would be 32 GiB)
    transaction_timeout_ms: int = 6000      # age (store time) before the first check-back
    check_max: int = 15                     # real checks, then the transaction is parked
    check_interval_ms: int = 30_000         # between two checks of one transaction
    check_rate_per_s: int = 200             # checks sent per producer group per second at most
    check_scan_interval_ms: int = 1000      # how often the check loop looks for due transactions
    append_max_messages: int = 1000         # one Append to the commit log carries at most this...
    append_max_bytes: int = 4 << 20         # ...and this many bytes of bodies (the log's limits)
    checkpoint_interval_ms: int = 1000      # the state snapshot is written this often
    follow_linger_ms: int = 20              # the follower's Tail gathers new records this long per frame
                                            # (nothing waits for the follower once it has caught up at start)
    resolved_keep: int = 100_000            # resolved transactions remembered (idempotent answers)
    max_open_transactions: int = 100_000    # open, being prepared or parked at once; more: RESOURCE_EXHAUSTED
    in_doubt_settle_ms: int = 1000          # an append of unknown outcome is settled from the log end asked
                                            # this long after the failure (a request still inside the
                                            # commit log when the caller gave up has landed by then)
    max_check_streams: int = 64             # CheckBack streams open at once (each holds a reader thread)
    max_transact_streams: int = 64          # Transact streams open at once (each holds a server thread)
    check_answer_workers: int = 8           # check answers applied concurrently...
    check_answer_queue: int = 1000          # ...and queued beyond those (then the stream waits)
    metadata_url: str = ""                  # audit trail database; "" = SQLite in data_dir
    audit_wait_timeout_ms: int = 5000       # a ForceResolve waits at most this for the audit database

    def __post_init__(self) -> None:
        for name in ("op_batch_max_bytes", "op_batch_interval_ms", "transaction_timeout_ms",
                     "check_max", "check_interval_ms", "check_rate_per_s", "check_scan_interval_ms",
                     "append_max_messages", "append_max_bytes", "checkpoint_interval_ms", "resolved_keep",
                     "max_open_transactions", "in_doubt_settle_ms", "max_check_streams", "max_transact_streams",
                     "check_answer_workers",
                     "check_answer_queue", "audit_wait_timeout_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")
        if not 0 <= self.follow_linger_ms <= 1000:
            raise InvalidArgument(f"follow_linger_ms must be in [0, 1000], not {self.follow_linger_ms}")
        if self.cache_max_bytes < 0 or self.cache_max_entries < 0:
            raise InvalidArgument("cache_max_entries and cache_max_bytes must not be negative (0 = no cache)")
        if self.append_max_messages > 1000:
            raise InvalidArgument("append_max_messages is at most 1000 (the commit log's batch limit)")

    @property
    def metadata_url_resolved(self) -> str:
        return self.metadata_url or f"sqlite:///{self.data_dir / 'txn-audit.db'}"
