"""The compiled Pull / GetMessage encoder against the pure-Python reference (mqstore.codec, issue 10).

Random records (tests/support/records: the store's own encoder; every host layout, int fields at
their limits, properties with duplicate names, empty names or values, 0x01 inside a value, trailing
separators, non-ASCII and invalid UTF-8 text) go to the compiled StoredMessage and PullResponse
encoders and to the reference (convert.stored_message / pull_response, serialized with
deterministic=True): the bytes must be identical. A record the compiled encoder can take (IPv4 hosts,
UTF-8 text) must not be handed to the reference, so the test cannot pass by falling back. Then a real
store: the raw read path (pull_raw, get_message_raw + read_wire) and the decoded one give the same
bytes and the same errors, with tag filters, byte limits and a damaged record. The compiled module is
imported directly, so these run under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import model
from mqstore.config import StoreConfig
from mqstore.errors import MqStoreError
from mqstore.format import record
from mqstore.format.record_reader import Record, RecordView, decode
from mqstore.model import MessageIn
from mqstore.pop import receive
from mqstore.store_parts import build_store
from commitlog_service import read_wire
from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2, consumer_pb2
from tests.support import compiled as support_compiled
from tests.support import records

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_responses")

SETTINGS = support_compiled.examples(300)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
V6 = bytes(range(1, 17))

text_bytes = st.one_of(st.text("ab é\U0001F600 ", max_size=6).map(str.encode),
                       st.sampled_from([b"", b"\xff", b"a\x01b", b" k1  k2 "]))
item = st.tuples(st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"a", "é".encode(), b""]),
                 st.sampled_from([b"\x01", b"", b"\x01\x01"]), text_bytes).map(b"".join)
properties = st.builds(lambda items, tail: b"\x02".join(items) + tail,
                       st.lists(item, max_size=6), st.sampled_from([b"", b"\x02"]))


@st.composite
def stored_records(draw) -> bytes:
    born_host = draw(st.sampled_from([records.LOOPBACK_V4, b"\xc0\xa8\x00\xff", V6]))
    store_host = draw(st.sampled_from([records.LOOPBACK_V4, b"\x0a\x00\x00\x01", V6]))
    data = bytearray(records.encode(
        topic=draw(st.sampled_from([b"t", "é".encode(), b"x" * 127, b"\xff"])), body=draw(st.binary(max_size=64)),
        properties=draw(properties), queue_id=draw(INT32), flag=draw(INT32),
        sys_flag=draw(st.sampled_from([0, 0x4, 0x8, 0xC, 0x1])), born_timestamp_ms=draw(INT64),
        born_host=born_host, born_port=draw(INT32), store_host=store_host, store_port=draw(INT32),
        prepared_transaction_offset=draw(INT64), queue_offset=draw(INT64),
        physical_offset=draw(st.integers(0, (1 << 63) - 1)), store_timestamp_ms=draw(INT64)))
    layout = record.LAYOUTS[(data[record.SYS_FLAG_AT + 3] & record.SYSFLAG_HOSTS_V6) >> record.LAYOUT_SHIFT]
    struct.pack_into(">i", data, layout.reconsume_times_at, draw(INT32))  # stamped by retries, not encode
    return bytes(data)


def expected_fallback(data: bytes) -> bool:
    """Whether the compiled encoder leaves the record to the reference (IPv6 hosts, text not UTF-8)."""
    view = RecordView(data, 0)
    try:
        view.topic_bytes.decode("utf-8")
        view.properties_raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return bool(view.sys_flag & record.SYSFLAG_HOSTS_V6)


class Fallback:
    def __init__(self) -> None:
        self.records: list[bytes] = []

    def __call__(self, data: bytes, prefix: str) -> bytes:
        self.records.append(data)
        return read_wire.reference_message(data, prefix)


def reference(data: bytes, prefix: str) -> common_pb2.StoredMessage:
    rec = decode(data, 0, verify_crc=False)
    return convert.stored_message(model.StoredMessage(rec, f"{prefix}{rec.physical_offset:016X}"))


@SETTINGS
@given(stored_records())
def test_stored_message_bytes_are_the_reference_bytes(data):
    prefix = read_wire.msg_id_prefix(data)
    fallback = Fallback()
    got = compiled.stored_message(data, prefix, fallback)
    assert got == reference(data, prefix).SerializeToString(deterministic=True)
    assert fallback.records == ([data] if expected_fallback(data) else [])
    assert common_pb2.StoredMessage.FromString(got) == reference(data, prefix)


@SETTINGS
@given(st.lists(stored_records(), max_size=4), INT64, INT64, INT64)
def test_pull_response_bytes_are_the_reference_bytes(datas, next_offset, min_offset, max_offset):
    prefix = read_wire.msg_id_prefix(datas[0]) if datas else ""
    fallback = Fallback()
    got = compiled.pull_response(datas, prefix, next_offset, min_offset, max_offset, fallback)
    want = commitlog_pb2.PullResponse(messages=[reference(d, prefix) for d in datas], next_offset=next_offset,
                                      min_offset=min_offset, max_offset=max_offset)
    assert got == want.SerializeToString(deterministic=True)
    assert fallback.records == [d for d in datas if expected_fallback(d)]


# ---- Receive: from decoded records (pop's deliveries) ---------------------------------------------------

class MessageFallback:
    def __init__(self) -> None:
        self.messages: list[model.StoredMessage] = []

    def __call__(self, message: model.StoredMessage) -> bytes:
        self.messages.append(message)
        return read_wire.reference_stored(message)


@SETTINGS
@given(st.lists(st.tuples(stored_records(), st.sampled_from(["upper", "lower", "other"]),
                          st.sampled_from(["t", "%RETRY%g+t", "é"]), st.sampled_from(["", "h" * 90, "é1"]),
                          INT32, INT64), max_size=4), INT64)
def test_receive_response_bytes_are_the_reference_bytes(items, pop_time_ms):
    """The compiled Receive encoder (from the Records pop decoded) writes what the reference serializes, and
    leaves to the reference only IPv6 hosts and a message id that is not its physical offset's."""
    deliveries, expected = [], []
    for data, id_form, topic, handle, attempt, visible in items:
        rec = decode(data, 0, verify_crc=False)
        prefix = read_wire.msg_id_prefix(data)
        msg_id = {"upper": f"{prefix}{rec.physical_offset:016X}", "lower": f"{prefix}{rec.physical_offset:016x}",
                  "other": "id"}[id_form]
        message = model.StoredMessage(rec, msg_id)
        deliveries.append(receive.Delivery(message, topic, handle, attempt, visible))
        if len(rec.born_host) == 16 or len(rec.store_host) == 16 or msg_id != f"{prefix}{rec.physical_offset:016X}":
            expected.append(message)
    fallback = MessageFallback()
    got = compiled.receive_response(deliveries, pop_time_ms, fallback)
    assert got == read_wire.reference_receive_response(deliveries, pop_time_ms)
    assert fallback.messages == expected
    assert len(consumer_pb2.ReceiveResponse.FromString(got).messages) == len(deliveries)


def _record(**changes) -> Record:
    fields = dict(size=200, body_crc=7, queue_id=1, flag=0, queue_offset=5, physical_offset=4096, sys_flag=0,
                  born_timestamp_ms=1, born_host=b"\x7f\x00\x00\x01", born_port=1, store_timestamp_ms=2,
                  store_host=b"\x7f\x00\x00\x01", store_port=10911, reconsume_times=0,
                  prepared_transaction_offset=0, body=b"body", topic="t", properties={"TAGS": "a", "KEYS": "k1 k2"})
    fields.update(changes)
    return Record(**fields)


@pytest.mark.parametrize("changes", [
    {}, {"properties": {"a": ""}}, {"properties": {"": "v"}}, {"properties": {f"p{i}": "v" for i in range(100)}},
    {"properties": {"a": "\ud800"}}, {"topic": "\udcff"}, {"queue_id": 1 << 31}, {"body_crc": -1},
    {"queue_offset": 1 << 63}, {"born_port": -(1 << 31)}, {"born_host": bytes(range(16))}, {"body": bytearray(b"b")},
    {"reconsume_times": True}, {"properties": {"ab": "1", "a": "2", "abc": "3", "é": "4"}},
], ids=lambda c: ",".join(c) or "plain")
def test_receive_response_of_unusual_records_is_the_reference_outcome(changes):
    """Records pop would never decode (empty property names or values, surrogates, values outside their
    field's range, other types): the compiled encoder gives the reference's bytes, or fails as it fails."""
    rec = _record(**changes)
    deliveries = [receive.Delivery(model.StoredMessage(rec, f"7F00000100002A9F{rec.physical_offset % (1 << 64):016X}"),
                                   "t", "handle", 1, 9)]

    def result(encode):
        try:
            return encode(), None
        except (ValueError, TypeError, UnicodeError, OverflowError) as exc:
            return None, type(exc)
    want = result(lambda: read_wire.reference_receive_response(deliveries, 3))
    got = result(lambda: compiled.receive_response(deliveries, 3, read_wire.reference_stored))
    assert got[0] == want[0]
    assert (got[1] is None) == (want[1] is None), (got, want)


# ---- a real store: the raw read path and the decoded one ----------------------------------------------

TAGS = ["", "red", "blue"]


def outcome(call):
    """The call's result, or the type and message of the store error it raised."""
    try:
        return call(), None
    except MqStoreError as exc:
        return None, (type(exc).__name__, str(exc))


def raw_pull(result: model.RawPullResult) -> bytes:
    """read_wire.pull_response with the compiled module itself (the codec in use may be the Python one)."""
    prefix = read_wire.msg_id_prefix(result.records[0]) if result.records else ""
    return compiled.pull_response(result.records, prefix, result.next_offset, result.min_offset, result.max_offset,
                                  read_wire.reference_message)


def raw_message(data: bytes) -> bytes:
    return compiled.stored_message(data, read_wire.msg_id_prefix(data), read_wire.reference_message)


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory):
    config = StoreConfig(data_dir=tmp_path_factory.mktemp("read") / "store", segment_size_bytes=16 * 1024,
                         cq_entries_per_file=64, flush_interval_ms=20, checkpoint_interval_ms=50,
                         clean_interval_ms=100_000)
    store = build_store(config)
    store.start()
    store.topic_admin.create("t", 2)
    results = []
    for i in range(12):
        results += store.append("t", [MessageIn(body=bytes([i, j]) * (30 * j + 1), tags=TAGS[(i + j) % 3],
                                                keys=(f"k{i}", "all") if j % 2 else (),
                                                properties={"p": "é" * (j + 1), "z": "v"}, queue_id=(i + j) % 2)
                                      for j in range(6)])
    bad = results[20]  # a changed body byte: only the CRC tells, on both paths
    path = config.commitlog_dir / f"{bad.physical_offset - bad.physical_offset % 16384:020d}"
    with open(path, "r+b") as f:
        f.seek(bad.physical_offset % 16384 + record.HEADER_SIZE)  # its first body byte
        f.write(b"\xee")
    yield store, results
    store.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(queue_id=st.integers(-1, 2), offset=st.integers(-1, 40), max_messages=st.integers(0, 40),
       max_bytes=st.sampled_from([0, 1, 200, 1000]), tags=st.lists(st.sampled_from(TAGS[1:] + ["none"]), max_size=2))
def test_pull_raw_path_gives_the_reference_bytes_and_errors(filled_store, queue_id, offset, max_messages, max_bytes,
                                                            tags):
    store, _ = filled_store
    args = ("t", queue_id, offset)
    limits = dict(max_messages=max_messages, max_bytes=max_bytes, tags=tags)
    raw, raw_error = outcome(lambda: raw_pull(store.pull_raw(*args, **limits)))
    ref, ref_error = outcome(lambda: convert.pull_response(store.pull(*args, **limits))
                             .SerializeToString(deterministic=True))
    assert (raw, raw_error) == (ref, ref_error)


def test_get_message_raw_path_gives_the_reference_bytes_and_errors(filled_store):
    store, results = filled_store
    offsets = [r.physical_offset for r in results] + [results[3].physical_offset + 1, -5, 1 << 40]
    for physical_offset in offsets:
        raw = outcome(lambda at=physical_offset: raw_message(store.get_message_raw(at)))
        ref = outcome(lambda at=physical_offset: convert.stored_message(store.get_message(at))
                      .SerializeToString(deterministic=True))
        assert raw == ref
    assert outcome(lambda: store.get_message_raw(results[20].physical_offset))[1][0] == "DataLoss"
    by_id = outcome(lambda: raw_message(store.get_message_by_id(results[7].msg_id, raw=True)))
    assert by_id == (convert.stored_message(store.get_message_by_id(results[7].msg_id))
                     .SerializeToString(deterministic=True), None)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(0, 80), min_size=1, max_size=20))
def test_get_messages_raw_path_gives_the_reference_bytes(filled_store, picks):
    """Found, damaged (results[20]), not a record start, past the log: FoundMessage framing and
    StoredMessage bytes as protobuf's. (A negative offset fails the whole request, on both paths.)"""
    store, results = filled_store
    choices = [r.physical_offset for r in results] + [results[3].physical_offset + 1, 0,
                                                       results[9].physical_offset + 2, 1 << 40]
    offsets = [choices[i % len(choices)] for i in picks] + [results[20].physical_offset, choices[-4], 1 << 40]
    raw = read_wire.get_messages_response(store.get_messages(offsets, raw=True), encode_message=raw_message)
    ref = convert.get_messages_response(store.get_messages(offsets)).SerializeToString(deterministic=True)
    assert raw == ref
    parsed = commitlog_pb2.GetMessagesResponse.FromString(raw)
    assert len(parsed.messages) == len(offsets)
    for raw_path in (True, False):
        assert outcome(lambda r=raw_path: store.get_messages(offsets + [-5], raw=r))[1][0] == "InvalidArgument"

