"""The compiled Scan pages (codec _scan.scan_values, through compactor_service.scan_wire.page) against the
reference (reads.scan's Latest items made LatestValue messages and serialized by protobuf), byte for byte,
page after page, on random compaction logs from a printed seed: several queues (queue id 0 too, whose
field proto3 leaves out), keys written many times, tombstones (an empty body, or DELETE=true with a
body), records without a key, keys of several words, accented and ill-formed UTF-8 keys, values of 0 to
20,000 bytes (one- to three-byte lengths), queue offset and store time 0, logs a round has compacted
(holes) or not, with and without tombstones, every page size from 1, from cursors anywhere. The compiled
module is imported directly, so this runs under MQSTORE_PURE_PYTHON=1 too."""

from __future__ import annotations

import pytest

from compactor_service.scan_wire import page
from mqstore.clock import FakeClock
from mqstore.compaction.api import CompactorApi, ServiceStats
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from tests.support import compiled as support_compiled
from tests.support import records
from tests.support.compaction import BASE_MS
from tests.support.hashkeys import seeded_random

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_scan")
KEYS = [b"k1", b"k2", b"k3", b"a b", b" lead", "é-ü".encode(), b"\xff\xfe", b"x\xc3 y", b"k1 other", b""]


def _api(store: CompactionStore) -> CompactorApi:
    stats = ServiceStats(True, 0, None, "", 0, 0, "")
    return CompactorApi(store, spark_threshold_bytes=1 << 40, stats=lambda: stats)


def _record(rng, queue_id: int, queue_offset: int, store_ms: int) -> bytes:
    props = []
    if rng.random() < 0.92:
        props.append(b"KEYS\x01" + rng.choice(KEYS))
    if rng.random() < 0.1:
        props.append(b"DELETE\x01" + rng.choice([b"true", b"false"]))
    props.append(b"UNIQ_KEY\x01U%d" % queue_offset)
    size = rng.choice([0, 0, 1, 100, 127, 128, 1000, 20_000])
    body = bytes(rng.randrange(256) for _ in range(min(size, 64))) * (size // 64 + 1)
    return records.encode(topic=b"kv", body=body[:size], properties=b"\x02".join(props), queue_id=queue_id,
                          queue_offset=queue_offset, physical_offset=10_000 + queue_offset,
                          store_timestamp_ms=store_ms)


def test_compiled_scan_pages_equal_the_reference(tmp_path):
    rng, seed = seeded_random("codec_scan_page")
    for trial in range(12):
        config = CompactionConfig(segment_size_bytes=rng.choice([64 << 10, 1 << 20]))
        store = CompactionStore(tmp_path / f"logs-{trial}", config, FakeClock(BASE_MS + 60_000))
        try:
            for queue_id in rng.sample([0, 1, 2, 5], rng.randint(1, 3)):
                for queue_offset in range(rng.randint(1, 150)):
                    store_ms = 0 if queue_offset == 0 else BASE_MS + queue_offset
                    assert store.append("kv", queue_id, _record(rng, queue_id, queue_offset, store_ms), queue_offset,
                                        None, store_ms)
                if rng.random() < 0.5:
                    store.compact(store.slot("kv", queue_id), seal_active=rng.random() < 0.7)
            api = _api(store)
            for _ in range(6):
                size, tombstones = rng.choice([1, 2, 3, 7, 50, 1000]), rng.random() < 0.5
                cursor = rng.choice(["", "", f"{rng.choice([0, 1, 2, 3, 5, 6])}:{rng.randint(0, 160)}"])
                for _ in range(500):
                    want_page, want = page(api, "kv", cursor, size, tombstones, 0, scan_values=None)
                    got_page, got = page(api, "kv", cursor, size, tombstones, 0, scan_values=compiled.scan_values)
                    assert got == want, f"seed {seed} trial {trial} cursor {cursor!r} page size {size}"
                    assert (got_page.next_queue_id, got_page.next_offset, got_page.done) == (
                        want_page.next_queue_id, want_page.next_offset, want_page.done)
                    if want_page.done:
                        break
                    cursor = f"{want_page.next_queue_id}:{want_page.next_offset}"
                else:
                    pytest.fail(f"seed {seed} trial {trial}: the Scan did not end in 500 pages")
        finally:
            store.close()


def test_scan_values_refuses_a_chunk_whose_records_lie_outside_its_bytes():
    from array import array
    raw = records.encode(topic=b"kv", body=b"v", properties=b"KEYS\x01k")
    with pytest.raises(ValueError, match="outside"):
        compiled.scan_values(raw, 0, array("q", [0]), array("i", [len(raw) + 1]), array("q", [0]), array("q", [0]),
                             {"k": 0}, 0, False, 10, bytearray())
