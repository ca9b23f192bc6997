"""Where a Spark round's job reads its sealed segments and keeps its parts and output: the request says.

  request has          the job's files                                           who must see them
  -------------------- --------------------------------------------------------- --------------------------
  queue_dir, staging   PathFiles: the sealed segments read in the queue's          the executors, at the
                       directory, parts written to staging/parts/, the output     driver's paths (a shared
                       and manifest to staging/                                   volume)
  tier                 TierFiles: the segments read by range GETs of the round's  nothing shared: the
                       input objects, parts and output written as objects under   executors and the driver
                       its prefix (mqstore.compaction.tier_round); the driver      reach the tier URL
                       writes its output in a temp directory of its own, then
                       puts it, the manifest last

Both are made on the driver and again in each task (:func:`files_of`, a context manager): a TierFiles holds
an ObjectStore (its threads), which never crosses to an executor.

Thread-safety: one per task (or the driver), used by one thread.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
import uuid

from mqstore.compaction import tier_round
from mqstore.errors import NotFound
from mqstore.format import compaction_segment as cseg, sparse_queue
from mqstore.tier.objects import read_whole

PARTS = "parts"


class PathFiles:
    def __init__(self, request: dict):
        self.queue_dir, self.staging = pathlib.Path(request["queue_dir"]), pathlib.Path(request["staging"])

    def index_size(self, base: int) -> int:
        return (self.queue_dir / cseg.index_name(base)).stat().st_size

    def index_entry(self, base: int, number: int) -> bytes:
        with open(self.queue_dir / cseg.index_name(base), "rb") as f:
            return os.pread(f.fileno(), sparse_queue.ENTRY_SIZE, number * sparse_queue.ENTRY_SIZE)

    def index(self, base: int) -> bytes:
        return (self.queue_dir / cseg.index_name(base)).read_bytes()

    def log(self, base: int) -> bytes:
        return (self.queue_dir / cseg.log_name(base)).read_bytes()

    def new_attempt(self) -> str:
        return ""  # a retried task writes the same files again, whole

    def put_part(self, base: int, attempt: str, suffix: str, data: bytes) -> None:
        (self.staging / PARTS / f"{base:020d}{suffix}").write_bytes(data)

    def part(self, base: int, attempt: str, suffix: str) -> bytes:
        return (self.staging / PARTS / f"{base:020d}{suffix}").read_bytes()

    def start(self) -> pathlib.Path:
        """(The driver.) An empty staging/ with its parts/; the directory the round writer writes to."""
        shutil.rmtree(self.staging, ignore_errors=True)
        (self.staging / PARTS).mkdir(parents=True)
        return self.staging

    def drop_parts(self, bases: list[int]) -> None:
        shutil.rmtree(self.staging / PARTS)

    def publish(self, names: list[str]) -> None:
        """(The driver.) The output and manifest are where the compactor reads them: nothing to do."""

    def close(self) -> None:
        pass


class TierFiles:
    def __init__(self, request: dict):
        self.tier = request["tier"]
        self.prefix = self.tier["prefix"]
        self.store = tier_round.open_round_store(self.tier)
        self.staging: pathlib.Path | None = None

    def _input(self, base: int, kind: str) -> str:
        return self.tier["inputs"][str(base)][kind]

    def index_size(self, base: int) -> int:
        size = self.store.size(self._input(base, "cq"))
        if size is None:
            raise NotFound(f"{self.store.url}: the round's input {self._input(base, 'cq')} is missing")
        return size

    def index_entry(self, base: int, number: int) -> bytes:
        return self.store.get_range(self._input(base, "cq"), number * sparse_queue.ENTRY_SIZE, sparse_queue.ENTRY_SIZE)

    def index(self, base: int) -> bytes:
        return read_whole(self.store, self._input(base, "cq"))

    def log(self, base: int) -> bytes:
        return read_whole(self.store, self._input(base, "log"))

    def new_attempt(self) -> str:
        """A fresh id for the parts of one task attempt: objects are written once, and a task Spark retries
        (after its first attempt put some of its parts) must not meet them; the driver reads the parts of
        the attempt whose row it got, and deletes every part at the end."""
        return uuid.uuid4().hex

    def put_part(self, base: int, attempt: str, suffix: str, data: bytes) -> None:
        self.store.put_if_absent(tier_round.part_key(self.prefix, base, attempt, suffix), data)

    def part(self, base: int, attempt: str, suffix: str) -> bytes:
        return read_whole(self.store, tier_round.part_key(self.prefix, base, attempt, suffix))

    def start(self) -> pathlib.Path:
        self.staging = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-round-"))
        return self.staging

    def drop_parts(self, bases: list[int]) -> None:
        tier_round.remove_round(self.store, f"{self.prefix}/{PARTS}")

    def publish(self, names: list[str]) -> None:
        """(The driver.) Put the output files, then the manifest (``names``' last): a manifest present means
        every output is."""
        for name in names:
            self.store.put_if_absent(tier_round.output_key(self.prefix, name), (self.staging / name).read_bytes())

    def close(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        self.store.close()


@contextlib.contextmanager
def files_of(request: dict):
    files = TierFiles(request) if "tier" in request else PathFiles(request)
    try:
        yield files
    finally:
        files.close()
