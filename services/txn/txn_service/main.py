"""Composition root of the Transaction service: ``python -m txn_service.main --data-dir ./data/txn``.

Configuration: flags, then ``MQSTORE_*`` environment variables, then defaults (flags win). Every
service's flags (``--data-dir``, ``--host``, ``--port`` 50053, ...); its own: ``--commitlog`` (env
MQSTORE_COMMITLOG, default 127.0.0.1:50051), ``--internal-token`` (env MQSTORE_INTERNAL_TOKEN: the
commit log's shared secret for CommitLogInternal; prefer the variable), ``--rpc-timeout-ms``,
``--tail-stream-deadline-ms``, and one flag per field of TxnConfig (``--op-batch-max-bytes``,
``--op-batch-interval-ms``, ``--cache-max-entries``, ``--cache-max-bytes``, ``--transaction-timeout-ms``,
``--check-max``, ``--check-interval-ms``, ``--max-open-transactions``, ``--in-doubt-settle-ms``,
``--max-check-streams``, ``--max-transact-streams``, ``--check-answer-workers``, ``--one-way-workers``,
``--metadata-url``, ...) and FollowConfig. Every open CheckBack or Transact stream holds a handler thread, so unless
``--max-workers`` is given the server gets the usual 64 threads plus one per stream it admits.
``MQSTORE_FAILPOINTS`` arms crash points (tests only).

Runs as every service does (mqstore_rpc.service). Until its follower has read the log up to the end it
saw at start, Prepare/Commit/Rollback/CheckBack answer UNAVAILABLE "recovering" (txn.proto), and its
health is NOT_SERVING. The follower holds the commit log's retention below its position (as "txn") and
stops at a gap rather than skip records it never applied (GapPolicy.STOP: health NOT_SERVING, Stats and
the log event ``follower.gap`` say why): the table cannot be rebuilt without them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Mapping, Sequence

import structlog

from mqstore import fs, transactions as tx
from mqstore.clock import Clock, SystemClock
from mqstore.errors import DataLoss, InvalidArgument
from mqstore.follow import FollowConfig, Follower, GapPolicy
from mqstore.format.record import SYSFLAG_TX_COMMIT
from mqstore.model import MessageIn, StoredMessage
from mqstore.topics import OWNER_TRANSACTION
from mqstore_rpc import service
from mqstore_rpc import settings as S
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.server import ManagedServer, ServerConfig

from mqstore.meta.txn_audit import AuditTrail
from mqstore.txn.appender import AppendBatcher
from mqstore.txn.cache import HalfCache
from mqstore.txn.checkback import CheckBack, CheckHub
from mqstore.txn.checker import Checker
from mqstore.txn.config import TxnConfig
from mqstore.txn.coordinator import Coordinator
from mqstore.txn.indoubt import InDoubt
from mqstore.txn.opbatch import OpBatcher
from mqstore.txn.operations import Operations
from mqstore.txn.persist import Checkpointer
from mqstore.txn.projection import TxnProjection
from mqstore.txn.table import TxnTable
from mqstore.txn.transact import TransactStreams

from .servicer import SERVICE_NAME, TransactionServicer, add_to_server

log = structlog.get_logger("txn_service.main")
DEFAULT_PORT = 50053
DEFAULT_COMMITLOG = "127.0.0.1:50051"
FOLLOWED_TOPICS = (tx.HALF_TOPIC, tx.OP_TOPIC, tx.CHECK_MAX_TOPIC)
HOLD_NAME = "txn"  # the commit log holds retention below the follower's position under this name


@dataclasses.dataclass(frozen=True)
class TxnServiceConfig:
    txn: TxnConfig
    server: ServerConfig = ServerConfig()
    commitlog_address: str = DEFAULT_COMMITLOG
    internal_token: str = ""
    follow: FollowConfig = FollowConfig()
    rpc_timeout_ms: int = 10_000
    tail_stream_deadline_ms: int = 60_000
    log_level: str = "info"
    failpoints: str = ""
    clock: Clock | None = None    # tests inject a FakeClock; main() leaves the system clock

    def __post_init__(self) -> None:
        if not self.commitlog_address:
            raise InvalidArgument("commitlog address (--commitlog / MQSTORE_COMMITLOG) must not be empty")
        if self.rpc_timeout_ms <= 0 or self.tail_stream_deadline_ms <= 0:
            raise InvalidArgument("rpc_timeout_ms and tail_stream_deadline_ms must be positive")


class TxnTailSource:
    """The log as the follower sees it: the transaction topics and every COMMIT record; each stream holds
    the commit log's retention below its start (TailRequest.hold_retention_as)."""

    def __init__(self, client: CommitLogClient, linger_ms: int):
        self.client, self.linger_ms = client, linger_ms

    def tail(self, from_physical_offset, *, max_frame_bytes: int, heartbeat_ms: int):
        # linger: once caught up, one frame per linger_ms instead of one per append (fewer wake-ups on
        # both sides; the coordinator changes states itself and waits for the follower only at start)
        return self.client.tail(from_physical_offset, max_frame_bytes=max_frame_bytes, heartbeat_ms=heartbeat_ms,
                                topics=FOLLOWED_TOPICS, tx_types=(SYSFLAG_TX_COMMIT,), linger_ms=self.linger_ms,
                                hold_retention_as=HOLD_NAME)


def compose(config: TxnServiceConfig, parts: service.Composition) -> None:
    """Duties in start order: OP batcher, follower, in-doubt resolver, checker, checkpointer; they stop in
    reverse, then the check-back streams close, the pending OP entries are written, the last checkpoint
    saved and the appender closed."""
    cfg = config.txn
    fs.make_dirs(cfg.data_dir)  # the creation rule (mqstore.fs)
    clock = config.clock or SystemClock()
    client = CommitLogClient(config.commitlog_address, rpc_timeout_s=config.rpc_timeout_ms / 1000,
                             stream_deadline_s=config.tail_stream_deadline_ms / 1000,
                             max_reconnect_backoff_ms=config.follow.backoff_max_ms, peers=parts.peers)
    parts.on_close(client.close)
    audit = AuditTrail(cfg.metadata_url_resolved, wait_timeout_ms=cfg.audit_wait_timeout_ms)
    parts.on_close(audit.close)
    table = TxnTable(cfg.resolved_keep, cfg.max_open_transactions)
    table.on_ready.append(parts.health_changed)
    parts.add_health_problem(lambda: "" if table.ready else "recovering: reading the log up to the end it saw at "
                             "start (Prepare, Commit and Rollback answer UNAVAILABLE until then)")
    checkpointer = Checkpointer(cfg.data_dir / "state.journal", table, clock, cfg.checkpoint_interval_ms)
    base_counters = checkpointer.load()
    if (cfg.data_dir / "state.json").exists():  # the checkpoint of versions before the journal
        log.warning("txn.checkpoint_legacy_ignored", path=str(cfg.data_dir / "state.json"),
                    why="this version keeps state.journal; without one the state is rebuilt from the log (check "
                        "counts are lost); the old file can be deleted")

    def append(topic: str, messages):
        return client.internal_append(topic, messages, writer=OWNER_TRANSACTION, token=config.internal_token)

    appender = AppendBatcher(append, max_messages=cfg.append_max_messages, max_bytes=cfg.append_max_bytes,
                             timeout_s=config.rpc_timeout_ms / 1000)
    parts.on_close(appender.close)
    parts.on_close(checkpointer.close)
    in_doubt = InDoubt(table, lambda: client.store_info().max_physical_offset, clock, cfg.in_doubt_settle_ms)
    ops = OpBatcher(lambda body, offsets: appender.append(tx.OP_TOPIC, [MessageIn(body, tx.OP_TAG, queue_id=0)]),
                    clock, max_bytes=cfg.op_batch_max_bytes, interval_ms=cfg.op_batch_interval_ms,
                    on_written=table.mark_op_written,
                    on_unknown=lambda offsets: in_doubt.add(f"op batch of {len(offsets)}",
                                                            lambda: ops.requeue(table.requeue_op(offsets))))
    parts.on_close(lambda: ops.drain(config.rpc_timeout_ms / 1000))
    parts.add_duty(ops)
    cache: HalfCache[MessageIn] = HalfCache(cfg.cache_max_entries, cfg.cache_max_bytes, parts.metrics)
    coordinator = Coordinator(cfg, table, client, appender, ops, cache, clock, in_doubt)
    parts.add_duty(txn_follower(table, TxnTailSource(client, cfg.follow_linger_ms), config.follow)).register_metrics(
        parts.metrics)
    parts.add_duty(in_doubt)
    hub = CheckHub(cfg.max_check_streams)
    checker = parts.add_duty(Checker(cfg, table, hub, clock, lambda offsets: read_halves(client, offsets),
                                     lambda topic, messages: appender.append(topic, messages), in_doubt.add))
    parts.add_duty(checkpointer)
    checkback = CheckBack(hub, checker, lambda txn_id, decision: decide(coordinator, txn_id, decision),
                          max_streams=cfg.max_check_streams, answer_workers=cfg.check_answer_workers,
                          max_queued_answers=cfg.check_answer_queue)
    checkback.start()
    parts.on_close(lambda: checkback.stop(config.rpc_timeout_ms / 1000))
    parts.add_health_problem(checkback.problem)
    streams = TransactStreams(coordinator, cfg.max_transact_streams, workers=cfg.one_way_workers,
                              max_queued=cfg.one_way_queue, queue_wait_s=config.rpc_timeout_ms / 1000)
    streams.start()
    parts.on_close(lambda: streams.stop(config.rpc_timeout_ms / 1000))
    parts.add_health_problem(streams.problem)
    operations = Operations(cfg, table, coordinator, checker, hub, ops, cache, appender, audit, clock, streams,
                            in_doubt.pending, lambda: in_doubt.settled, base_counters)
    checkpointer.counters = operations.counters
    operations.register_metrics(parts.metrics)
    parts.add_servicer(SERVICE_NAME, lambda server: add_to_server(
        TransactionServicer(coordinator, checkback, operations, streams), server))


def txn_follower(table: TxnTable, source, config: FollowConfig) -> Follower:
    """GapPolicy.STOP: records retention deleted before they were applied cannot be rebuilt (a COMMIT record
    missed would let a transaction be committed twice), so the follower stays and reports it."""
    return Follower("txn-follower", source, TxnProjection(table), config, gap_policy=GapPolicy.STOP)


def decide(coordinator: Coordinator, txn_id: str, decision: str) -> None:
    """A producer's check answer, applied as its Commit or Rollback would be (by "check-back"); a rollback
    does not wait for its OP record (nobody waits for the answer's outcome)."""
    if decision == "COMMIT":
        coordinator.commit(txn_id, by="check-back")
    else:
        coordinator.rollback(txn_id, by="check-back", wait_durable=False)


def read_halves(client: CommitLogClient, offsets: list[int]) -> list[StoredMessage]:
    out = []
    for offset, lookup in zip(offsets, client.get_messages_batch(offsets), strict=True):
        if lookup.message is None:
            raise DataLoss(f"half message at physical offset {offset} cannot be read: {lookup.missing}")
        out.append(lookup.message)
    return out


# ---- configuration ------------------------------------------------------------------------------------

_OWN_FLAGS = {
    "commitlog": f"CommitLog service host:port (default {DEFAULT_COMMITLOG})",
    "rpc_timeout_ms": "timeout of each call to the commit log (default 10000)",
    "tail_stream_deadline_ms": "a Tail stream is re-opened this often (default 60000)",
}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txn_service", description="mqstore Transaction gRPC service")
    S.add_service_flags(parser, DEFAULT_PORT, "data directory (checkpoint, audit database)")
    for name, text in _OWN_FLAGS.items():
        parser.add_argument(S.flag(name), dest=name, help=f"{text}; env {S.env_name(name)}")
    S.add_flags(parser, TxnConfig, skip={"data_dir"})
    S.add_flags(parser, FollowConfig)
    return parser


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> TxnServiceConfig:
    args = build_arg_parser().parse_args(argv)
    txn = TxnConfig(data_dir=S.data_dir(args, env), **S.values_for(args, env, TxnConfig, {"data_dir"}))
    server = S.server_config(args, env, DEFAULT_PORT)
    if S.setting(args, env, "max_workers") is None:  # every open stream holds a handler thread: room for them too
        server = dataclasses.replace(server, max_workers=server_threads(txn))
    return TxnServiceConfig(
        txn=txn,
        server=server,
        commitlog_address=S.typed(args, env, "commitlog", str, DEFAULT_COMMITLOG),
        internal_token=S.internal_token(args, env),
        follow=FollowConfig(**S.values_for(args, env, FollowConfig)),
        rpc_timeout_ms=S.typed(args, env, "rpc_timeout_ms", S.parse_int, 10_000),
        tail_stream_deadline_ms=S.typed(args, env, "tail_stream_deadline_ms", S.parse_int, 60_000),
        log_level=S.log_level(args, env), failpoints=S.failpoints_spec(env))


def server_threads(txn: TxnConfig) -> int:
    """The default handler threads: those of every service, for the unary calls, plus one per stream the
    service admits (CheckBack, Transact), so that open streams never leave a call waiting for a thread."""
    return ServerConfig.max_workers + txn.max_check_streams + txn.max_transact_streams


def describe(config: TxnServiceConfig, port: int) -> dict:
    # The metadata URL may hold a password: only whether it is set.
    txn = dataclasses.asdict(config.txn) | {"metadata_url": "<set>" if config.txn.metadata_url else ""}
    return {"txn": txn, "server": dataclasses.asdict(config.server),
            "follow": dataclasses.asdict(config.follow), "commitlog_address": config.commitlog_address}


SERVICE = service.ServiceDef(SERVICE_NAME, parse_config, compose, describe)


def build_server(config: TxnServiceConfig) -> tuple[ManagedServer, int]:
    return service.build_server(SERVICE, config)


def serving(config: TxnServiceConfig) -> contextlib.AbstractContextManager[tuple[ManagedServer, int]]:
    return service.serving(SERVICE, config)


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(SERVICE, argv)


if __name__ == "__main__":
    sys.exit(main())
