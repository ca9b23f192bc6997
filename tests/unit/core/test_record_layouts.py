"""Every reader of records, in every host layout (IPv4 or IPv6 born and store hosts): the lazy view,
decode, walk, index_walk, routing_fields, peek_topic, frameable; and the fast scan agrees with check
(the specification) on randomly damaged logs."""

from __future__ import annotations

import random

import pytest

from mqstore import tailing
from mqstore.format import record, record_reader, record_scan
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from tests.support import records

V4 = bytes([10, 0, 0, 7])
V6 = bytes.fromhex("20010db8000000000000000000000007")
LAYOUTS = {"v4": (V4, V4), "born v6": (V6, V4), "store v6": (V4, V6), "both v6": (V6, V6)}
BASE = 1 << 20


def _log(born_host: bytes, store_host: bytes, count: int, rng: random.Random) -> tuple[bytearray, list[dict]]:
    """``count`` records back to back, as if at physical offset BASE, with their inputs."""
    data, inputs = bytearray(), []
    for i in range(count):
        props = {record.PROPERTY_TAGS: f"tag{i % 3}", record.PROPERTY_KEYS: f"k{i} j{i}",
                 f"MY{record.PROPERTY_TAGS}": "x"}
        fields = dict(topic=rng.choice([b"a", b"topic-b"]), body=rng.randbytes(rng.randrange(1, 300)),
                      properties=record.encode_properties(props), queue_id=i % 4, flag=i, sys_flag=(i % 4) * 4,
                      born_timestamp_ms=1000 + i, born_host=born_host, born_port=4000 + i, store_host=store_host,
                      store_port=50051, prepared_transaction_offset=i * 7, queue_offset=i,
                      physical_offset=BASE + len(data), store_timestamp_ms=2000 + i)
        data += records.encode(**fields)
        inputs.append({**fields, "tags": props[record.PROPERTY_TAGS]})
    return data, inputs


@pytest.mark.parametrize("hosts", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_reader_reads_every_layout(hosts):
    data, inputs = _log(*hosts, 12, random.Random(7))
    views = list(record_reader.records(data, base=BASE))
    assert len(views) == len(inputs)
    fields = record_scan.index_walk(bytes(data), base=BASE)
    assert fields.error is None and len(fields.fields) == len(inputs)
    rows = zip(views, inputs, fields.fields, strict=True)
    for view, given, (physical_offset, sys_flag, store_ts, topic, props) in rows:
        assert view.crc_ok() and view.layout.born_host_bytes == len(given["born_host"])
        got = {name: getattr(view, name) for name in ("queue_id", "flag", "queue_offset", "physical_offset",
                                                      "born_timestamp_ms", "born_host", "born_port",
                                                      "store_timestamp_ms", "store_host", "store_port",
                                                      "prepared_transaction_offset", "body", "topic_bytes")}
        assert got == {**{k: given[k] for k in got if k != "topic_bytes"}, "topic_bytes": given["topic"]}
        assert view.property(record.PROPERTY_TAGS) == given["tags"] and view.reconsume_times == 0
        decoded = record_reader.decode(data, view.position, physical_offset=view.physical_offset)
        assert decoded == view.decode() and decoded.properties == view.properties
        assert (physical_offset, sys_flag, store_ts, topic, props) == (
            view.physical_offset, view.sys_flag, view.store_timestamp_ms, view.topic_bytes, view.properties_raw)
        assert record_scan.routing_fields(data, view.position) == (
            view.size, given["topic"], given["queue_id"], given["queue_offset"], view.sys_flag, given["tags"],
            given["store_timestamp_ms"])
        assert record_reader.peek_topic(data, view.position) == given["topic"]
        assert record_reader.store_timestamp(data, view.position) == given["store_timestamp_ms"]
        assert record_scan.frameable(data, view.position, view.size, record.MAGIC_V1, len(data), BASE)
    walked = record_scan.walk(data, 0, len(data), base=BASE)
    assert (walked.stop, walked.records, walked.last_store_timestamp_ms, walked.error) == (
        len(data), len(inputs), inputs[-1]["store_timestamp_ms"], None)
    record.INT32.pack_into(data, views[3].position, 1 << 20)  # a damaged TOTALSIZE: found past it
    assert record_scan.next_record_start(data, views[3].position, len(data), BASE) == views[4].position


def _reference_walk(buf, limit: int, base: int) -> tuple[int, int, str | None]:
    """walk's verdict from check alone, one record at a time: (stop, records, failure reason)."""
    position = count = 0
    while position < limit:
        try:
            size = record_reader.check(buf, position, limit, physical_offset=base + position)
        except record_reader.RecordError as exc:
            return position, count, exc.reason
        if record_reader.is_blank(buf, position):
            return position, count, None
        position += size
        count += 1
    return position, count, None


@pytest.mark.parametrize("hosts", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_the_fast_scan_agrees_with_check_on_random_damage(hosts):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    clean, _ = _log(*hosts, 6, rng)
    clean += record.encode_blank(64) + bytes(56)
    for _ in range(300):
        data = bytearray(clean)
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(data))
            if rng.random() < 0.5:
                data[at] = rng.randrange(256)
            else:  # a plausible-looking length or offset
                data[at:at + 4] = rng.randrange(-8, 400).to_bytes(4, "big", signed=True)
                del data[len(clean):]
        stop, count, reason = _reference_walk(data, len(data), BASE)
        walked = record_scan.walk(data, 0, len(data), base=BASE)
        assert (walked.stop, walked.records, walked.error and walked.error.reason) == (stop, count, reason)
        fields = record_scan.index_walk(bytes(data), base=BASE)
        assert (fields.stop, len(fields.fields)) == (stop, count)
        assert (fields.error and fields.error.reason) == (reason or ("blank" if stop < len(data) else None))


def test_a_store_keeps_ipv6_born_hosts_through_pull_tail_and_restart(small_config):
    config = small_config()
    store = build_store(config)
    store.start()
    try:
        store.topic_admin.create("t", 2)
        sent = [MessageIn(body=b"m%d" % i, tags=f"t{i % 2}", born_host=V6 if i % 2 else V4, born_port=i)
                for i in range(300)]
        for start in range(0, len(sent), 30):
            store.append("t", sent[start:start + 30])
    finally:
        store.stop()
    config.consumequeue_dir.joinpath("t").rename(config.data_dir / "old-queues")  # rebuilt from the log
    store = build_store(config)
    store.start()
    try:
        got = [m for q in range(2) for m in store.pull("t", q, 0, 1000, 8 << 20, tags=["t1"]).messages]
        assert sorted((m.record.born_host, m.record.body) for m in got) == sorted(
            (m.born_host, m.body) for m in sent if m.tags == "t1")
        assert all(m.record.sys_flag & record.SYSFLAG_HOSTS_V6 == record.SYSFLAG_BORN_HOST_V6 for m in got)
        frame = next(tailing.tail(store, "earliest", 0, ["t"], 1 << 20, 10, is_active=lambda: True))
        assert [v.born_host for v in record_reader.records(frame.records)] == [m.born_host for m in sent][
            :frame.record_count]
    finally:
        store.stop()
