"""The Transaction service built on a TxnLog (mqstore.txn.log), the same for both deployments: txn_service's
compose (Cluster mode, RemoteTxnLog over gRPC) and :func:`compose_local` (Local mode, LocalTxnLog on the store
of the commit log's process, composed there by mqstore_launcher.node) call :func:`compose_txn`.

Duties in start order: OP batcher, follower, in-doubt resolver, checker, checkpointer; they stop in reverse,
then the check-back streams close, the pending OP entries are written, the last checkpoint saved and the
appender closed (the caller registers the closers of what it made before calling: the client, the store).
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import Executor
from typing import Callable

import grpc
import structlog
from mqstore import fs
from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import InvalidArgument
from mqstore.follow import FollowConfig
from mqstore.meta.txn_audit import AuditTrail
from mqstore.model import MessageIn
from mqstore.txn.appender import AppendBatcher, AppendCounts, DirectAppender, LoopAppendBatcher
from mqstore.txn.cache import HalfCache
from mqstore.txn.checkback import CheckBack, CheckHub
from mqstore.txn.checker import Checker
from mqstore.txn.config import TxnConfig
from mqstore.txn.coordinator import Coordinator
from mqstore.txn.indoubt import InDoubt
from mqstore.txn.log import LocalTxnLog, StoreLike, TxnLog, read_halves
from mqstore.txn.onloop import LoopCalls, PortIo, inline_append
from mqstore.txn.opbatch import OpBatcher, op_writer
from mqstore.txn.operations import Operations
from mqstore.txn.persist import Checkpointer
from mqstore.txn.projection import txn_follower
from mqstore.txn.table import TxnTable
from mqstore.txn.transact import TransactStreams

from mqstore_rpc import service
from mqstore_rpc.server import ServerConfig

from .servicer import SERVICE_NAME, TransactionServicer, add_to_server

log = structlog.get_logger("txn_service.composition")


@dataclasses.dataclass(frozen=True)
class LocalTxnConfig:
    """Local mode: the Transaction service served by the commit log process on its own port (mqstore-commitlog
    ``--txn-port``; ``--txn-data-dir``, ``--txn-<field>`` of TxnConfig, env ``MQSTORE_TXN_*``)."""

    port: int                               # the Transaction port; 0 = any free port (tests)
    txn: TxnConfig                          # data_dir: --txn-data-dir, default <data-dir>/txn
    follow: FollowConfig = FollowConfig()
    rpc_timeout_ms: int = 10_000            # how long a caller waits for its append, as in Cluster mode
    max_workers: int | None = None          # handler threads of the port; None = as txn_service (server_threads)
    clock: Clock | None = None              # tests inject a FakeClock; None = the store's clock

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"txn_port must be in 0..65535, not {self.port}")
        if self.rpc_timeout_ms <= 0:
            raise InvalidArgument(f"txn_rpc_timeout_ms must be positive, not {self.rpc_timeout_ms}")
        if self.max_workers is not None and self.max_workers <= 0:
            raise InvalidArgument(f"txn_max_workers must be positive, not {self.max_workers}")


def server_threads(txn: TxnConfig) -> int:
    """The default handler threads: those of every service, for the unary calls, plus one per stream the
    service admits (CheckBack, Transact), so that open streams never leave a call waiting for a thread."""
    return ServerConfig.max_workers + txn.max_check_streams + txn.max_transact_streams


def compose_local(local: LocalTxnConfig, server: ServerConfig, store: StoreLike, clock: Clock,
                  parts: service.Composition) -> int:
    """Local mode: the Transaction service on this process's store (mqstore.txn.log.LocalTxnLog), served on
    a second port with this server's TLS, authentication and metrics; ``clock`` is the store's (a test's
    ``local.clock`` wins). Returns the bound port."""
    workers = local.max_workers or server_threads(local.txn)
    # The commit log's max_running_handlers, in a pool of the port's own: what runs in the pool (frames and
    # calls that may wait, the other calls) waits for a place there (mqstore_rpc.executor).
    config = dataclasses.replace(server, port=local.port, max_workers=workers,
                                 max_concurrent_rpcs=max(server.max_concurrent_rpcs, workers), metrics_port=None)
    # grpc.aio: Prepare, Commit and Transact's frames are answered on the port's event loop (mqstore_rpc.aio)
    txn_server, add_problem = parts.add_server("txn", config)

    def serve(name: str, register: Callable[[grpc.Server], None]) -> None:
        register(txn_server.grpc_server)
        txn_server.add_service_names([name])

    compose_txn(local.txn, local.follow, local.rpc_timeout_ms, LocalTxnLog(store, local.txn.follow_linger_ms),
                local.clock or clock, parts, serve, add_problem, txn_server.health_changed,
                add_duty=functools.partial(parts.add_duty, health=add_problem), in_process=True,
                loop_pool=txn_server.pool)
    log.info("txn.local", port=txn_server.port, data_dir=str(local.txn.data_dir))
    return txn_server.port


def compose_txn(cfg: TxnConfig, follow: FollowConfig, rpc_timeout_ms: int, txn_log: TxnLog, clock: Clock,
                parts: service.Composition, serve: Callable[[str, Callable[[grpc.Server], None]], None],
                add_health_problem: Callable[[Callable[[], str]], None],
                health_changed: Callable[[], None],
                loop_pool: Executor, add_duty: Callable[[Duty], Duty] | None = None, in_process: bool = False,
                standby: str = "") -> TransactionServicer:
    """Build the Transaction service on ``txn_log``; its closers are ``parts``'; ``serve(name, register)``
    registers the servicer on the server that serves it; ``add_health_problem`` makes that server
    NOT_SERVING while a problem is non-empty, ``health_changed`` re-reads them now; ``add_duty`` registers
    a duty (default ``parts.add_duty``; in Local mode one whose problem turns the Transaction port's health
    only: a follower stopped at a gap must not make the commit log NOT_SERVING); ``in_process``: the log is in
    this process (Local mode): one-way ends are applied before the stream's next frame is read (mqstore.txn.onloop)
    and each caller appends on its own thread, unmerged (mqstore.txn.appender.DirectAppender: the
    append_max_* settings do not apply); ``loop_pool``: the grpc.aio server's handler pool: Prepare, Commit,
    Rollback and Transact are answered on its loop, what may wait runs in this pool (mqstore.txn.onloop.
    LoopCalls); in Cluster mode their appends go through a LoopAppendBatcher over ``txn_log.append_many_async``
    (the AppendBatcher still serves the threads: OP records, check-back answers, calls run in the pool);
    ``standby``: start as a standby of an etcd group (TxnTable.standby, the refusal's text): the follower
    keeps the table warm, it becomes ready once an election (mqstore.txn.election) activates it."""
    add_duty = add_duty or parts.add_duty
    fs.make_dirs(cfg.data_dir)  # the creation rule (mqstore.fs)
    timeout_s = rpc_timeout_ms / 1000
    audit = AuditTrail(cfg.metadata_url_resolved, wait_timeout_ms=cfg.audit_wait_timeout_ms)
    parts.on_close(audit.close)
    table = TxnTable(cfg.resolved_keep, cfg.max_open_transactions)
    table.standby = standby
    table.on_ready.append(health_changed)
    # a standby is healthy (SERVING): it follows the log; its calls answer UNAVAILABLE naming the active one
    add_health_problem(lambda: "" if table.ready or table.standby else "recovering: reading the log up to the end "
                       "it saw at start (Prepare, Commit and Rollback answer UNAVAILABLE until then)")
    checkpointer = Checkpointer(cfg.data_dir / "state.journal", table, clock, cfg.checkpoint_interval_ms)
    base_counters = checkpointer.load()
    if (cfg.data_dir / "state.json").exists():  # the checkpoint of versions before the journal
        log.warning("txn.checkpoint_legacy_ignored", path=str(cfg.data_dir / "state.json"),
                    why="this version keeps state.journal; without one the state is rebuilt from the log (check "
                        "counts are lost); the old file can be deleted")
    if in_process:
        appender: AppendBatcher | DirectAppender = DirectAppender(txn_log.append)
    else:
        appender = AppendBatcher(txn_log.append, max_messages=cfg.append_max_messages,
                                 max_bytes=cfg.append_max_bytes, timeout_s=timeout_s)
    parts.on_close(appender.close)
    parts.on_close(checkpointer.close)
    in_doubt = InDoubt(table, txn_log.max_physical_offset, clock, cfg.in_doubt_settle_ms)
    ops = OpBatcher(op_writer(appender.append), clock, max_bytes=cfg.op_batch_max_bytes,
                    interval_ms=cfg.op_batch_interval_ms, on_written=table.mark_op_written,
                    on_unknown=lambda offsets: in_doubt.add(f"op batch of {len(offsets)}",
                                                            lambda: ops.requeue(table.requeue_op(offsets))))
    parts.on_close(lambda: ops.drain(timeout_s))
    add_duty(ops)
    cache: HalfCache[MessageIn] = HalfCache(cfg.cache_max_entries, cfg.cache_max_bytes, parts.metrics)
    coordinator = Coordinator(cfg, table, txn_log, appender, ops, cache, clock, in_doubt, txn_log.check_writable)
    add_duty(txn_follower(table, txn_log, follow)).register_metrics(parts.metrics)
    add_duty(in_doubt)
    hub = CheckHub(cfg.max_check_streams)
    checker = add_duty(Checker(cfg, table, hub, clock, lambda offsets: read_halves(txn_log, offsets),
                                     lambda topic, messages: appender.append(topic, messages), in_doubt.add))
    add_duty(checkpointer)
    checkback = CheckBack(hub, checker, coordinator.decide,
                          max_streams=cfg.max_check_streams, answer_workers=cfg.check_answer_workers,
                          max_queued_answers=cfg.check_answer_queue, check_ready=coordinator.check_ready)
    checkback.start()
    parts.on_close(lambda: checkback.stop(timeout_s))
    add_health_problem(checkback.problem)
    streams = TransactStreams(coordinator, cfg.max_transact_streams)
    counted: AppendBatcher | DirectAppender | AppendCounts = appender
    if in_process:  # the store's append does not wait (unless loop_blocks): called on the loop
        io = PortIo(inline_append(appender.append), loop_pool, overlaps=False)
        loop_blocks = txn_log.append_waits
    else:  # the loop's own group commit over the client's grpc.aio Append
        loop_appender = LoopAppendBatcher(txn_log.append_many_async, max_messages=cfg.append_max_messages,
                                          max_bytes=cfg.append_max_bytes, timeout_s=timeout_s)
        parts.on_close(loop_appender.close)
        counted = AppendCounts(appender, loop_appender)
        io = PortIo(loop_appender.append, loop_pool, overlaps=True)
        loop_blocks = _never
    operations = Operations(cfg, table, coordinator, checker, hub, ops, cache, counted, audit, clock, streams,
                            in_doubt.pending, lambda: in_doubt.settled, base_counters)
    checkpointer.counters = operations.counters
    operations.register_metrics(parts.metrics)
    servicer = TransactionServicer(checkback, operations, LoopCalls(coordinator, streams, loop_blocks, io))
    servicer.table = table  # an etcd election turns it active or standby (txn_service.main)
    serve(SERVICE_NAME, lambda server: add_to_server(servicer, server))
    return servicer


def _never() -> bool:
    return False

