"""What a compactor killed during a Spark round leaves is removed at its next start: the job's process
group (a stand-in job here: a process and its child, as the job's Python and Spark's JVM), the request
and job files, the queue's staging/. A real Spark job killed with the compactor: tests/spark."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from compactor_service import spark_runner
from compactor_service.main import serving
from tests.integration.test_compactor_service import compactor_config

pytestmark = [pytest.mark.crash, pytest.mark.integration]

_JOB = ("import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _left_job(queue_dir: pathlib.Path) -> tuple[subprocess.Popen, int]:
    """A running job group and the files a killed compactor leaves with it."""
    job = subprocess.Popen([sys.executable, "-c", _JOB], stdout=subprocess.PIPE, text=True, start_new_session=True)
    worker = int(job.stdout.readline())
    (queue_dir / "staging").mkdir(parents=True)
    (queue_dir / "staging" / "00000000000000000000.log").write_bytes(b"partial")
    topic_dir = queue_dir.parent
    (topic_dir / f".{queue_dir.name}{spark_runner.REQUEST_SUFFIX}").write_text("{}")
    (topic_dir / f".{queue_dir.name}{spark_runner.JOB_SUFFIX}").write_text(json.dumps(spark_runner._identity(job.pid)))
    return job, worker


def test_a_start_kills_the_job_a_killed_compactor_left_and_removes_its_files(tmp_path):
    queue_dir = tmp_path / "compactor" / "logs" / "kv" / "0"
    job, worker = _left_job(queue_dir)
    try:
        assert _alive(job.pid) and _alive(worker)
        with serving(compactor_config(tmp_path / "compactor", 1)):  # no commit log there: reads still serve
            assert not _alive(worker) and job.wait(10) == -9
            assert sorted(p.name for p in (tmp_path / "compactor" / "logs" / "kv").iterdir()) == ["0"]
            assert not (queue_dir / "staging").exists()
    finally:
        for pid in (job.pid, worker):
            if _alive(pid):
                os.kill(pid, 9)
        job.wait(10)
        job.stdout.close()


def test_a_job_file_of_a_process_long_gone_kills_nothing(tmp_path):
    topic_dir = tmp_path / "logs" / "kv"
    topic_dir.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            start_new_session=True)
    identity = spark_runner._identity(gone.pid)
    gone.communicate(b"", timeout=10)
    (topic_dir / f".0{spark_runner.JOB_SUFFIX}").write_text(json.dumps(identity))
    (topic_dir / f".1{spark_runner.JOB_SUFFIX}").write_text("{")  # torn while it was written
    (topic_dir / f".1{spark_runner.REQUEST_SUFFIX}").write_text("{}")
    assert spark_runner.clean_leftovers(tmp_path / "logs") == 0
    assert list(topic_dir.iterdir()) == []
