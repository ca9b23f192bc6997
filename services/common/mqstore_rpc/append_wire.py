"""Append's request and response on the wire, by the codec in use (mqstore.codec).

Compiled: the request bytes become WireMessages (pointers into them; the store's encoder takes them
as they are) and the AppendResponse bytes are built from the store's AppendResults columns, with no
Python object per field. Pure Python (the reference): protobuf parses the request, convert.messages_in
makes MessageIn, convert.append_response builds the response, which is then serialized.

CommitLogInternal's AppendBatches (and its stream) take their requests the same way
(:func:`parse_internal_batches`): a request of NOT_TYPE messages (the gateway's sends, its delayed ones with
TIMER_DELIVER_MS too: timer-marked, for the Scheduler) becomes one WireMessages per batch, any other is protobuf's
and convert.internal_messages_in's.

Bytes the compiled parser does not accept are parsed by protobuf, whose DecodeError says why (the
error interceptor turns it into INVALID_ARGUMENT): so a malformed request gets protobuf's own words
on both paths. The servicer's Append and AppendStream use these through errors.wire_codec.

Thread-safety: stateless.
"""

from __future__ import annotations

from typing import Iterable

from mqstore import codec, model
from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

# The enum numbers of the store's durability names, for the compiled response builder.
DURABILITY_CODES = {model.DURABILITY_WRITTEN: common_pb2.DURABILITY_WRITTEN,
                    model.DURABILITY_FLUSHED: common_pb2.DURABILITY_FLUSHED}


def parse_request(raw: bytes):
    """AppendRequest bytes -> an object with ``topic`` and ``messages`` (WireMessages or the protobuf
    message); raises protobuf's DecodeError when the bytes are not an AppendRequest."""
    # A delayed message is parsed too: the compiled parser marks it (WireMessages.timer_marks) and the Scheduler
    # makes its timer records from the WireMessages (mqstore.timer.scheduling).
    if codec.compiled is not None:
        wire = codec.compiled.parse_append_request(raw)
        if wire is not None:
            return wire
    return commitlog_pb2.AppendRequest.FromString(raw)


def parse_internal_batches(raw: bytes):
    """InternalAppendBatchesRequest bytes -> an object with ``writer`` and ``batches`` (each with ``topic``
    and ``messages``): the compiled codec's InternalBatches (one WireMessages per batch) for a request of
    NOT_TYPE messages without delivery fields, else the protobuf message; raises protobuf's DecodeError when the
    bytes are not one."""
    if codec.compiled is not None:
        parsed = codec.compiled.parse_internal_batches(raw)
        if parsed is not None:
            return parsed
    return commitlog_pb2.InternalAppendBatchesRequest.FromString(raw)


def internal_messages(batch, peer: str):
    """What MessageStore.append takes for one batch of :func:`parse_internal_batches`; ``peer`` gives the born
    host of the messages that name none (convert.internal_messages_in)."""
    if codec.is_wire_messages(batch):
        batch.set_peer(*convert.peer_address(peer))
        return batch
    return convert.internal_messages_in(batch.messages, peer)


def messages(request, peer: str):
    """What MessageStore.append takes for the request's messages; ``peer`` is the gRPC peer string."""
    if codec.is_wire_messages(request):
        request.set_peer(*convert.peer_address(peer))
        return request
    return convert.messages_in(request.messages, peer)


def replication(request) -> str | None:
    """The request's replication mode ("ASYNC", "SYNC", None: the server's default), on either codec."""
    return convert.replication_mode_in(request.replication)


def batches_response(outcomes: Iterable[model.AppendResults | commitlog_pb2.BatchError]) -> bytes:
    """Serialized InternalAppendBatchesResponse: per batch its AppendResponse (from :func:`append_response`, the
    codec in use) or its BatchError, the same bytes as convert.append_results_into into the response message
    would serialize to, without a proto object per message."""
    return b"".join(_length_delimited(b"\x0a", _length_delimited(b"\x0a", append_response((outcome,)))
                                      if type(outcome) is model.AppendResults
                                      else _length_delimited(b"\x12", outcome.SerializeToString()))
                    for outcome in outcomes)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
    length, head = len(payload), bytearray(tag)
    while length >= 0x80:
        head.append(length & 0x7F | 0x80)
        length >>= 7
    head.append(length)
    return bytes(head) + payload


def append_response(batches: Iterable[model.AppendResults]) -> bytes:
    """Serialized AppendResponse: one AppendResult per appended message, in order."""
    if codec.compiled is not None:
        return codec.compiled.append_response(batches, DURABILITY_CODES)
    return convert.append_response(batches).SerializeToString()
