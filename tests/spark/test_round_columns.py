"""The Spark job's numpy paths without a session: the index read as columns is sparse_queue.decode_all's
(layout 1's seconds converted, the invalid tail cut), and the driver's packing of runs through
RoundWriter.add_relocated writes the same files as RoundWriter.add record by record, at segment sizes
that seal after every few records."""

from __future__ import annotations

import filecmp
import hashlib
import pathlib

import pytest

from mqstore.clock import FakeClock
from mqstore.compaction.rounds import RoundStats
from mqstore.compaction.store import CompactionStore
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.writer import RoundWriter
from mqstore.format import compaction_segment as cseg, sparse_queue
from mqstore.format.sparse_queue import SparseEntry
from tests.support.compaction import BASE_MS, put
from tests.support.hashkeys import seeded_random

pytest.importorskip("numpy")
from mqstore_spark import round_job  # after the skip
from mqstore_spark.round_files import PathFiles

SEGMENT = 4096


@pytest.fixture(scope="module")
def queue(tmp_path_factory) -> tuple[pathlib.Path, list[int]]:
    """A sealed compaction log of 300 records of 1..6 chunks of body (some tombstones) in 4 KiB segments."""
    rng, _ = seeded_random("round_columns")
    directory = tmp_path_factory.mktemp("columns")
    store = CompactionStore(directory, CompactionConfig(segment_size_bytes=SEGMENT), FakeClock(BASE_MS))
    for offset in range(300):
        key = f"key-{rng.randint(0, 40)}"
        put(store, key, None if rng.random() < 0.1 else f"{key}={offset}".encode() * rng.randint(1, 6), offset,
            BASE_MS + offset)
    qlog = store.slot("kv", 0).qlog
    qlog.seal_active()
    bases = qlog.sealed()[0]
    queue_dir = qlog.directory
    store.close()
    return queue_dir, bases


def test_the_index_as_columns_is_the_decoded_index(queue, tmp_path):
    queue_dir, bases = queue
    entries, _ = sparse_queue.decode_all((queue_dir / cseg.index_name(bases[0])).read_bytes())
    odd = [SparseEntry(e.position, e.size, e.tag_code, e.store_timestamp_ms, e.queue_offset, e.tombstone_seen_ms)
           for e in entries]
    data = b"".join(sparse_queue.encode(e) for e in odd)
    layout1 = bytearray(sparse_queue.encode(odd[1]))  # seen-at: -1 then seconds, as layout 1 wrote it
    layout1[38:46] = b"\xff\xff\xff\xff" + (1_700_000_123).to_bytes(4, "big")
    path = tmp_path / "x.cq"
    path.write_bytes(data[:sparse_queue.ENTRY_SIZE] + bytes(layout1) + data[2 * sparse_queue.ENTRY_SIZE:]
                     + bytes(sparse_queue.ENTRY_SIZE) + data[:sparse_queue.ENTRY_SIZE] + b"torn")
    expected, _ = sparse_queue.decode_all(path.read_bytes())
    assert expected[1].tombstone_seen_ms == 1_700_000_123_000 and len(expected) == len(odd)
    columns = round_job.read_index(path)
    assert [SparseEntry(int(e["position"]), int(e["size"]), int(e["tag_code"]), int(e["store_ms"]),
                        int(e["queue_offset"]), int(e["seen"])) for e in columns] == expected


@pytest.mark.parametrize("segment_size", [SEGMENT, 1024, 3 * SEGMENT], ids=["same", "smaller", "larger"])
def test_streaming_runs_writes_what_add_writes(queue, tmp_path, segment_size):
    queue_dir, bases = queue
    by_record, by_run = tmp_path / "add", tmp_path / "runs"
    by_record.mkdir()
    by_run.mkdir()
    start = bases[1]
    reference, writer = RoundWriter(by_record, segment_size, start), RoundWriter(by_run, segment_size, start)
    for base in bases[1:]:
        data = (queue_dir / cseg.log_name(base)).read_bytes()
        for e in sparse_queue.decode_all((queue_dir / cseg.index_name(base)).read_bytes())[0]:
            at = e.position - base
            reference.add(memoryview(data)[at:at + e.size], e.queue_offset, e.tag_code, e.store_timestamp_ms,
                          e.tombstone_seen_ms)
        round_job._stream(writer, {"changed": False, "base": base},
                          PathFiles({"queue_dir": queue_dir, "staging": tmp_path / "unused"}), RoundStats())
    state = {"cleaned_offset": 1, "next_offset": 2}
    names = [p.name for p in reference.finish(state)[0]]
    assert [p.name for p in writer.finish(state)[0]] == names and len(names) > 3
    assert filecmp.cmpfiles(by_record, by_run, names, shallow=False)[1:] == ([], [])
    for name in ("offsets", "positions", "store_ms", "sizes", "tags", "seen"):
        assert getattr(writer.entries, name) == getattr(reference.entries, name), name


@pytest.mark.parametrize("cleaned,buckets", [(-1, 1), (-1, 4), (150, 3), (399, 2)])
def test_the_marks_from_digest_binaries_are_the_latest_dirty_record_rule(cleaned, buckets):
    """Steps 2 and 3 on numpy columns (what the executors compute, without a session): per segment the keys
    as binaries split by bucket, the superseded keys found per bucket (its rows in any order, its buckets in
    one task or several), then each segment's marks: a record is superseded exactly when a record of its key
    in (cleaned, last] has a higher offset (rounds.fate's rule, brute force here), and the keys counted are
    those with a dirty record. Keys repeat within and across segments, some only at or below ``cleaned``."""
    import numpy as np
    import pyarrow as pa
    rng, seed = seeded_random("round_marks")
    names = [f"key-{rng.randint(0, 60)}" for _ in range(400)]
    keys = np.array([hashlib.md5(name.encode()).digest() for name in names], dtype="S16")
    offsets = np.arange(400, dtype=np.int64)
    cuts = sorted(rng.sample(range(1, 400), 7))
    segments = [(base * 1000, slice(a, b)) for base, (a, b) in enumerate(zip([0] + cuts, cuts + [400], strict=True))]
    rows = [round_job.digest_rows(base, keys[part], offsets[part], cleaned, buckets) for base, part in segments]
    table = pa.Table.from_batches(rows)
    by_bucket = [table.filter(pa.compute.equal(table["bucket"], b)).to_batches() for b in range(buckets)]
    rng.shuffle(by_bucket)
    per_bucket = [list(round_job.superseded_keys(batches[::-1])) for batches in by_bucket]  # a task per bucket
    one_task = [list(round_job.superseded_keys(b for batches in by_bucket for b in batches))]  # all in one
    marks = _marks(per_bucket)
    assert _marks(one_task) == marks, f"seed {seed}"
    latest: dict[bytes, int] = {}
    for key, offset in zip(keys.tolist(), offsets.tolist(), strict=True):
        if offset > cleaned:
            latest[key] = max(latest.get(key, -1), offset)
    for base, part in segments:
        gone, _ = marks.get(base, ([], 0))
        mask = round_job._superseded(keys[part], offsets[part], gone, cleaned)
        expected = [offset < latest.get(key, -1) for key, offset in zip(keys[part].tolist(),
                                                                          offsets[part].tolist(), strict=True)]
        assert mask.tolist() == expected, f"seed {seed}: segment {base}"
    assert sum(held for _, held in marks.values()) == len(latest), f"seed {seed}"


def _marks(tasks) -> dict[int, tuple[list[bytes], int]]:
    """Step 2b's rows grouped per segment (as the job's groupBy does): its binaries of superseded digests
    (sorted, so the order the tasks gave them in does not matter) and its count of keys held."""
    marks: dict[int, tuple[list[bytes], int]] = {}
    for batch in (b for out in tasks for b in out):
        for base, gone, held in zip(*(batch.column(n).to_pylist() for n in ("base", "gone", "keys")), strict=True):
            previous = marks.get(base, ([], 0))
            marks[base] = (previous[0] + [gone], previous[1] + held)
    return {base: (sorted(gone), held) for base, (gone, held) in marks.items()}
