"""Damage at start, with real CommitLog processes: a record damaged below the checkpoint's flushed
offset (in the re-check window) is cut when it is a torn tail and refuses the start otherwise;
--check-all and MQSTORE_RECHECK_SEGMENTS widen the window; `mqstore check` reports the same verdict
offline; a segment file cut short is padded by `mqstore repair`, as the start's message says."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import grpc
import pytest

from mqstore.format import checkpoint as cpfmt, record
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, common_pb2
from tests.crash.test_kill9 import SEGMENT, _fill_and_stop, _segment, _stub
from tests.support.processes import commitlog

pytestmark = [pytest.mark.crash, pytest.mark.slow]

MQSTORE = pathlib.Path(sys.executable).with_name("mqstore")
CLI_TIMEOUT_S = 120


def _damage(path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def _refused(data, *extra: str, env: dict[str, str] | None = None) -> str:
    """Start a server that must refuse to start; returns its stderr."""
    server = commitlog(data, "--segment-size-bytes", SEGMENT, *extra, env=env)
    try:
        assert server.wait_exit(60) == 1, server.stderr()
        return server.stderr()
    finally:
        server.stop()


def _mqstore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MQSTORE), *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


def test_a_cleanly_stopped_store_with_its_last_record_cut_short_cuts_it(tmp_path):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data)
    last = results[-1]
    path, pos = _segment(data, last.physical_offset)
    _damage(path, pos + 1000, bytes(end - last.physical_offset - 1000))  # zeros after it: a file cut short
    assert cpfmt.decode((data / "checkpoint").read_bytes()).flushed_physical_offset == end
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        cut = [json.loads(line) for line in server.lines if "recovery.torn_tail_truncated" in line]
        assert cut and cut[0]["physical_offset"] == last.physical_offset
        channel, stub = _stub(server.address)
        assert stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).max_physical_offset == last.physical_offset
        again = stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"again")]),
                            timeout=10).results[0]
        assert again.queue_offset == last.queue_offset and again.physical_offset == last.physical_offset
        assert stub.GetMessage(pb.GetMessageRequest(msg_id=results[-2].msg_id), timeout=10).body == bytes([58]) * 2000
        channel.close()
    finally:
        server.stop()


@pytest.mark.parametrize("damage", ["body byte", "TOTALSIZE"])
def test_damage_below_the_checkpoint_refuses_start_naming_file_and_position(tmp_path, damage):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data)
    victim = results[10]
    path, pos = _segment(data, victim.physical_offset)
    _damage(path, pos + 200 if damage == "body byte" else pos,
            b"\x00\xff\x00\xff" if damage == "body byte" else record.INT32.pack(victim.size_bytes * 2))
    stderr = _refused(data)  # the checkpoint is kept: its flushed offset is past the damage
    assert str(path) in stderr and f"position {pos}" in stderr
    assert f"mqstore repair --data-dir {data}" in stderr

    checked = _mqstore("check", "--data-dir", str(data))
    assert checked.returncode == 1, checked.stderr
    assert "verdict: corrupt" in checked.stdout and f"position {pos}" in checked.stdout


def test_check_all_and_a_wider_window_find_damage_older_than_the_last_segments(tmp_path):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data, count=150)  # five segments of 64 KiB
    assert end > 4 * int(SEGMENT)
    victim = results[3]
    path, pos = _segment(data, victim.physical_offset)
    _damage(path, pos + 200, b"\x00\xff")
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()  # the first segment is not re-checked
    try:
        started = [json.loads(line) for line in server.lines if '"store.started"' in line][-1]
        assert started["checked_from"] == 2 * int(SEGMENT)  # segments 2, 3 and 4
        channel, stub = _stub(server.address)
        with pytest.raises(grpc.RpcError) as info:
            stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=3), timeout=10)
        assert info.value.code() == grpc.StatusCode.DATA_LOSS  # found when read, and named
        channel.close()
    finally:
        assert server.stop() == 0
    assert f"position {pos}" in _refused(data, "--check-all")
    assert f"position {pos}" in _refused(data, env={"MQSTORE_RECHECK_SEGMENTS": "5"})


def test_mqstore_check_summarises_a_clean_log(tmp_path):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data)
    checked = _mqstore("--json", "check", "--data-dir", str(data), "--progress")
    assert checked.returncode == 0, checked.stderr
    [report] = [json.loads(line) for line in checked.stdout.splitlines()]
    assert report["verdict"] == "ok" and report["will_start"]
    assert (report["records"], report["bytes_checked"], report["end_offset"]) == (len(results), end, end)
    assert report["segments"] >= 2 and report["segment_size_bytes"] == int(SEGMENT)
    assert "checked" in checked.stderr  # --progress: progress lines on stderr although it is not a TTY
    human = _mqstore("check", "--data-dir", str(data))
    assert human.returncode == 0 and human.stderr == ""
    for line in ("segments:", f"records: {len(results)}", f"bytes: {end}", "time:", "verdict: ok"):
        assert line in human.stdout


def test_a_segment_file_cut_short_is_padded_by_repair_as_the_start_advises(tmp_path):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data)
    victim = results[-2]
    path, pos = _segment(data, victim.physical_offset)
    os.truncate(path, pos + 500)  # the file ends inside the second-to-last record
    advice = f"mqstore repair --data-dir {data} --segment-size-bytes {SEGMENT}"
    assert advice in _refused(data)
    checked = _mqstore("check", "--data-dir", str(data))
    assert checked.returncode == 1 and "verdict: wrong segment size" in checked.stdout

    repaired = _mqstore(*advice.split()[1:])
    assert repaired.returncode == 0, repaired.stderr
    assert path.with_name(path.name + ".broken").stat().st_size == pos + 500
    assert path.stat().st_size == int(SEGMENT)
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        channel, stub = _stub(server.address)
        assert stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).max_physical_offset == victim.physical_offset
        assert stub.GetMessage(pb.GetMessageRequest(msg_id=results[-3].msg_id), timeout=10).body == bytes([57]) * 2000
        channel.close()
    finally:
        server.stop()


def test_mqstore_check_refuses_a_running_store(tmp_path):
    data = tmp_path / "data"
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        busy = _mqstore("check", "--data-dir", str(data))
        assert busy.returncode == 1 and "FAILED_PRECONDITION" in busy.stderr and "stop it first" in busy.stderr
    finally:
        server.stop()
