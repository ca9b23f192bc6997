"""A round staged by another process (the Spark job): its manifest checked against the staged files, then
installed with QueueLog.install (the swap every round uses) in place of the planned sealed segments from
the manifest's ``rewritten_from`` on (those below it are kept as they are). The compactor's Spark runner
and ``mqstore_spark.cluster_round`` install a job's output with this."""

from __future__ import annotations

import json
import pathlib
import shutil
import zlib

from mqstore.errors import DataLoss
from mqstore.format import compaction_segment as cseg, sparse_queue

from .qlog import Entries, QueueLog
from .rounds import RoundStats
from .writer import MANIFEST, manifest_of


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
    start = manifest.get("rewritten_from", 0)  # the sealed segments below it are kept as they are
    qlog.install(files, entries, manifest["state"], [b for b in bases if b >= start], manifest["removed_keys"])
    shutil.rmtree(staging, ignore_errors=True)
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
