"""The Spark job's numpy paths without a session: the index read as columns is sparse_queue.decode_all's
(layout 1's seconds converted, the invalid tail cut), and the driver's packing of runs through
RoundWriter.add_relocated writes the same files as RoundWriter.add record by record, at segment sizes
that seal after every few records."""

from __future__ import annotations

import filecmp
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
