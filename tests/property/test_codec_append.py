"""The compiled Append codec against the pure-Python reference (mqstore.codec).

The same random AppendRequest bytes (tests/support/wire.py: valid ones and invalid ones, with bad
UTF-8, truncated varints, wrong wire types, unknown fields and groups, oversized fields, reserved
characters, bad keys, field/property conflicts, too many messages, empty bodies, queue ids out of
range) go through both paths:

- reference: protobuf parses, mqstore_rpc.convert.messages_in converts, MessageEncoder.encode_batch
  encodes a list of MessageIn, convert.append_response builds the response;
- compiled: parse_append_request, MessageEncoder.encode_batch with the WireMessages (AppendEncoder),
  append_response.

Both must accept and refuse the same requests, give byte-identical records (stamped with the same
offsets and times), the same queue ids, tag codes and UNIQ_KEYs (both encoders share one injected
key generator state), byte-identical AppendResponse bytes, the same errors (type and message) and
leave the same state behind (key counter, round-robin slots). The compiled modules are imported
directly, so these tests compare both paths under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import random
import types

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import codec
from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.format import record
from mqstore.log.encoder import MessageEncoder, UniqKeyGenerator
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, AppendResults, MessageIn, TopicRecord
from mqstore.timer import messages as tm
from mqstore_rpc import append_wire, convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2
from tests.support import wire

pytestmark = pytest.mark.codec

NOW_MS = 1_790_000_000_000
PEER = "ipv4:10.1.2.3:4567"
TOPICS = {"t": TopicRecord("t", 4, KIND_NORMAL, 0, 0), "c": TopicRecord("c", 3, KIND_COMPACTION, 0, 0)}
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.data_too_large])


def compiled_codec() -> types.SimpleNamespace:
    try:
        from mqstore.codec import _records, _request, _responses
    except ImportError as exc:
        pytest.fail(f"the compiled codec is not built ({exc}): run make setup with a C compiler")
    return types.SimpleNamespace(parse_append_request=_request.parse_request, WireMessages=_request.WireMessages,
                                 parse_internal_batches=_request.parse_internal_batches,
                                 AppendEncoder=_records.AppendEncoder, append_response=_responses.append_response)


COMPILED = compiled_codec()


@contextlib.contextmanager
def compiled_active():
    """mqstore.codec with the compiled modules in place, whatever MQSTORE_PURE_PYTHON says."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "compiled", COMPILED)
        yield


def config(segment_size_bytes: int, **limits) -> StoreConfig:
    # Small limits, so that random requests reach them: 6 messages, 64-byte bodies, 160 bytes of bodies.
    limits = dict(max_body_bytes=64, max_batch_messages=6, max_batch_body_bytes=160) | limits
    return StoreConfig(data_dir=pathlib.Path("/nonexistent"), segment_size_bytes=segment_size_bytes, **limits)


def encoder_pair(segment_size_bytes: int, **limits) -> tuple[MessageEncoder, MessageEncoder]:
    """A reference and a compiled encoder with the same UNIQ_KEY generator state."""
    cfg = config(segment_size_bytes, **limits)
    host = b"\x0a\x00\x00\x07"
    reference = MessageEncoder(cfg, uniq=UniqKeyGenerator(host, random=b"\x01\x02\x03\x04", counter=0xFFF0))
    with compiled_active():
        compiled = MessageEncoder(cfg, uniq=UniqKeyGenerator(host, random=b"\x01\x02\x03\x04", counter=0xFFF0))
    assert compiled._compiled is not None
    return reference, compiled


def as_rows(messages) -> list:
    """MessageIn as comparable rows, properties in their order."""
    return [(dataclasses.astuple(m), list(m.properties.items())) for m in messages]


# ---- parsing ---------------------------------------------------------------------------------------

def check_parse(raw: bytes) -> None:
    parsed = COMPILED.parse_append_request(raw)
    try:
        request = commitlog_pb2.AppendRequest.FromString(raw)
    except DecodeError:
        assert parsed is None, "the compiled parser accepted bytes that protobuf refuses"
        return
    assert parsed is not None, "the compiled parser refused bytes that protobuf accepts"
    assert (parsed.topic, len(parsed)) == (request.topic, len(request.messages))
    assert parsed.delivery_fields() == [(m.deliver_at_ms, m.delay_ms) for m in request.messages]
    parsed.set_peer(*convert.peer_address(PEER))
    if any(m.delay_ms or m.deliver_at_ms for m in request.messages):
        # A delayed message (the timer's: tests/property/test_codec_timer.py) converts as convert's, delivery
        # fields as properties, a negative one refused alike.
        assert parsed.timer_marks >= sum(1 for m in request.messages if m.delay_ms or m.deliver_at_ms)
        assert _converted(lambda: tm.wire_messages_in(parsed)) == _converted(
            lambda: convert.messages_in(request.messages, PEER))
        return
    assert as_rows(parsed.to_messages(MessageIn)) == as_rows(convert.messages_in(request.messages, PEER))


def _converted(convert_them) -> object:
    try:
        return as_rows(convert_them())
    except InvalidArgument as exc:
        return str(exc)


@SETTINGS
@given(wire.append_request())
def test_parse_accepts_what_protobuf_accepts_and_reads_the_same_messages(raw):
    check_parse(raw)


def _nested(levels: int, number: int = 9) -> bytes:
    return wire.tag(number, wire.SGROUP) * levels + wire.tag(number, wire.EGROUP) * levels


EDGE_CASES = {
    # upb allows 100 nested messages and groups in all: 100 groups at the top, 99 in a MessageInput,
    # 98 in a properties entry.
    **{f"groups-top-{n}": _nested(n) for n in (99, 100, 101)},
    **{f"groups-message-{n}": wire.field(2, wire.LEN, _nested(n)) for n in (98, 99, 100)},
    **{f"groups-entry-{n}": wire.field(2, wire.LEN, wire.field(4, wire.LEN, _nested(n, 3))) for n in (97, 98, 99)},
    "varint-10-bytes": b"\x08" + b"\xff" * 9 + b"\x7f",
    "varint-11-bytes": b"\x08" + b"\xff" * 10 + b"\x01",
    "tag-5-bytes": b"\x8a\x80\x80\x80\x00\x01a",
    "tag-6-bytes": b"\x8a\x80\x80\x80\x80\x00\x01a",
    "tag-past-32-bits": b"\xf8\xff\xff\xff\x1f\x01",
    "length-5-bytes": b"\x0a\x81\x80\x80\x80\x00a",
    "length-6-bytes": b"\x0a\x81\x80\x80\x80\x80\x00a",
    "length-past-end": b"\x0a\x05ab",
    "field-zero": b"\x00\x01",
    "end-group-alone": wire.tag(9, wire.EGROUP),
    "group-mismatched-end": wire.tag(9, wire.SGROUP) + wire.tag(10, wire.EGROUP),
    # Inside a group, upb skips fields without checking their numbers: field 0 is accepted there.
    "field-zero-in-group": wire.field(9, wire.SGROUP, [b"\x00\x01", b"\x01" + bytes(8)]),
    "group-zero-in-group": wire.field(9, wire.SGROUP, [wire.field(0, wire.SGROUP, [b"\x00\x01"])]),
    "field-zero-in-group-in-message": wire.field(2, wire.LEN, wire.field(9, wire.SGROUP, [b"\x05" + bytes(4)])),
    "end-group-zero-in-group": wire.field(9, wire.SGROUP, [wire.tag(0, wire.EGROUP)]),
    "wire-type-6": wire.tag(9, 6),
    "fixed64-short": wire.tag(9, wire.FIXED64) + b"\x00" * 7,
    "surrogate-in-topic": wire.field(1, wire.LEN, b"\xed\xa0\x80"),
    "overlong-utf8": wire.field(1, wire.LEN, b"\xc0\x80"),
    "max-code-point": wire.field(1, wire.LEN, b"\xf4\x8f\xbf\xbf"),
    "past-max-code-point": wire.field(1, wire.LEN, b"\xf4\x90\x80\x80"),
    "entry-with-unknown-field": wire.field(2, wire.LEN, wire.field(4, wire.LEN, b"\x0a\x01a\x18\x01\x12\x01v")),
    "entry-dropped-keeps-earlier": wire.field(2, wire.LEN, wire.field(4, wire.LEN, b"\x0a\x01a\x12\x01w")
                                              + wire.field(4, wire.LEN, b"\x0a\x01a\x12\x01v\x18\x00")),
    "entry-bad-utf8-and-unknown": wire.field(2, wire.LEN, wire.field(4, wire.LEN, b"\x18\x01\x0a\x01\xff")),
    "queue-id-past-32-bits": wire.field(2, wire.LEN, b"\x38" + wire.varint(1 << 32)),
    "body-in-a-group-is-unknown": wire.field(2, wire.LEN, wire.field(1, wire.SGROUP, [b"\x0a\x01a"])),
}


@pytest.mark.parametrize("raw", list(EDGE_CASES.values()), ids=list(EDGE_CASES))
def test_parse_edge_cases_as_protobuf(raw):
    check_parse(raw)


# ---- records, errors, responses ----------------------------------------------------------------------

def _delayed(request) -> bool:
    """A request with a delivery field: the Scheduler's (mqstore.timer; tests/property/test_codec_timer.py)."""
    return any(m.delay_ms or m.deliver_at_ms for m in request.messages)


def reference_append(encoder: MessageEncoder, raw: bytes):
    try:
        request = commitlog_pb2.AppendRequest.FromString(raw)
    except DecodeError:
        return ("unparsable",)
    if _delayed(request):
        return ("to the timer",)
    topic = TOPICS.get(request.topic)
    if topic is None:
        return ("no such topic",)
    try:
        batch = encoder.encode_batch(topic, convert.messages_in(request.messages, PEER), NOW_MS)
    except InvalidArgument as exc:
        return ("InvalidArgument", str(exc))
    return ("ok", *outcome(batch), convert.append_response([results_of(batch)]).SerializeToString())


def compiled_append(encoder: MessageEncoder, raw: bytes):
    parsed = COMPILED.parse_append_request(raw)
    if parsed is None:  # protobuf parses it (append_wire.parse_request)
        try:
            commitlog_pb2.AppendRequest.FromString(raw)
        except DecodeError:
            return ("unparsable",)
        raise AssertionError("the compiled parser refused bytes that protobuf accepts")
    if any(deliver or delay for deliver, delay in parsed.delivery_fields()):
        return ("to the timer",)
    topic = TOPICS.get(parsed.topic)
    if topic is None:
        return ("no such topic",)
    parsed.set_peer(*convert.peer_address(PEER))
    # Whether the AppendEncoder itself takes the batch (state thrown away), then the real call.
    throwaway = UniqKeyGenerator(b"\0\0\0\0")
    accepted = encoder._compiled.encode(parsed, topic.name, topic.queue_count, topic.kind == KIND_COMPACTION,
                                        NOW_MS, throwaway, lambda name, count: 0) is not None
    with compiled_active():
        try:
            batch = encoder.encode_batch(topic, parsed, NOW_MS)
        except InvalidArgument as exc:
            assert not accepted, "the AppendEncoder accepted a batch that the reference refuses"
            return ("InvalidArgument", str(exc))
        assert accepted, "the AppendEncoder refused a batch that the reference accepts"
        return ("ok", *outcome(batch), append_wire.append_response([results_of(batch)]))


def outcome(batch) -> tuple:
    """The batch after the commit log's stamping (the same offsets and time on both sides)."""
    buf = bytearray(batch.buf)
    position = 0
    for index, size in enumerate(batch.sizes):
        record.stamp(buf, position, 7 * index, 1 << 33 | position, NOW_MS + 1)
        position += size
    assert position == len(buf)
    return (batch.topic, bytes(buf), batch.sizes, batch.queue_ids, batch.tag_codes, batch.sys_flags, batch.uniq_keys)


def results_of(batch) -> AppendResults:
    entries, position = [], 1 << 33
    for index, (size, qid) in enumerate(zip(batch.sizes, batch.queue_ids, strict=True)):
        entries.append((position, size, qid, 7 * index, 0, 0))
        position += size
    return AppendResults("0A0000070000C383", entries, batch.uniq_keys, NOW_MS + 1, "WRITTEN")


@SETTINGS
@given(st.lists(wire.append_request(), min_size=1, max_size=3), st.sampled_from([4096, 65536]))
def test_both_codecs_store_and_refuse_alike(requests, segment_size_bytes):
    reference, compiled = encoder_pair(segment_size_bytes)
    for raw in requests:
        expected = reference_append(reference, raw)
        assert compiled_append(compiled, raw) == expected
        assert (compiled.uniq._counter, compiled._round_robin) == (reference.uniq._counter, reference._round_robin)


@settings(max_examples=20, deadline=None)
@given(st.integers(16, 120), st.integers(0, 1 << 32))
def test_big_batches_written_without_the_gil_store_alike(count, seed):
    """Batches of 16 KiB and more are written with the GIL released (_records._put_records): the same
    bytes, and the generated UNIQ_KEYs in the columns match the ones in the records."""
    rnd = random.Random(seed)
    messages = [common_pb2.MessageInput(body=rnd.randbytes(rnd.randint(900, 1100)), tags=rnd.choice(["", "A"]),
                                           keys=[f"k{i}"], properties={"UNIQ_KEY": f"U{i}"} if i % 3 == 0 else {})
                for i in range(count)]
    raw = commitlog_pb2.AppendRequest(topic="t", messages=messages).SerializeToString()
    reference, compiled = encoder_pair(1 << 20, max_body_bytes=4096, max_batch_messages=1000,
                                       max_batch_body_bytes=4 << 20)
    expected = reference_append(reference, raw)
    assert expected[0] == "ok" and len(expected[2]) >= 16384
    assert compiled_append(compiled, raw) == expected


def test_compaction_routing_agrees_with_the_reference():
    """The compaction key's rules (mqstore.message_keys) on both codecs: no key, a queue_id or
    sharding_key that disagrees with the key's queue (or agrees), the key from the KEYS property."""
    def request(**fields) -> bytes:
        return commitlog_pb2.AppendRequest(topic="c", messages=[common_pb2.MessageInput(body=b"v", **fields)]) \
            .SerializeToString()
    cases = [request(queue_id=0), request(), request(sharding_key="s"), request(keys=["k"]),
             request(properties={"KEYS": "k other"}), request(properties={"KEYS": "k"}, queue_id=0)]
    cases += [request(keys=["k"], queue_id=q) for q in range(3)]
    cases += [request(keys=["k"], sharding_key=s) for s in ("a", "b", "c", "k")]
    for raw in cases:
        reference, compiled = encoder_pair(4096)
        assert compiled_append(compiled, raw) == reference_append(reference, raw)


# ---- AppendResponse alone ------------------------------------------------------------------------------

int32 = st.integers(-(1 << 31), (1 << 31) - 1)
int64 = st.integers(0, (1 << 63) - 1)
batches = st.lists(st.builds(
    lambda prefix, rows, ts, durability, replicas, epoch: AppendResults(
        prefix, [r[0] for r in rows], [r[1] for r in rows], ts, durability, replicas, epoch),
    st.sampled_from(["7F0000010000C383", "", "0A000007" * 3]),
    st.lists(st.tuples(st.tuples(int64, int32, int32, int64, st.just(0), st.just(0)),
                       st.one_of(st.just(""), st.text(max_size=40))), max_size=5),
    st.one_of(st.just(0), int64), st.sampled_from(["WRITTEN", "FLUSHED"]),
    st.integers(0, 1 << 10), st.one_of(st.just(0), int64)), max_size=4)  # replicas, epoch (replication)


@SETTINGS
@given(batches)
def test_append_response_bytes_are_protobufs(results):
    assert COMPILED.append_response(results, append_wire.DURABILITY_CODES) == \
        convert.append_response(results).SerializeToString()
