"""convert.internal_batches_request (the gateway's sends on its AppendBatchesStream, serialized straight from the
MessageIn) against its reference: the InternalAppendBatchesRequest that convert.internal_message builds. Protobuf
must parse the bytes into the same request, for any MessageIn the gateway or the Transaction service could send
(negative numbers, empty and non-ASCII strings, empty property names and values, IPv6 born hosts, every
transaction type)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format.record import SYSFLAG_TX_COMMIT, SYSFLAG_TX_NOT, SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK
from mqstore.model import MessageIn
from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2

text = st.text(st.sampled_from(["a", "b", " ", "é", "中", "😀", "\x00"]), max_size=4)
int32 = st.integers(-(1 << 31), (1 << 31) - 1)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)
messages = st.builds(
    MessageIn, st.binary(max_size=300), text, st.lists(text, max_size=3).map(tuple),
    st.dictionaries(text, text, max_size=3), int32, int64, st.one_of(st.none(), int32), text,
    st.sampled_from([b"\x7f\x00\x00\x01", b"\x0a\x01\x02\x03", bytes(range(16))]),
    st.one_of(st.just(0), st.integers(1, 65535)),
    st.sampled_from([SYSFLAG_TX_NOT, SYSFLAG_TX_PREPARED, SYSFLAG_TX_COMMIT, SYSFLAG_TX_ROLLBACK]),
    st.one_of(st.just(0), int64), st.one_of(st.just(0), int32))
batches = st.lists(st.tuples(text, st.lists(messages, max_size=3)), max_size=3)


def reference(writer: str, batches) -> commitlog_pb2.InternalAppendBatchesRequest:
    return commitlog_pb2.InternalAppendBatchesRequest(writer=writer, batches=[
        commitlog_pb2.InternalAppendBatch(topic=topic, messages=[convert.internal_message(m) for m in messages])
        for topic, messages in batches])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.just("gateway"), text), batches)
def test_the_bytes_parse_into_the_reference_request(writer, batches):
    raw = convert.internal_batches_request(writer, batches)
    assert commitlog_pb2.InternalAppendBatchesRequest.FromString(raw) == reference(writer, batches)


def test_a_gateway_send_is_the_bytes_protobuf_writes():
    """A send as the gateway makes it (one property, a born host): byte for byte protobuf's serialization."""
    send = [("topic", [MessageIn(b"x" * 1024, tags="A", keys=("k",), properties={"UNIQ_KEY": "01AB"},
                                 born_timestamp_ms=1_790_000_000_000, born_host=b"\x0a\x00\x00\x07", born_port=4711)])]
    assert convert.internal_batches_request("gateway", send) == reference("gateway", send).SerializeToString()
