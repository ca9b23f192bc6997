"""Heavy rounds on Spark: the compactor's side of spark/mqstore_spark/round_job.py.

:class:`SparkRunner` is a round engine for CompactionStore.compact (called with the queue's round lock
held, so the sealed segments stay as planned): it writes the job's request, runs the job as a child
process (``python -m mqstore_spark.round_job``: the service never imports pyspark) with PYSPARK_PYTHON
set to this Python and SPARK_LOCAL_IP to loopback unless set, bounded by ``timeout_s``, then
:func:`mqstore.compaction.staged.install_output` checks the manifest against the staged files (inputs
are the planned segments, every output's size and CRC32, the SHA-256 digest) and installs them with
QueueLog.install (the swap every round uses). Each job logs ``compaction.spark_job`` (the master, the
Spark application's id, which the job prints last on its stdout, and the seconds it took). A job that
fails or a manifest that does not check raises: the round fails and the queue is quarantined like any
other failing round.

The job is a process group of its own (its session: the job's Python, Spark's JVM, the JVM's Python
workers), recorded while it runs in ``<topic dir>/.<queue>.spark-job.json`` (its process group id and
the leader's start time, so that a recycled pid is never taken for it). A job past its timeout is
killed as a group. Whatever a round left in the topic's directory is removed when it ends, and
:func:`clean_leftovers` removes what a killed compactor left, before the compaction logs are opened:

  left by a kill -9 during a Spark round           at the next start
  ------------------------------------------------ ----------------------------------------------------
  ``.<queue>.spark-job.json`` and the job running  the job's process group killed (SIGKILL), file removed
  ``.<queue>.spark-request.json``                  removed
  ``<queue>/staging/`` (the job's output)          removed (qlog_files.clean_directory, on open)
  a round's objects in the tier (``spark-rounds/  deleted (the request names the prefix; it is written
  <id>/``: its inputs, parts, output)              before the first PUT), then the request removed

With a tier (``--spark-tier-url``: mqstore.compaction.tier_round) the runner puts the round's sealed
segments as objects under a fresh prefix before the job, the request names those objects instead of paths,
the job's executors and driver read and write only objects, and the runner fetches the output into the
queue's staging/ (then checks and installs as without a tier) and deletes the prefix when the round ends,
whatever its outcome.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import structlog

from mqstore import fs
from mqstore.compaction import tier_round
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.qlog import QueueLog
from mqstore.compaction.qlog_files import STAGING
from mqstore.compaction.rounds import RoundStats
from mqstore.compaction.staged import check_manifest, install_output  # noqa: F401 - the runner's install
from mqstore.errors import FailedPrecondition, Unavailable
from mqstore.tier.config import TierConfig
from mqstore.tier.objects import ObjectStore

log = structlog.get_logger("compactor_service.spark")
REQUEST_SUFFIX = ".spark-request.json"
JOB_SUFFIX = ".spark-job.json"
KILL_WAIT_S = 10.0  # how long a killed job's processes may take to go


class SparkRunner:
    """Thread-safe (no state): one child process group per round."""

    def __init__(self, config: CompactionConfig, master: str, timeout_s: float, python: str = sys.executable,
                 tier: ObjectStore | None = None, tier_config: TierConfig | None = None):
        self.config, self.master, self.timeout_s, self.python = config, master, timeout_s, python
        self.tier, self.tier_config = tier, tier_config

    def request(self, qlog: QueueLog, now_ms: int) -> dict:
        """The job's request: the queue's sealed segments by path, or (with a tier) by object key under a
        fresh round prefix (put there by :meth:`upload_inputs`)."""
        bases, _ = qlog.sealed()
        request = {"bases": bases, "cleaned_offset": qlog.cleaned_offset, "next_offset": qlog.next_offset(),
                   "now_ms": now_ms, "config": dataclasses.asdict(self.config), "master": self.master}
        if self.tier is None:
            if qlog.tiered:
                raise FailedPrecondition(f"{len(qlog.tiered)} sealed segments of {qlog.directory} are only in the "
                                         f"object storage tier (--tier-url), which executors reading the data dir "
                                         f"cannot see: give --spark-tier-url, or run the round on the local engine")
            return {**request, "queue_dir": str(qlog.directory), "staging": str(qlog.directory / STAGING)}
        return {**request, "tier": tier_round.request_part(self.tier_config, tier_round.new_prefix(), bases)}

    def upload_inputs(self, qlog: QueueLog, request: dict) -> None:
        if "tier" in request:
            tier_round.upload_inputs(self.tier, request["tier"], qlog.directory, qlog.segment_bytes)

    def install(self, qlog: QueueLog, request: dict) -> RoundStats:
        """Check the job's output against its manifest and install it (fetched from the tier first)."""
        staging = qlog.directory / STAGING
        if "tier" in request:
            shutil.rmtree(staging, ignore_errors=True)
            tier_round.download_output(self.tier, request["tier"]["prefix"], staging)
        return install_output(qlog, request["bases"], staging)

    def remove_round(self, qlog: QueueLog, request: dict) -> None:
        shutil.rmtree(qlog.directory / STAGING, ignore_errors=True)  # what a failed job or an installed round left
        if "tier" in request:
            tier_round.remove_round(self.tier, request["tier"]["prefix"])

    def __call__(self, qlog: QueueLog, now_ms: int) -> RoundStats:
        request = self.request(qlog, now_ms)
        request_path = qlog.directory.parent / f".{qlog.queue_id}{REQUEST_SUFFIX}"
        job_path = qlog.directory.parent / f".{qlog.queue_id}{JOB_SUFFIX}"
        if request_path.exists():  # a round whose objects could not be deleted then: now, or this one fails
            _remove_round_objects(request_path, self.tier)
        fs.replace_file(request_path, json.dumps(request).encode())  # before the first PUT: names the prefix
        try:
            self.upload_inputs(qlog, request)
            self._run_job(qlog, request_path, job_path)
            return self.install(qlog, request)
        finally:
            job_path.unlink(missing_ok=True)
            try:
                self.remove_round(qlog, request)
            except Unavailable as exc:  # the round's outcome stands; the request keeps naming its objects
                log.warning("compaction.spark_tier_cleanup_failed", prefix=request["tier"]["prefix"], error=str(exc),
                            why="the next round of the queue or the next start deletes them")
            else:
                request_path.unlink(missing_ok=True)  # last: until the round's objects are gone it names them

    def _run_job(self, qlog: QueueLog, request_path: pathlib.Path, job_path: pathlib.Path) -> None:
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", self.python)
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        started = time.monotonic()
        child = subprocess.Popen([self.python, "-m", "mqstore_spark.round_job", str(request_path)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            fs.replace_file(job_path, json.dumps(_identity(child.pid)).encode())
            out, err = child.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child.pid)
            child.communicate()
            raise Unavailable(f"the Spark round of {qlog.directory} ran longer than {self.timeout_s} s; its job "
                              f"was killed") from None
        except BaseException:
            _kill_group(child.pid)  # the round is failing here: its job must not go on writing into staging/
            child.communicate()
            raise
        if child.returncode != 0:
            tail = err.decode("utf-8", "replace")[-2000:]
            raise Unavailable(f"the Spark round job failed (exit {child.returncode}): {tail}")
        lines = out.decode("utf-8", "replace").split()
        log.info("compaction.spark_job", queue_dir=str(qlog.directory), master=self.master,
                 app_id=lines[-1] if lines else "", seconds=round(time.monotonic() - started, 1))


# ---- the job's process group, and what a killed compactor left ------------------------------------------

def clean_leftovers(logs_dir: pathlib.Path, tier: ObjectStore | None = None) -> int:
    """Kill the Spark jobs a killed compactor left running, delete the tier objects of their rounds (``tier``:
    the store of --spark-tier-url) and remove their request and job files (before the compaction logs are
    opened: a job left running would write into a queue's staging/). Returns the number of jobs killed."""
    killed = 0
    if not logs_dir.is_dir():
        return 0
    for topic_dir in sorted(p for p in logs_dir.iterdir() if p.is_dir()):
        for job_path in sorted(topic_dir.glob(f".*{JOB_SUFFIX}")):
            killed += _kill_recorded(job_path)
            job_path.unlink()
        for request_path in sorted(topic_dir.glob(f".*{REQUEST_SUFFIX}")):
            try:
                _remove_round_objects(request_path, tier)
            except Unavailable as exc:  # the tier is down: start all the same; the queue's next round deletes them
                log.warning("compaction.spark_tier_cleanup_failed", file=str(request_path), error=str(exc),
                            why="kept: the queue's next round or the next start deletes the round's objects")
                continue
            request_path.unlink()
            log.warning("compaction.spark_leftover_removed", file=str(request_path),
                        why="a Spark round was cut short (the compactor was killed)")
    return killed


def _remove_round_objects(request_path: pathlib.Path, tier: ObjectStore | None) -> None:
    """Delete the tier objects of the round ``request_path`` describes (none for a round on paths)."""
    try:
        round_tier = json.loads(request_path.read_bytes()).get("tier")
    except ValueError:  # torn: written before the first PUT (fs.replace_file), so no object was put
        return
    if not round_tier:
        return
    if tier is None or tier.url != round_tier["url"]:
        log.warning("compaction.spark_tier_leftover_kept", url=round_tier["url"], prefix=round_tier["prefix"],
                    why="the round's tier is not this compactor's --spark-tier-url; delete the prefix by hand")
        return
    removed = tier_round.remove_round(tier, round_tier["prefix"])
    log.warning("compaction.spark_tier_leftover_removed", url=tier.url, prefix=round_tier["prefix"],
                objects=removed, why="a Spark round was cut short (the compactor was killed)")


def _kill_recorded(job_path: pathlib.Path) -> int:
    try:
        job = json.loads(job_path.read_bytes())
        pgid, boot_id, start_ticks = int(job["pgid"]), str(job["boot_id"]), int(job["start_ticks"])
    except (ValueError, KeyError, TypeError) as exc:  # a torn file: the job never got past its first second
        log.warning("compaction.spark_job_file_unreadable", file=str(job_path), error=str(exc))
        return 0
    if boot_id != _boot_id():
        return 0  # written before a reboot: that job is gone
    members = _group_members(pgid, start_ticks)
    if not members:
        return 0
    log.warning("compaction.spark_job_killed", file=str(job_path), pgid=pgid, processes=len(members),
                why="a Spark round of a compactor that was killed was still running")
    _kill_group(pgid, start_ticks)
    return 1


def _identity(pid: int) -> dict:
    """What tells this job's process group from a later one with a recycled id."""
    return {"pgid": pid, "boot_id": _boot_id(), "start_ticks": _stat(pid)[2]}


def _boot_id() -> str:
    return pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stat(pid: int) -> tuple[str, int, int]:
    """(state, process group id, start time in clock ticks since boot) of a process; OSError when gone."""
    text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ... starttime
    return fields[0], int(fields[2]), int(fields[19])


def _group_members(pgid: int, not_before_ticks: int) -> list[int]:
    """Live processes (not zombies) of group ``pgid`` started no earlier than its leader (the job's own)."""
    members = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, group, started = _stat(int(entry.name))
        except (OSError, ValueError):
            continue  # gone meanwhile
        if group == pgid and started >= not_before_ticks and state != "Z":
            members.append(int(entry.name))
    return members


def _kill_group(pgid: int, not_before_ticks: int = 0) -> None:
    """SIGKILL the process group and wait (at most KILL_WAIT_S) until its processes are gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + KILL_WAIT_S
    pause = threading.Event()
    while _group_members(pgid, not_before_ticks) and time.monotonic() < deadline:
        pause.wait(0.02)
