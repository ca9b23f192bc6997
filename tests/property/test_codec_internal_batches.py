"""CommitLogInternal's AppendBatches on the compiled codec against the pure-Python reference (mqstore.codec).

The same random InternalAppendBatchesRequest bytes (tests/support/wire.py: valid and invalid ones, with
every InternalMessage field, plain and odd born hosts, unknown fields, wrong wire types, damaged bytes)
go through both ways of the servicer (commitlog_service.internal):

- reference: protobuf parses, mqstore_rpc.convert.internal_messages_in converts each batch, the writers'
  rules check it (mqstore.writers with mqstore.system_writers' registrations), MessageEncoder.encode_batch
  encodes the list of MessageIn;
- compiled: parse_internal_batches gives one WireMessages per batch (or None: then protobuf and the
  reference take the whole request), the same checks and MessageEncoder.encode_batch with it (AppendEncoder).

Where the compiled parser takes a request, both must give the same writer and topics, the same records
byte for byte (stamped alike), queue ids, tag codes and UNIQ_KEYs, the same errors (type and message) per
batch, and leave the same encoder state. It never takes bytes that protobuf refuses, and it takes every
request of plain messages with plain born hosts (the gateway's sends). The compiled modules are imported
directly, so these tests compare both ways under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

import mqstore.system_writers  # noqa: F401 - registers the writers' rules that the servicer's store checks
from mqstore import codec
from mqstore.errors import MqStoreError
from mqstore.model import KIND_SYSTEM, MessageIn, TopicRecord
from mqstore.txn import records as transactions
from mqstore.writers import SYSTEM_WRITERS
from mqstore_rpc import append_wire, convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2
from tests.property import test_codec_append as append_case
from tests.support import wire

pytestmark = pytest.mark.codec

PEER = append_case.PEER
OP_TOPIC = transactions.OP_TOPIC  # a system topic: only the Transaction service writes it
TOPICS = {**append_case.TOPICS, OP_TOPIC: TopicRecord(OP_TOPIC, 1, KIND_SYSTEM, 0, 0)}
try:
    from mqstore.codec import _request
except ImportError as exc:  # pragma: no cover - the build is part of make setup
    pytest.fail(f"the compiled codec is not built ({exc}): run make setup with a C compiler")


def batch_outcome(encoder, writer: str, topic_name: str, messages_of) -> tuple:
    """One batch as the servicer appends it: convert, find the topic, the writers' check, encode."""
    try:
        messages = messages_of()
        topic = TOPICS.get(topic_name)
        if topic is None:
            return ("no such topic",)
        SYSTEM_WRITERS.check(topic, messages, writer)
        batch = encoder.encode_batch(topic, messages, append_case.NOW_MS)
    except MqStoreError as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", *append_case.outcome(batch))


def reference_batches(encoder, raw: bytes) -> tuple:
    try:
        request = commitlog_pb2.InternalAppendBatchesRequest.FromString(raw)
    except DecodeError:
        return ("unparsable",)
    return (request.writer, [batch_outcome(encoder, request.writer, b.topic,
                                           lambda b=b: convert.internal_messages_in(b.messages, PEER))
                             for b in request.batches])


def compiled_batches(encoder, parsed) -> tuple:
    def messages_of(batch):
        batch.set_peer(*convert.peer_address(PEER))
        return batch
    with append_case.compiled_active():
        return (parsed.writer, [batch_outcome(encoder, parsed.writer, b.topic, lambda b=b: messages_of(b))
                                for b in parsed.batches])


def check_request(raw: bytes, segment_size_bytes: int = 4096) -> object:
    """Both ways on ``raw``; the compiled parse (None where it leaves the request to the reference)."""
    parsed = _request.parse_internal_batches(raw)
    try:
        request = commitlog_pb2.InternalAppendBatchesRequest.FromString(raw)
    except DecodeError:
        assert parsed is None, "the compiled parser accepted bytes that protobuf refuses"
        return None
    if parsed is None:
        return None
    assert (parsed.writer, [b.topic for b in parsed.batches], [len(b) for b in parsed.batches]) == \
        (request.writer, [b.topic for b in request.batches], [len(b.messages) for b in request.batches])
    for got, want in zip(parsed.batches, request.batches, strict=True):
        got.set_peer(*convert.peer_address(PEER))
        assert append_case.as_rows(got.to_messages(MessageIn)) == \
            append_case.as_rows(convert.internal_messages_in(want.messages, PEER))
    reference, compiled = append_case.encoder_pair(segment_size_bytes)
    assert compiled_batches(compiled, parsed) == reference_batches(reference, raw)
    assert (compiled.uniq._counter, compiled._round_robin) == (reference.uniq._counter, reference._round_robin)
    return parsed


@append_case.SETTINGS
@given(wire.internal_batches_request(), st.sampled_from([4096, 65536]))
def test_both_codecs_parse_store_and_refuse_alike(raw, segment_size_bytes):
    check_request(raw, segment_size_bytes)


PLAIN_HOSTS = st.one_of(st.just(""), st.builds(lambda a, b, c, d, port: f"{a}.{b}.{c}.{d}:{port}",
                                               *[st.integers(0, 255)] * 4, st.integers(0, 65535)))
PLAIN_MESSAGES = st.builds(
    lambda body, tags, keys, props, born_host, qid: commitlog_pb2.InternalMessage(
        message=common_pb2.MessageInput(body=body, tags=tags, keys=keys, properties=props, queue_id=qid),
        born_host=born_host),
    st.binary(min_size=1, max_size=40), st.sampled_from(["", "A", "B"]), st.lists(st.sampled_from(["k", "j"]),
                                                                                   max_size=2),
    st.dictionaries(st.sampled_from(["a", "b", "UNIQ_KEY"]), st.sampled_from(["1", "x"]), max_size=2),
    PLAIN_HOSTS, st.one_of(st.none(), st.integers(0, 3)))


@append_case.SETTINGS
@given(st.sampled_from(["gateway", "txn", "pop"]),
       st.lists(st.tuples(st.sampled_from(["t", "c", "x", OP_TOPIC]), st.lists(PLAIN_MESSAGES, min_size=1, max_size=4)),
                min_size=1, max_size=4))
def test_plain_messages_take_the_compiled_way(writer, batches):
    """The gateway's sends (plain messages, born hosts as it writes them) are never left to the reference."""
    raw = commitlog_pb2.InternalAppendBatchesRequest(writer=writer, batches=[
        commitlog_pb2.InternalAppendBatch(topic=topic, messages=messages) for topic, messages in batches]) \
        .SerializeToString()
    assert check_request(raw) is not None


@pytest.mark.parametrize("field", [
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a"), transaction_type=2),
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a"), prepared_transaction_offset=5),
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a"), reconsume_times=1),
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a", delay_ms=10)),
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a", deliver_at_ms=10)),
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a"), born_host="[::1]:5"),
    commitlog_pb2.InternalMessage(message=common_pb2.MessageInput(body=b"a"), born_host="01.2.3.4:5"),
], ids=["commit", "prepared", "reconsume", "delay-field", "deliver-at-field", "ipv6", "octal"])
def test_what_the_compiled_way_does_not_carry_goes_to_the_reference(field):
    """A transaction's or pop's record, a delivery field (the reference refuses it at this door), an odd born
    host: the whole request is protobuf's, and the servicer's parse gives the protobuf message
    (append_wire.parse_internal_batches)."""
    raw = commitlog_pb2.InternalAppendBatchesRequest(writer="txn", batches=[
        commitlog_pb2.InternalAppendBatch(topic="t", messages=[commitlog_pb2.InternalMessage(
            message=common_pb2.MessageInput(body=b"plain"), born_host="1.2.3.4:5"), field])]).SerializeToString()
    assert _request.parse_internal_batches(raw) is None
    with append_case.compiled_active():
        assert type(append_wire.parse_internal_batches(raw)) is commitlog_pb2.InternalAppendBatchesRequest


@pytest.mark.parametrize("name", ["TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "REAL_TOPIC", "TIMER_X"])
def test_a_timer_property_takes_the_compiled_way_timer_marked(name):
    """The gateway's DELAY sends (property TIMER_DELIVER_MS) are parsed compiled and timer-marked, so the Scheduler
    makes their timer records from the WireMessages (tests/property/test_codec_timer.py holds the outcome to the
    reference's); before, the whole request went to protobuf and convert.internal_messages_in."""
    raw = commitlog_pb2.InternalAppendBatchesRequest(writer="gateway", batches=[
        commitlog_pb2.InternalAppendBatch(topic="t", messages=[commitlog_pb2.InternalMessage(
            message=common_pb2.MessageInput(body=b"a", properties={name: "5"}), born_host="1.2.3.4:5")] * 2)]) \
        .SerializeToString()
    parsed = check_request(raw)
    assert parsed is not None and parsed.batches[0].timer_marks == 2


def test_the_servicer_parse_takes_the_gateways_sends_compiled():
    raw = commitlog_pb2.InternalAppendBatchesRequest(writer="gateway", batches=[
        commitlog_pb2.InternalAppendBatch(topic="t", messages=[commitlog_pb2.InternalMessage(
            message=common_pb2.MessageInput(body=b"b"), born_host="10.0.0.9:4711")])]).SerializeToString()
    with append_case.compiled_active():
        parsed = append_wire.parse_internal_batches(raw)
        assert parsed.writer == "gateway" and len(parsed.batches) == 1
        messages = append_wire.internal_messages(parsed.batches[0], PEER)
        assert messages.to_messages(MessageIn)[0].born_host == bytes([10, 0, 0, 9])
        assert messages.to_messages(MessageIn)[0].born_port == 4711


def _nested(levels: int, number: int = 9) -> bytes:
    return wire.tag(number, wire.SGROUP) * levels + wire.tag(number, wire.EGROUP) * levels


def _in_batch(inner: bytes) -> bytes:
    return wire.field(2, wire.LEN, wire.field(1, wire.LEN, b"t") + inner)


def _in_message(inner: bytes) -> bytes:
    return _in_batch(wire.field(2, wire.LEN, inner))


def _in_input(inner: bytes) -> bytes:
    return _in_message(wire.field(1, wire.LEN, wire.field(1, wire.LEN, b"body") + inner))


EDGE_CASES = {
    # upb allows 100 nested messages and groups in all
    **{f"groups-top-{n}": _nested(n) for n in (99, 100, 101)},
    **{f"groups-batch-{n}": _in_batch(_nested(n)) for n in (98, 99, 100)},
    **{f"groups-message-{n}": _in_message(_nested(n)) for n in (97, 98, 99)},
    **{f"groups-input-{n}": _in_input(_nested(n)) for n in (96, 97, 98)},
    **{f"groups-entry-{n}": _in_input(wire.field(4, wire.LEN, _nested(n, 3))) for n in (95, 96, 97)},
    "two-messages-merged": _in_message(wire.field(1, wire.LEN, b"\x0a\x01a") + wire.field(1, wire.LEN, b"\x12\x01T")),
    "no-message": _in_message(wire.field(4, wire.LEN, b"1.2.3.4:5")),
    "empty-born-host": _in_message(wire.field(1, wire.LEN, b"\x0a\x01a") + wire.field(4, wire.LEN, b"")),
    "born-host-twice": _in_message(wire.field(1, wire.LEN, b"\x0a\x01a") + wire.field(4, wire.LEN, b"[::1]:1")
                                   + wire.field(4, wire.LEN, b"1.2.3.4:5")),
    "born-host-bad-utf8": _in_message(wire.field(1, wire.LEN, b"\x0a\x01a") + wire.field(4, wire.LEN, b"\xff")),
    "transaction-type-past-32-bits": _in_message(wire.field(1, wire.LEN, b"\x0a\x01a") + wire.field(2, wire.VARINT,
                                                                                                    1 << 32)),
    "writer-bad-utf8": wire.field(1, wire.LEN, b"\xc0\x80"),
    "topic-bad-utf8": wire.field(2, wire.LEN, wire.field(1, wire.LEN, b"\xed\xa0\x80")),
    "no-batches": wire.field(1, wire.LEN, b"gateway"),
    "empty-batch": wire.field(2, wire.LEN, b""),
}


@pytest.mark.parametrize("raw", list(EDGE_CASES.values()), ids=list(EDGE_CASES))
def test_edge_cases_as_the_reference(raw):
    check_request(raw)


# ---- the response ------------------------------------------------------------------------------------------

batch_errors = st.builds(commitlog_pb2.BatchError, code=st.integers(1, 16), message=st.text(max_size=20),
                         error=st.sampled_from(["", "NotFound", "InvalidArgument"]), retriable=st.booleans())


@append_case.SETTINGS
@given(st.lists(st.one_of(append_case.batches.map(lambda results: results[0] if results else None)
                          .filter(lambda results: results is not None and results.entries), batch_errors),
                max_size=5), st.booleans())
def test_the_response_bytes_are_the_response_protobuf_serializes(outcomes, compiled):
    """append_wire.batches_response (the servicer's answer, no proto object per message) on either codec: the
    bytes of the InternalAppendBatchesResponse that convert.append_results_into and BatchError fill (a batch
    appended has one result at least: an empty batch is refused)."""
    expected = commitlog_pb2.InternalAppendBatchesResponse()
    for outcome in outcomes:
        result = expected.results.add()
        if isinstance(outcome, commitlog_pb2.BatchError):
            result.error.CopyFrom(outcome)
        else:
            convert.append_results_into(result.appended, (outcome,))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "compiled", append_case.COMPILED if compiled else None)
        assert append_wire.batches_response(outcomes) == expected.SerializeToString()
