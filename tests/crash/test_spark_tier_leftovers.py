"""A Spark round through the tier (--spark-tier-url) leaves nothing in the tier, whatever stops it: a compactor
killed (kill -9) while the round's job runs, after its inputs were put, leaves a request naming the round's
prefix, and the next start deletes every object under it (and kills the job); a round that cannot delete its
objects when it ends keeps its request, and the next round of the queue deletes them first. The job is a
stand-in (a process that sleeps, or fails): what is tested is the compactor's side; a real job on the tier is
tests/spark/test_spark_tier.py's."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from compactor_service import spark_runner
from compactor_service.main import serving
from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.compaction import tier_round
from mqstore.errors import Unavailable
from mqstore.tier.config import TierConfig
from mqstore.tier.objects import ObjectStore
from mqstore.tier.urls import open_store
from tests.integration.test_compactor_service import compactor_config
from tests.support.compaction import BASE_MS, put
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.integration]
CONFIG = CompactionConfig(segment_size_bytes=4096)
ROOT = pathlib.Path(__file__).resolve().parents[2]

# The compactor's side of one round (SparkRunner with the tier), in a process of its own to kill.
_ROUND = """
import pathlib, sys
from compactor_service.spark_runner import SparkRunner
from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.tier.config import TierConfig
from mqstore.tier.objects import ObjectStore
from mqstore.tier.urls import open_store
logs, url, job = sys.argv[1:4]
config = CompactionConfig(segment_size_bytes=4096)
store = CompactionStore(pathlib.Path(logs), config, FakeClock(1_700_000_100_000))
runner = SparkRunner(config, "local[1]", 600, python=job, tier=open_store(url, timeout_ms=10_000),
                     tier_config=TierConfig(tier_url=url))
store.compact(store.slot("kv", 0), engine="spark", runner=runner)
"""


def _fill(logs: pathlib.Path) -> None:
    store = CompactionStore(logs, CONFIG, FakeClock(BASE_MS))
    for offset in range(150):
        put(store, f"k{offset % 5}", b"v" * 60, offset, BASE_MS + offset)
    store.slot("kv", 0).qlog.seal_active()
    store.close()


def _job(tmp_path: pathlib.Path, body: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _objects(url: str) -> list[str]:
    store = open_store(url, timeout_ms=10_000)
    try:
        return [info.key for info in store.list("")]
    finally:
        store.close()


def test_a_start_deletes_the_tier_objects_of_a_round_whose_compactor_was_killed(tmp_path):
    data_dir, url = tmp_path / "compactor", f"file://{tmp_path / 'tier'}"
    (tmp_path / "tier").mkdir()
    logs, topic_dir = data_dir / "logs", data_dir / "logs" / "kv"
    _fill(logs)
    job_file = topic_dir / f".0{spark_runner.JOB_SUFFIX}"
    compactor = subprocess.Popen([sys.executable, "-c", _ROUND, str(logs), url, _job(tmp_path, "exec sleep 600")],
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    identity = None
    try:
        identity = wait_until(lambda: job_file.exists() and json.loads(job_file.read_text() or "{}"),
                              "the round's job to start", timeout_s=60)
        left = _objects(url)
        assert left and all(key.startswith(f"{tier_round.ROUNDS}/") and "/input/" in key for key in left)
        compactor.kill()  # SIGKILL: the round's prefix and its job outlive it
        compactor.wait(10)
        assert spark_runner._group_members(identity["pgid"], identity["start_ticks"])
        config = dataclasses.replace(compactor_config(data_dir, 1, segment_size_bytes=4096),
                                     spark_tier=TierConfig(tier_url=url))
        with serving(config):  # no commit log there: the start cleans all the same
            assert _objects(url) == []
            assert not spark_runner._group_members(identity["pgid"], identity["start_ticks"])
            assert not list(topic_dir.glob(".0.spark-*"))
    finally:
        if compactor.poll() is None:
            compactor.kill()
        compactor.wait(10)
        compactor.stderr.close()
        if identity and spark_runner._group_members(identity["pgid"], 0):
            os.killpg(identity["pgid"], signal.SIGKILL)


def test_the_next_round_deletes_what_a_round_could_not(tmp_path):
    logs, url = tmp_path / "logs", f"file://{tmp_path / 'tier'}"
    (tmp_path / "tier").mkdir()
    _fill(logs)
    tier = open_store(url, timeout_ms=10_000)
    store = CompactionStore(logs, CONFIG, FakeClock(BASE_MS + 100_000))
    try:
        runner = spark_runner.SparkRunner(CONFIG, "local[1]", 60, python=_job(tmp_path, "exit 3"), tier=tier,
                                          tier_config=TierConfig(tier_url=url))
        slot = store.slot("kv", 0)
        old = runner.request(slot.qlog, BASE_MS)
        request_path = logs / "kv" / f".0{spark_runner.REQUEST_SUFFIX}"
        request_path.write_text(json.dumps(old))  # a round whose objects could not be deleted (tier down)
        runner.upload_inputs(slot.qlog, old)
        assert _objects(url)
        with pytest.raises(Unavailable, match="exit 3"):
            runner(slot.qlog, BASE_MS + 100_000)
        assert _objects(url) == [] and not request_path.exists()  # the old round's objects and this one's
    finally:
        store.close()
        tier.close()


class _DownBackend:
    """A store that fails every call (the tier down): ObjectStore makes each failure Unavailable."""

    def __getattr__(self, name):
        def fail(*args):
            raise ConnectionRefusedError("the tier is down")
        return (lambda: None) if name == "close" else fail


def test_a_start_with_the_tier_down_starts_and_keeps_the_request_naming_the_objects(tmp_path):
    url = f"file://{tmp_path / 'tier'}"
    topic_dir = tmp_path / "logs" / "kv"
    topic_dir.mkdir(parents=True)
    request_path = topic_dir / f".0{spark_runner.REQUEST_SUFFIX}"
    request_path.write_text(json.dumps({"tier": {"url": url, "prefix": "spark-rounds/left"}}))
    down = ObjectStore(url, _DownBackend(), timeout_ms=5_000)
    try:
        assert spark_runner.clean_leftovers(tmp_path / "logs", down) == 0  # no Unavailable: the start goes on
    finally:
        down.close()
    assert request_path.exists()  # the next round of the queue (or start) deletes the objects, then the file
