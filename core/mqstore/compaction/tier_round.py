"""A Spark round through the object storage tier (issue 36, item 4): no directory is shared with the executors.
The compactor puts the round's sealed input segments as objects under a fresh round prefix, the job (its
executors and driver) reads and writes only objects under it, the compactor fetches the output back into the
queue's staging/ (then checks the manifest and installs as for a round on paths: mqstore.compaction.staged)
and deletes the prefix.

  key (under the tier URL)                        written by         what
  ----------------------------------------------- ------------------ ---------------------------------------
  spark-rounds/<round id>/input/<base>.log|.cq    the compactor      the sealed segments, as they are
  spark-rounds/<round id>/parts/<base>.<attempt> an executor's task the survivors of a changed segment
    .log|.cq|.removed                                                (an id per task attempt)
  spark-rounds/<round id>/output/<name>           the driver         the round's output segments, then
  spark-rounds/<round id>/output/round.manifest                      its manifest (last)

The round id is fresh per round (a UUID), and every object is written once (put_if_absent): two rounds, or
a round and what a killed one left, never share or replace an object. The request names the prefix (and the
inputs' keys), never a path; the compactor writes it to its disk before the first PUT, so a kill -9 at any
point leaves a request naming the prefix, and the next start deletes it (compactor_service.spark_runner.
clean_leftovers). Credentials never go into the request file: the job takes them from its environment
(AWS_*, mqstore.tier.config) and hands them to its tasks.

Thread-safety: stateless functions; the ObjectStore is thread-safe.
"""

from __future__ import annotations

import json
import pathlib
import re
import uuid
from typing import Callable, Mapping

from mqstore.errors import DataLoss
from mqstore.format import compaction_segment as cseg
from mqstore.tier.config import Credentials, TierConfig
from mqstore.tier.objects import ObjectStore, delete_under, read_whole
from mqstore.tier.urls import open_store

from .writer import MANIFEST

ROUNDS = "spark-rounds"
_FILE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # an output's name: a file of staging/, never a path


def new_prefix() -> str:
    return f"{ROUNDS}/{uuid.uuid4().hex}"


def input_key(prefix: str, name: str) -> str:
    return f"{prefix}/input/{name}"


def part_key(prefix: str, base: int, attempt: str, suffix: str) -> str:
    """A part of one task attempt (a fresh id each: a task Spark retries never meets its first attempt's)."""
    return f"{prefix}/parts/{base:020d}.{attempt}{suffix}"


def output_key(prefix: str, name: str) -> str:
    return f"{prefix}/output/{name}"


def request_part(config: TierConfig, prefix: str, bases: list[int]) -> dict:
    """The request's ``tier``: where the round's objects are (no credentials) and its inputs' keys."""
    return {"url": config.tier_url, "endpoint": config.tier_endpoint, "region": config.tier_region,
            "timeout_ms": config.tier_call_timeout_ms, "prefix": prefix,
            "inputs": {str(base): {"log": input_key(prefix, cseg.log_name(base)),
                                   "cq": input_key(prefix, cseg.index_name(base))} for base in bases}}


def with_credentials(tier: dict, env: Mapping[str, str]) -> dict:
    """The request's ``tier`` with the credentials of ``env`` (AWS_*), unless it has some: for the job's tasks."""
    if "credentials" in tier:
        return tier
    found = TierConfig(tier_url=tier["url"]).with_env(env).credentials
    return {**tier, "credentials": {"access_key_id": found.access_key_id,
                                    "secret_access_key": found.secret_access_key,
                                    "session_token": found.session_token}}


def open_round_store(tier: dict, workers: int = 4) -> ObjectStore:
    """The ObjectStore of a request's ``tier`` (its credentials, if :func:`with_credentials` added them)."""
    return open_store(tier["url"], timeout_ms=tier["timeout_ms"], endpoint=tier.get("endpoint", ""),
                      region=tier.get("region", ""), credentials=Credentials(**tier.get("credentials", {})),
                      workers=workers)


def upload_inputs(store: ObjectStore, tier: dict, queue_dir: pathlib.Path,
                  segment_bytes: Callable[[int], bytes] | None = None) -> None:
    """Put the round's sealed segments (``.log`` and ``.cq``) as the request's input objects; a ``.log`` by
    ``segment_bytes(base)`` when given (QueueLog.segment_bytes: a segment only in the compaction tier too)."""
    for base, keys in tier["inputs"].items():
        for kind in ("log", "cq"):
            key = keys[kind]
            data = segment_bytes(int(base)) if kind == "log" and segment_bytes else \
                (queue_dir / key.rsplit("/", 1)[1]).read_bytes()
            store.put_if_absent(key, data)


def download_output(store: ObjectStore, prefix: str, staging: pathlib.Path) -> None:
    """The job's output objects and manifest into ``staging`` (then staged.install_output checks them)."""
    manifest = read_whole(store, output_key(prefix, MANIFEST))
    outputs = json.loads(manifest)["outputs"]
    staging.mkdir(parents=True, exist_ok=True)
    for out in outputs:
        name = out["name"]
        if not isinstance(name, str) or not _FILE_NAME.match(name) or name in (".", ".."):
            raise DataLoss(f"the Spark round's manifest names an output {name!r} that is not a file name")
        (staging / name).write_bytes(read_whole(store, output_key(prefix, name)))
    (staging / MANIFEST).write_bytes(manifest)


def remove_round(store: ObjectStore, prefix: str) -> int:
    """Delete every object of the round; how many there were."""
    return delete_under(store, prefix)
