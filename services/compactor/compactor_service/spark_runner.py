"""Heavy rounds on Spark: the compactor's side of spark/mqstore_spark/round_job.py.

:class:`SparkRunner` is a round engine for CompactionStore.compact (called with the queue's round lock
held, so the sealed segments stay as planned): it writes the job's request, runs the job as a child
process (``python -m mqstore_spark.round_job``: the service never imports pyspark) with PYSPARK_PYTHON
set to this Python and SPARK_LOCAL_IP to loopback unless set, bounded by ``timeout_s``, then
:func:`install_output` checks the manifest against the staged files (inputs are the planned segments,
every output's size and CRC32, the SHA-256 digest) and installs them with QueueLog.install (the swap
every round uses). A job that fails or a manifest that does not check raises: the round fails and the
queue is quarantined like any other failing round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import zlib

from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.qlog import Entries, QueueLog
from mqstore.compaction.qlog_files import STAGING
from mqstore.compaction.rounds import RoundStats
from mqstore.compaction.writer import MANIFEST, manifest_of
from mqstore.errors import DataLoss, Unavailable
from mqstore.format import compaction_segment as cseg, sparse_queue


class SparkRunner:
    """Thread-safe (no state): one child process per round."""

    def __init__(self, config: CompactionConfig, master: str, timeout_s: float, python: str = sys.executable):
        self.config, self.master, self.timeout_s, self.python = config, master, timeout_s, python

    def request(self, qlog: QueueLog, now_ms: int) -> dict:
        bases, _ = qlog.sealed()
        return {"queue_dir": str(qlog.directory), "bases": bases, "cleaned_offset": qlog.cleaned_offset,
                "next_offset": qlog.next_offset(), "now_ms": now_ms, "config": dataclasses.asdict(self.config),
                "staging": str(qlog.directory / STAGING), "master": self.master}

    def __call__(self, qlog: QueueLog, now_ms: int) -> RoundStats:
        request = self.request(qlog, now_ms)
        path = qlog.directory.parent / f".{qlog.queue_id}.spark-request.json"
        path.write_text(json.dumps(request))
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", self.python)
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        try:
            done = subprocess.run([self.python, "-m", "mqstore_spark.round_job", str(path)], env=env,
                                  capture_output=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"the Spark round of {qlog.directory} ran longer than {self.timeout_s} s") from None
        finally:
            path.unlink(missing_ok=True)
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace")[-2000:]
            raise Unavailable(f"the Spark round job failed (exit {done.returncode}): {tail}")
        return install_output(qlog, request["bases"], pathlib.Path(request["staging"]))


def install_output(qlog: QueueLog, bases: list[int], staging: pathlib.Path) -> RoundStats:
    manifest = json.loads((staging / MANIFEST).read_text())
    files = [staging / out["name"] for out in manifest["outputs"]]
    check_manifest(manifest, files, bases)
    entries = Entries()
    for path in files:
        if path.name.endswith(cseg.INDEX_SUFFIX):
            for entry in sparse_queue.decode_all(path.read_bytes())[0]:
                entries.add(entry)
    (staging / MANIFEST).unlink()
    qlog.install(files, entries, manifest["state"], bases, manifest["removed_keys"])
    stats = RoundStats(**manifest["stats"])
    stats.removed_keys = manifest["removed_keys"]
    return stats


def check_manifest(manifest: dict, files: list[pathlib.Path], bases: list[int]) -> None:
    if manifest.get("inputs") != bases:
        raise DataLoss(f"the Spark round's manifest names inputs {manifest.get('inputs')}, the round planned {bases}")
    for out, path in zip(manifest["outputs"], files, strict=True):
        data = path.read_bytes() if path.exists() else None
        if data is None or len(data) != out["size"] or zlib.crc32(data) != out["crc32"]:
            raise DataLoss(f"the Spark round's output {path} is missing or differs from its manifest; not installed")
    if manifest_of(files)["digest"] != manifest["digest"]:
        raise DataLoss("the Spark round's outputs do not match the manifest's digest; not installed")
