"""Pop consumption's commands of the ``mqstore`` command line (registered by ``mqstore_cli.main``): the
Consumer service of the commit log (consumer.proto), at ``--address`` like the CommitLog commands.

    mqstore receive demo --group g [--ack] [--batch 32] [--invisible-ms 30000] [--wait-ms 0]
                         [--filter "a || b" | --sql "price > 10"] [--queue Q] [--max-attempts N] [--latest] [--handles]
    mqstore ack demo --group g HANDLE...            (exit 1 when a handle was not acked)
    mqstore change-invisible demo --group g HANDLE --invisible-ms 60000
    mqstore dead-letter demo --group g HANDLE       (ForwardToDeadLetter)
    mqstore pop-stats [demo --group g]
    mqstore group-settings g [--ordered | --unordered]   (shows them; with a flag, sets them first)

``receive`` prints a line per message: where it is stored, its delivery attempt, tags, body and receipt
handle; ``--handles`` prints only the handles, one a line (``| xargs mqstore ack demo --group g``).
``--json`` prints the ProtoJSON of each response, one object per line. This module must not import
``mqstore_cli.main`` (which imports it).
"""

from __future__ import annotations

import argparse


from mqstore_rpc.gen.mqstore.v1 import common_pb2, consumer_pb2, consumer_pb2_grpc

_ACK_STATUS = {v: k.removeprefix("ACK_STATUS_") for k, v in consumer_pb2.AckStatus.items()}


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Add ``receive``, ``ack``, ``change-invisible``, ``dead-letter``, ``pop-stats`` and ``group-settings``."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser("receive", help="pop messages for a consumer group (they are invisible until acked)")
    p.add_argument("topic")
    p.add_argument("--group", required=True)
    p.add_argument("--batch", type=int, default=32, help="messages at most (default 32)")
    p.add_argument("--invisible-ms", type=int, default=30_000, help="until redelivery unless acked (default 30000)")
    p.add_argument("--wait-ms", type=int, default=0, help="long poll when none is ready (default 0)")
    filtering = p.add_mutually_exclusive_group()
    filtering.add_argument("--filter", default="*", help="tag expression: '*' (default) or 'a || b'")
    filtering.add_argument("--sql", default="", help="an SQL92 selector over the message's properties instead of "
                                                     "tags, e.g. \"TAGS IN ('a', 'b') AND price > 10\"")
    p.add_argument("--queue", type=int, default=None, help="one queue only (default: every queue)")
    p.add_argument("--max-attempts", type=int, default=0, help="deliveries before the DLQ (default: the server's, 17)")
    p.add_argument("--latest", action="store_true", help="a group new to a queue starts at its end")
    p.add_argument("--ack", action="store_true", help="ack what was received at once")
    p.add_argument("--handles", action="store_true", help="print only the receipt handles, one a line")
    p.set_defaults(func=cmd_receive)
    p = sub.add_parser("ack", help="ack received messages by receipt handle")
    p.add_argument("topic")
    p.add_argument("handles", nargs="+", metavar="HANDLE")
    p.add_argument("--group", required=True)
    p.set_defaults(func=cmd_ack)
    p = sub.add_parser("change-invisible", help="a new invisible time for a received message (a new handle)")
    p.add_argument("topic")
    p.add_argument("handle")
    p.add_argument("--group", required=True)
    p.add_argument("--invisible-ms", type=int, required=True, help="from now")
    p.set_defaults(func=cmd_change_invisible)
    p = sub.add_parser("dead-letter", help="move a received message to the group's dead-letter topic")
    p.add_argument("topic")
    p.add_argument("handle")
    p.add_argument("--group", required=True)
    p.set_defaults(func=cmd_dead_letter)
    p = sub.add_parser("pop-stats", help="pop consumption's counters; with a topic and --group, that group's state")
    p.add_argument("topic", nargs="?", default="")
    p.add_argument("--group", default="")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("group-settings", help="a consumer group's settings; --ordered makes it an ordered (FIFO) group")
    p.add_argument("group")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--ordered", dest="ordered", action="store_const", const=True, default=None,
                       help="ordered: a message waits while a message of its message group (__SHARDINGKEY, a "
                            "FIFO producer's message_group) is in flight; expired ones come again in place")
    order.add_argument("--unordered", dest="ordered", action="store_const", const=False,
                       help="unordered (the default of a group never set)")
    p.set_defaults(func=cmd_group_settings)


class _Consumer:
    """The Consumer service of the commit log at ``--address`` for one command; in a replication group the
    calls follow the leader a replica names (Cli.call). Not thread-safe."""

    def __init__(self, cli):
        self.cli = cli

    def call(self, method: str, request, extra_timeout_s: float = 0.0):
        return self.cli.call(method, request, extra_timeout_s, service=consumer_pb2_grpc.ConsumerStub)

    def __enter__(self) -> _Consumer:
        return self

    def __exit__(self, *exc) -> None:
        return None  # the Cli closes its channel


def _received_line(m: consumer_pb2.ReceivedMessage) -> str:
    s = m.message
    parts = [f"{s.topic}:{s.queue_id}:{s.queue_offset}", f"attempt={m.delivery_attempt}"]
    if s.tags:
        parts.append(f"tags={s.tags}")
    parts += [s.body.decode("utf-8", "backslashreplace").replace("\n", "\\n"), f"handle={m.receipt_handle}"]
    return "  ".join(parts)


def cmd_receive(cli) -> None:
    a = cli.args
    request = consumer_pb2.ReceiveRequest(
        group=a.group, topic=a.topic, filter_expression=a.sql or a.filter,
        filter_type=common_pb2.FILTER_TYPE_SQL92 if a.sql else common_pb2.FILTER_TYPE_TAG, batch_size=a.batch,
        invisible_duration_ms=a.invisible_ms, long_poll_ms=a.wait_ms, max_attempts=a.max_attempts,
        start=consumer_pb2.POP_START_LATEST if a.latest else consumer_pb2.POP_START_EARLIEST)
    if a.queue is not None:
        request.queue_id = a.queue
    with _Consumer(cli) as consumer:
        response = consumer.call("Receive", request, extra_timeout_s=a.wait_ms / 1000)
        if a.handles:
            cli.out.write("".join(f"{m.receipt_handle}\n" for m in response.messages))
        elif cli.args.json:
            cli.emit(response, "")
        else:
            cli.out.write("".join(_received_line(m) + "\n" for m in response.messages) or "(no message)\n")
        if a.ack and response.messages:
            acked = consumer.call("Ack", consumer_pb2.AckRequest(
                group=a.group, topic=a.topic, receipt_handles=[m.receipt_handle for m in response.messages]))
            _report_acks(cli, acked, quiet=a.handles)


def _report_acks(cli, response: consumer_pb2.AckResponse, quiet: bool = False) -> int:
    """Prints the ack results; returns how many were not OK."""
    failed = [r for r in response.results if r.status != consumer_pb2.ACK_STATUS_OK]
    if cli.args.json:
        cli.emit(response, "")
    elif not quiet:
        ok = len(response.results) - len(failed)
        lines = [f"acked {ok} of {len(response.results)}"]
        lines += [f"  {_ACK_STATUS[r.status]}: {r.message}" for r in failed]
        cli.out.write("\n".join(lines) + "\n")
    return len(failed)


def cmd_ack(cli) -> int:
    a = cli.args
    with _Consumer(cli) as consumer:
        response = consumer.call("Ack", consumer_pb2.AckRequest(group=a.group, topic=a.topic,
                                                                receipt_handles=a.handles))
    return 1 if _report_acks(cli, response) else 0


def cmd_change_invisible(cli) -> None:
    a = cli.args
    with _Consumer(cli) as consumer:
        r = consumer.call("ChangeInvisibleDuration", consumer_pb2.ChangeInvisibleDurationRequest(
            group=a.group, topic=a.topic, receipt_handle=a.handle, invisible_duration_ms=a.invisible_ms))
    cli.emit(r, f"attempt={r.delivery_attempt}  visible again at ms {r.next_visible_time_ms}  "
                f"handle={r.receipt_handle}")


def cmd_dead_letter(cli) -> None:
    a = cli.args
    with _Consumer(cli) as consumer:
        r = consumer.call("ForwardToDeadLetter", consumer_pb2.ForwardToDeadLetterRequest(
            group=a.group, topic=a.topic, receipt_handle=a.handle))
    cli.emit(r, f"moved to {r.dead_letter_topic} queue={r.result.queue_id} offset={r.result.queue_offset}  "
                f"msg_id={r.result.msg_id}")


def cmd_stats(cli) -> None:
    a = cli.args
    with _Consumer(cli) as consumer:
        s = consumer.call("Stats", consumer_pb2.PopStatsRequest(group=a.group, topic=a.topic))
    lines = [f"{field.name}: {value}" for field, value in s.ListFields() if field.name != "queues"]
    lines += [f"  {q.topic} queue={q.queue_id} pop_offset={q.pop_offset} max_offset={q.max_offset} "
              f"in_flight={q.in_flight}" for q in s.queues]
    cli.emit(s, "\n".join(lines) or "(nothing yet)")


def cmd_group_settings(cli) -> None:
    a = cli.args
    with _Consumer(cli) as consumer:
        if a.ordered is None:
            r = consumer.call("GetGroupSettings", consumer_pb2.GetGroupSettingsRequest(group=a.group))
        else:
            r = consumer.call("SetGroupSettings", consumer_pb2.GroupSettings(group=a.group, ordered=a.ordered))
    cli.emit(r, f"group={r.group}  ordered={str(r.ordered).lower()}")
