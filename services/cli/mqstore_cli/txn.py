"""The Transaction service's commands of the ``mqstore`` command line (registered by ``mqstore_cli.main``).

    mqstore txn begin demo first second --group pg [--id T1] [--key K] [--tag T]   (Prepare: prints the id)
    mqstore txn send demo hello --group pg [--one-way]   (Prepare then Commit on one Transact stream)
    mqstore txn commit T1        mqstore txn rollback T1
    mqstore txn list [--older-than-ms MS] [--group pg]      mqstore txn show T1
    mqstore txn resolve T1 rollback --reason "producer gone" [--operator alice]
    mqstore txn audit [--id T1] [--limit N] [--page-token P]   (ForceResolve's audit trail, oldest first)
    mqstore txn stats

``--txn-address`` (env MQSTORE_TXN_ADDRESS, default 127.0.0.1:50053), before or after the command.
``--json`` prints the ProtoJSON of each response, one object per line. This module must not import
``mqstore_cli.main`` (which imports it).
"""

from __future__ import annotations

import argparse
import getpass
import os
import queue

import grpc

from mqstore import defaults
from mqstore_cli.args import CliError
from mqstore_rpc.endpoints import Failover
from mqstore_rpc.gen.mqstore.v1 import common_pb2, txn_pb2, txn_pb2_grpc

DEFAULT_TXN_ADDRESS = defaults.TXN_ADDRESS
_STATE = {v: k.removeprefix("TRANSACTION_STATE_") for k, v in txn_pb2.TransactionState.items()}
_DECISION = {v: k.removeprefix("DECISION_") for k, v in txn_pb2.Decision.items()}
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}  # a frame's error code -> its name


def _address_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("--txn-address", default=default,
                        help=f"Transaction host:port, or host:port,host:port for an active/standby pair (a call "
                             f"the standby refuses goes to the next) (env MQSTORE_TXN_ADDRESS, default "
                             f"{DEFAULT_TXN_ADDRESS})")


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Add ``txn begin|send|commit|rollback|list|show|resolve|audit|stats`` to the ``mqstore`` parser."""
    _address_option(parser, os.environ.get("MQSTORE_TXN_ADDRESS", DEFAULT_TXN_ADDRESS))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    txn = sub.add_parser("txn", help="transactions through the Transaction service")
    tsub = txn.add_subparsers(dest="txn_command", required=True, metavar="COMMAND")
    for name, func, text in (("begin", cmd_begin, "store messages as one open transaction (Prepare)"),
                             ("send", cmd_send, "Prepare and Commit: the messages become visible together")):
        p = tsub.add_parser(name, help=text)
        p.add_argument("topic")
        p.add_argument("bodies", nargs="+", metavar="BODY")
        p.add_argument("--group", required=True, help="producer group (asked by check-back)")
        p.add_argument("--id", default="", help="transaction id (default: generated)")
        p.add_argument("--key", action="append", default=[], help="a key of each message (repeatable)")
        p.add_argument("--tag", default="", help="the tag of each message")
        if name == "send":
            p.add_argument("--one-way", action="store_true",
                           help="do not wait for the commit's outcome (a failed or lost commit is decided by "
                                "check-back: the producer group must answer it)")
        p.set_defaults(func=func)
    for name, func in (("commit", cmd_commit), ("rollback", cmd_rollback), ("show", cmd_show)):
        p = tsub.add_parser(name, help=f"{name} a transaction by id")
        p.add_argument("transaction_id")
        p.set_defaults(func=func)
    p = tsub.add_parser("list", help="open and parked transactions, oldest first")
    p.add_argument("--older-than-ms", type=int, default=0)
    p.add_argument("--group", default="")
    p.add_argument("--limit", type=int, default=0, help="default 100")
    p.set_defaults(func=cmd_list)
    p = tsub.add_parser("resolve", help="resolve an open or parked transaction by hand (audited)")
    p.add_argument("transaction_id")
    p.add_argument("decision", choices=("commit", "rollback"))
    p.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    p.add_argument("--operator", default="", help="who (default: the login name)")
    p.set_defaults(func=cmd_resolve)
    p = tsub.add_parser("audit", help="the audit trail of resolutions by hand (ForceResolve), oldest first")
    p.add_argument("--id", default="", help="one transaction's entries only")
    p.add_argument("--limit", type=int, default=0, help="entries per page (default 100, at most 1000)")
    p.add_argument("--page-token", default="", help="the next page, as the previous page printed it")
    p.set_defaults(func=cmd_audit)
    p = tsub.add_parser("stats", help="counters: OP batching, cache, check-back, oldest open transaction")
    p.set_defaults(func=cmd_stats)
    for command in (txn, *tsub.choices.values()):
        _address_option(command, argparse.SUPPRESS)


class _Txn:
    """Channels to the Transaction service(s) of ``--txn-address`` for one command: a call a standby refuses
    (UNAVAILABLE) goes to the next (mqstore_rpc.endpoints.Failover). Not thread-safe."""

    def __init__(self, cli):
        self.cli = cli
        self.instances = Failover(cli.args.txn_address, cli.channel, txn_pb2_grpc.TransactionStub,
                                  retried=frozenset({grpc.StatusCode.UNAVAILABLE}))

    def call(self, method: str, request):
        return self.instances.call(method, request, timeout=self.cli.args.timeout)

    def open(self, method: str, requests):
        """A stream on the instance that answered last (the first at the start): (the call, its index for
        ``instances.failed``)."""
        return self.instances.open(method, requests, timeout=self.cli.args.timeout)

    def __enter__(self) -> _Txn:
        return self

    def __exit__(self, *exc) -> None:
        self.instances.close()


def _prepare_request(cli) -> txn_pb2.PrepareRequest:
    a = cli.args
    messages = [common_pb2.MessageInput(body=b.encode("utf-8"), keys=a.key, tags=a.tag) for b in a.bodies]
    return txn_pb2.PrepareRequest(topic=a.topic, messages=messages, producer_group=a.group, transaction_id=a.id)


def _prepare(cli, txn: _Txn) -> txn_pb2.PrepareResponse:
    return txn.call("Prepare", _prepare_request(cli))


def _ended_line(txn_id: str, r: txn_pb2.EndResponse) -> str:
    line = f"transaction {txn_id}: {_STATE[r.state]}{' (already)' if r.already else ''}"
    return "\n".join([line, *(f"  msg_id={m.msg_id} uniq_key={m.uniq_key} queue={m.queue_id} offset={m.queue_offset}"
                              for m in r.results)])


def cmd_begin(cli) -> None:
    with _Txn(cli) as txn:
        p = _prepare(cli, txn)
    cli.emit(p, f"transaction {p.transaction_id}: OPEN ({len(p.halves)} half message(s))")


def _answer(response: txn_pb2.TransactResponse):
    """The frame's response, or its error as the CLI reports a failed call."""
    if response.WhichOneof("kind") == "error":
        raise CliError(_CODE_NAMES.get(response.error.code, str(response.error.code)), response.error.message)
    return getattr(response, response.WhichOneof("kind"))


def cmd_send(cli) -> None:
    """Prepare, then Commit (``--one-way``: not answered), as two frames of one Transact stream; a Prepare
    refused UNAVAILABLE (a standby, or down: nothing was prepared) is sent again on the next instance."""
    with _Txn(cli) as txn:
        for attempt in range(len(txn.instances.addresses)):
            outbox: queue.Queue = queue.Queue()
            answers, index = txn.open("Transact", iter(outbox.get, None))
            try:
                outbox.put(txn_pb2.TransactRequest(request_id=1, prepare=_prepare_request(cli)))
                try:
                    first = next(answers)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == len(txn.instances.addresses):
                        raise
                    txn.instances.failed(index)
                    continue
                if (first.WhichOneof("kind") == "error" and first.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
                        and attempt + 1 < len(txn.instances.addresses)):
                    txn.instances.failed(index)
                    continue
                p = _answer(first)
                outbox.put(txn_pb2.TransactRequest(request_id=2, one_way=cli.args.one_way,
                                                   commit=txn_pb2.EndRequest(transaction_id=p.transaction_id)))
                outbox.put(None)  # the stream ends once the commit frame is handled
                rest = list(answers)
                break
            finally:
                outbox.put(None)
    if cli.args.one_way:
        cli.emit(p, f"transaction {p.transaction_id}: commit sent one-way (not answered; check-back decides it if "
                    f"it failed)")
        return
    r = _answer(rest[0])
    cli.emit(r, _ended_line(p.transaction_id, r))


def cmd_commit(cli) -> None:
    with _Txn(cli) as txn:
        r = txn.call("Commit", txn_pb2.EndRequest(transaction_id=cli.args.transaction_id))
    cli.emit(r, _ended_line(cli.args.transaction_id, r))


def cmd_rollback(cli) -> None:
    with _Txn(cli) as txn:
        r = txn.call("Rollback", txn_pb2.EndRequest(transaction_id=cli.args.transaction_id))
    cli.emit(r, _ended_line(cli.args.transaction_id, r))


def _info_line(t: txn_pb2.TransactionInfo) -> str:
    return (f"{t.transaction_id}  {_STATE[t.state]}  group={t.producer_group}  topic={t.topic}  "
            f"messages={t.message_count}  age_ms={t.age_ms}  checks={t.checks_sent}  "
            f"last_answer={_DECISION[t.last_answer]}" + (f"  resolved_by={t.resolved_by}" if t.resolved_by else ""))


def cmd_show(cli) -> None:
    with _Txn(cli) as txn:
        t = txn.call("Show", txn_pb2.ShowRequest(transaction_id=cli.args.transaction_id))
    cli.emit(t, _info_line(t))


def cmd_list(cli) -> None:
    a = cli.args
    with _Txn(cli) as txn:
        r = txn.call("ListOpen", txn_pb2.ListOpenRequest(older_than_ms=a.older_than_ms, producer_group=a.group,
                                                         limit=a.limit))
    if cli.args.json:
        for t in r.transactions:
            cli.emit(t, "")
    else:
        cli.emit(r, "\n".join(_info_line(t) for t in r.transactions) or "no open transactions")


def cmd_resolve(cli) -> None:
    a = cli.args
    decision = txn_pb2.DECISION_COMMIT if a.decision == "commit" else txn_pb2.DECISION_ROLLBACK
    with _Txn(cli) as txn:
        r = txn.call("ForceResolve", txn_pb2.ForceResolveRequest(
            transaction_id=a.transaction_id, decision=decision, reason=a.reason,
            operator=a.operator or getpass.getuser()))
    cli.emit(r, _ended_line(a.transaction_id, r))


def _audit_line(e: txn_pb2.AuditEntry) -> str:
    return (f"{e.id}  {e.transaction_id}  {_DECISION[e.decision]}  was={_STATE[e.previous_state]}  "
            f"operator={e.operator}  at_ms={e.at_ms}  outcome={e.outcome}  reason={e.reason}")


def cmd_audit(cli) -> None:
    a = cli.args
    with _Txn(cli) as txn:
        r = txn.call("ListAudit", txn_pb2.ListAuditRequest(transaction_id=a.id, limit=a.limit,
                                                           page_token=a.page_token))
    if cli.args.json:
        for e in r.entries:
            cli.emit(e, "")
        return
    lines = [_audit_line(e) for e in r.entries] or ["no audit entries"]
    if r.next_page_token:
        lines.append(f"more: mqstore txn audit --page-token {r.next_page_token}")
    cli.emit(r, "\n".join(lines))


def cmd_stats(cli) -> None:
    with _Txn(cli) as txn:
        s = txn.call("Stats", txn_pb2.TxnStatsRequest())
    cli.emit(s, "\n".join(f"{field.name}: {value}" for field, value in s.ListFields()))
