"""``mqstore replication status``: who leads, the epoch, the in-sync set and each replica's progress, as
the node at ``--address`` knows it (Replication.GetReplicationState); ``mqstore replication switchover
NODE``: move the leadership to an in-sync replica (Replication.TransferLeadership; replication.proto)."""

from __future__ import annotations

import argparse

import grpc

from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc


def add_commands(parser: argparse.ArgumentParser) -> None:
    # argparse offers no public way to reach a parser's subcommands once they exist.
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    replication = sub.add_parser("replication", help="the commit log's replication group: leader, epoch, in-sync set")
    rsub = replication.add_subparsers(dest="replication_command", required=True, metavar="COMMAND")
    p = rsub.add_parser("status", help="leader, epoch, in-sync set and every replica's lag (any node answers)")
    p.set_defaults(func=cmd_status)
    p = rsub.add_parser("switchover", help="move the leadership to an in-sync replica (TransferLeadership)")
    p.add_argument("target", help="the node id of an in-sync replica")
    p.add_argument("--timeout-ms", type=int, default=10_000, help="how long the target may take to catch up")
    p.set_defaults(func=cmd_switchover)


def cmd_status(cli) -> None:
    stub = replication_pb2_grpc.ReplicationStub(cli.log_channel)
    s = stub.GetReplicationState(replication_pb2.GetReplicationStateRequest(), timeout=cli.args.timeout)
    lines = [f"node {s.node_id or '-'}  role {s.role}  epoch {s.epoch}  end {s.end_offset}"
             f"{'  FENCED (lease not confirmed)' if s.fenced else ''}",
             f"leader {s.leader_id or '-'} at {s.leader_address or '-'}  default replication {s.default_replication}"
             f"  min in-sync {s.min_insync_replicas}"]
    if s.role == "LEADER":
        lines.append(f"in sync: {', '.join(s.in_sync)}")
        for r in s.replicas:
            lines.append(f"  {r.replica_id:<12} {r.address:<22} {'in-sync' if r.in_sync else 'lagging':<8} "
                         f"{'connected' if r.connected else 'away':<9} written {r.written_offset} flushed "
                         f"{r.flushed_offset} lag {r.lag_bytes} B, last ack {r.last_ack_age_ms} ms ago")
    lines.append("epochs: " + ", ".join(f"{e.epoch}@{e.start_offset}" for e in s.epochs))
    cli.emit(s, "\n".join(lines))


def cmd_switchover(cli) -> None:
    stub = replication_pb2_grpc.ReplicationStub(cli.log_channel)
    request = replication_pb2.TransferLeadershipRequest(target_node_id=cli.args.target, timeout_ms=cli.args.timeout_ms)
    try:
        response = stub.TransferLeadership(request, timeout=cli.args.timeout)
    except grpc.RpcError as exc:  # asked a replica: ask the leader it names
        leader = dict(exc.trailing_metadata() or ()).get("mqstore-leader")
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or not leader:
            raise
        with cli.channel(leader) as channel:
            response = replication_pb2_grpc.ReplicationStub(channel).TransferLeadership(request,
                                                                                       timeout=cli.args.timeout)
    cli.emit(response, f"handed over to {cli.args.target} at physical offset {response.handed_over_at_offset}; "
                       f"it leads once elected (a new epoch)")
