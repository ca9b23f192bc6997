"""``mqstore receive``, ``ack``, ``change-invisible``, ``dead-letter`` and ``pop-stats`` as subprocesses
against a real CommitLog server process."""

from __future__ import annotations

import pytest

from tests.integration.test_cli import json_lines, run_cli, server  # noqa: F401 - the server fixture

pytestmark = pytest.mark.integration


def test_receive_then_ack_by_handle(server):  # noqa: F811 - the imported fixture
    run_cli(server, "topic", "create", "orders", "--queues", "2")
    run_cli(server, "send", "orders", "paid 1", "paid 2", "--tag", "paid")
    run_cli(server, "send", "orders", "open 3", "--tag", "open")
    out = run_cli(server, "receive", "orders", "--group", "billing", "--filter", "paid").stdout.splitlines()
    assert len(out) == 2 and all("attempt=1" in line and "tags=paid" in line for line in out)
    handles = [line.rsplit("handle=", 1)[1] for line in out]
    acked = run_cli(server, "ack", "orders", "--group", "billing", *handles).stdout
    assert acked.startswith("acked 2 of 2")
    again = run_cli(server, "ack", "orders", "--group", "billing", handles[0], "junk", expect=1).stdout
    assert "acked 0 of 2" in again and "NOT_IN_FLIGHT" in again and "INVALID_HANDLE" in again
    assert run_cli(server, "receive", "orders", "--group", "billing", "--filter", "paid").stdout == "(no message)\n"
    stats = run_cli(server, "pop-stats", "orders", "--group", "billing").stdout
    assert "acked: 2" in stats and "%RETRY%billing+orders queue=0" in stats
    by_sql = run_cli(server, "receive", "orders", "--group", "audit", "--sql", "TAGS <> 'paid'").stdout.splitlines()
    assert len(by_sql) == 1 and "tags=open" in by_sql[0]


def test_receive_with_ack_handles_change_and_dead_letter(server):  # noqa: F811
    run_cli(server, "topic", "create", "jobs", "--queues", "1")
    run_cli(server, "send", "jobs", "a", "b", "c")
    assert run_cli(server, "receive", "jobs", "--group", "w", "--batch", "1", "--ack").stdout.endswith("acked 1 of 1\n")
    (handle,) = run_cli(server, "receive", "jobs", "--group", "w", "--batch", "1", "--handles").stdout.split()
    changed = run_cli(server, "change-invisible", "jobs", handle, "--group", "w", "--invisible-ms", "60000").stdout
    new_handle = changed.rsplit("handle=", 1)[1].strip()
    assert "attempt=1" in changed and new_handle != handle
    error = run_cli(server, "dead-letter", "jobs", handle, "--group", "w", expect=1).stderr
    assert error.startswith("error: FAILED_PRECONDITION: no message is in flight")
    assert "moved to %DLQ%w" in run_cli(server, "dead-letter", "jobs", new_handle, "--group", "w").stdout
    pulled = run_cli(server, "pull", "%DLQ%w").stdout
    assert pulled.rstrip().endswith("b")
    [response] = json_lines(run_cli(server, "--json", "receive", "jobs", "--group", "w").stdout)
    assert [m["message"]["body"] for m in response["messages"]] == ["Yw=="]  # base64 of "c"
    error = run_cli(server, "receive", "jobs", "--group", "w", "--invisible-ms", "1", expect=1).stderr
    assert "INVALID_ARGUMENT" in error and "invisible_duration_ms" in error


def test_an_ordered_group_set_by_group_settings_holds_a_message_group_not_the_queue(server):  # noqa: F811
    assert run_cli(server, "group-settings", "fifo-g").stdout == "group=fifo-g  ordered=false\n"
    assert run_cli(server, "group-settings", "fifo-g", "--ordered").stdout == "group=fifo-g  ordered=true\n"
    assert run_cli(server, "group-settings", "fifo-g").stdout == "group=fifo-g  ordered=true\n"
    run_cli(server, "topic", "create", "steps", "--queues", "1")
    run_cli(server, "send", "steps", "a1", "a2", "--property", "__SHARDINGKEY=A")
    run_cli(server, "send", "steps", "b1", "--property", "__SHARDINGKEY=B")
    first = run_cli(server, "receive", "steps", "--group", "fifo-g", "--batch", "1").stdout
    assert "  a1  " in first
    others = run_cli(server, "receive", "steps", "--group", "fifo-g").stdout.splitlines()
    assert len(others) == 1 and "  b1  " in others[0]  # a2 waits for a1; B flows past it in the same queue
    run_cli(server, "ack", "steps", "--group", "fifo-g", first.rsplit("handle=", 1)[1].strip())
    then = run_cli(server, "receive", "steps", "--group", "fifo-g").stdout.splitlines()
    assert len(then) == 1 and "  a2  " in then[0] and "attempt=1" in then[0]
