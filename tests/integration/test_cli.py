"""The ``mqstore`` command line as a subprocess against a real CommitLog server process."""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import sys

import pytest

from tests.support.processes import ServiceProcess, commitlog

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
CLI_TIMEOUT_S = 60
MQSTORE = pathlib.Path(sys.executable).with_name("mqstore")  # the console script of pyproject.toml


def server_process(data_dir: pathlib.Path) -> ServiceProcess:
    """``python -m commitlog_service.main`` on port 0 with small, sparse segments."""
    return commitlog(data_dir, "--segment-size-bytes", "64KiB", "--preallocate-segments", "false")


@pytest.fixture
def server(tmp_path):
    srv = server_process(tmp_path / "data")
    try:
        srv.started(START_TIMEOUT_S)
        yield srv
    finally:
        srv.stop()


def run_cli(server, *args: str, stdin: str | None = None, expect: int = 0) -> subprocess.CompletedProcess:
    assert MQSTORE.exists(), f"{MQSTORE} is missing: run `make setup` (pip install -e .)"
    done = subprocess.run([str(MQSTORE), "--address", server.address, *args], input=stdin, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == expect, f"mqstore {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line]


def test_topic_create_list_describe(server):
    assert run_cli(server, "topic", "create", "demo", "--queues", "2").stdout.startswith("created demo  queues=2")
    [listed] = json_lines(run_cli(server, "--json", "topic", "list").stdout)
    assert [t["name"] for t in listed["topics"]] == ["demo"]
    [described] = json_lines(run_cli(server, "--json", "topic", "describe", "demo").stdout)
    assert described["topic"]["queue_count"] == 2 and len(described["queues"]) == 2
    updated = run_cli(server, "topic", "update", "demo", "--queues", "3").stdout
    assert "queues=3" in updated
    run_cli(server, "topic", "delete", "demo")
    assert run_cli(server, "topic", "list").stdout.strip() == "(no topics)"


def test_send_from_stdin_pull_and_get(server):
    run_cli(server, "topic", "create", "lines", "--queues", "1")
    sent = json_lines(run_cli(server, "--json", "send", "lines", "--batch", "2", "--progress",
                              stdin="one\ntwo\nthree\nfour\nfive\n").stdout)
    assert [r["queue_offset"] for r in sent] == [0, 1, 2, 3, 4]

    pulled = run_cli(server, "pull", "lines", "--queue", "0", "--offset", "0", "--max", "10").stdout.splitlines()
    assert [line.rsplit("  ", 1)[1] for line in pulled] == ["one", "two", "three", "four", "five"]
    as_json = json_lines(run_cli(server, "--json", "pull", "lines", "--offset", "3", "--max", "10").stdout)
    assert [base64.b64decode(m["body"]) for m in as_json] == [b"four", b"five"]

    mine = run_cli(server, "get", sent[1]["msg_id"])
    assert f"msg_id: {sent[1]['msg_id']}" in mine.stdout and "body: two" in mine.stdout and mine.stderr == ""
    # The same offset in an id of the store at 10.0.0.7:50051 (README's ids have 127.0.0.1:50051): said so.
    other = "0A000007" + "0000C383" + sent[1]["msg_id"][-16:]
    theirs = run_cli(server, "get", other)
    assert "body: two" in theirs.stdout  # what this store holds at that offset, shown as asked
    assert theirs.stderr.startswith(f"warning: {other} is an id of the store at 10.0.0.7:50051, not of "
                                    f"{server.address}"), theirs.stderr
    [as_json] = json_lines(run_cli(server, "--json", "get", other).stdout)
    assert as_json["id_store_host"] == "10.0.0.7:50051"
    [by_offset] = json_lines(run_cli(server, "--json", "get", "--physical-offset",
                                     str(sent[1]["physical_offset"])).stdout)
    assert by_offset["msg_id"] == sent[1]["msg_id"]


def test_send_arguments_with_keys_tags_properties_and_pull_by_tag(server):
    run_cli(server, "topic", "create", "rich", "--queues", "1")
    run_cli(server, "send", "rich", "hello", "world", "--tag", "greeting", "--key", "k1", "--key", "k2",
            "--property", "lang=en")
    run_cli(server, "send", "rich", "other", "--tag", "misc")
    tagged = json_lines(run_cli(server, "--json", "pull", "rich", "--tag", "greeting").stdout)
    assert [base64.b64decode(m["body"]) for m in tagged] == [b"hello", b"world"]
    assert tagged[0]["keys"] == ["k1", "k2"] and tagged[0]["properties"]["lang"] == "en"
    selected = json_lines(run_cli(server, "--json", "pull", "rich", "--sql", "lang = 'en' OR TAGS = 'misc'",
                                  "--tag", "misc").stdout)
    assert [base64.b64decode(m["body"]) for m in selected] == [b"other"]
    by_sql = json_lines(run_cli(server, "--json", "pull", "rich", "--sql", "KEYS CONTAINS 'k2'").stdout)
    assert [base64.b64decode(m["body"]) for m in by_sql] == [b"hello", b"world"]
    refused = run_cli(server, "pull", "rich", "--sql", "lang IN 'en'", expect=1).stderr
    assert refused.startswith("error: INVALID_ARGUMENT: ") and "column 9: expected '(' after IN" in refused


def test_queue_info_offsets_and_store_info(server):
    run_cli(server, "topic", "create", "q", "--queues", "2")
    run_cli(server, "send", "q", "a", "b", "c", "--queue", "1")
    infos = json_lines(run_cli(server, "--json", "queue-info", "q").stdout)
    assert [(i["queue_id"], i["max_offset"]) for i in infos] == [(0, 0), (1, 3)]
    run_cli(server, "offset", "commit", "q", "--group", "g", "--queue", "1", "--offset", "2")
    assert run_cli(server, "offset", "query", "q", "--group", "g", "--queue", "1").stdout.strip().endswith("offset=2")
    rows = json_lines(run_cli(server, "--json", "offset", "query", "q", "--group", "g").stdout)
    assert [(r["queue_id"], r["offset"]) for r in rows] == [(0, None), (1, 2)]
    missing = run_cli(server, "offset", "query", "q", "--group", "g", "--queue", "0", expect=1)
    assert missing.stderr.startswith("error: NOT_FOUND: ")
    [info] = json_lines(run_cli(server, "--json", "store-info").stdout)
    assert info["flush_mode"] == "ASYNC" and info["max_physical_offset"] > 0
    lower = run_cli(server, "offset-by-time", "q", "--queue", "1", "--time", "0").stdout.strip()
    assert lower == "0"


def test_errors_print_status_and_exit_1(server):
    done = run_cli(server, "pull", "missing", "--offset", "0", expect=1)
    assert done.stderr.startswith("error: NOT_FOUND: topic 'missing' does not exist")
    assert "Traceback" not in done.stderr and done.stdout == ""
    bad = run_cli(server, "topic", "create", "bad name", expect=1)
    assert bad.stderr.startswith("error: INVALID_ARGUMENT: ")


def test_server_stops_cleanly_on_sigterm(server):
    assert server.stop() == 0
    server.wait_for("server.stopped", START_TIMEOUT_S)
    assert server.stdout == ""  # the server prints nothing; it only logs JSON lines on stderr


def test_second_server_on_the_same_data_dir_refuses_to_start(server, tmp_path):
    second = server_process(tmp_path / "data")
    try:
        failed = second.wait_for("server.start_failed", START_TIMEOUT_S)
        assert failed["error"] == "FailedPrecondition" and "in use" in failed["message"]
        assert second.process.wait(STOP_TIMEOUT_S) == 1
    finally:
        second.stop()
    run_cli(server, "topic", "list")  # the first one is unharmed


def test_repair_refuses_a_running_store_and_checks_a_stopped_one(server, tmp_path):
    data_dir = str(tmp_path / "data")
    run_cli(server, "topic", "create", "r", "--queues", "1")
    run_cli(server, "send", "r", "a", "b")
    busy = run_cli(server, "repair", "--data-dir", data_dir, expect=1)
    assert busy.stderr.startswith("error: FAILED_PRECONDITION: ") and "in use" in busy.stderr
    assert server.stop() == 0
    [report] = json_lines(run_cli(server, "--json", "repair", "--data-dir", data_dir).stdout)
    assert report["corrupt"] is False and report["records"] == 2
