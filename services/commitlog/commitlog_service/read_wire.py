"""Pull's, GetMessage's, GetMessages' and Receive's responses on the wire, by the codec in use (mqstore.codec).

Compiled: the store hands over the checked records' bytes (MessageStore.pull_raw, get_message_raw,
get_messages(raw=True)) and the compiled encoder writes the PullResponse / StoredMessage bytes from
them, with no Python object per field (a Receive's from the records pop decoded for its own rules:
mqstore.pop.receive.Delivery); GetMessages wraps each StoredMessage in its FoundMessage here
(a few bytes of framing per message). Pure Python (the reference): the store decodes Records, convert
builds the messages, which are then serialized. Both give what the other gives once parsed; byte for
byte, the compiled bytes are the reference's serialized with deterministic=True (map entries sorted by
key), which tests/property/test_codec_read.py checks. The servicers' Pull, GetMessage, GetMessages and
Receive answer with these bytes (errors.wire_codec: the response serializer passes them through).

Thread-safety: stateless.
"""

from __future__ import annotations

from mqstore import codec, model
from mqstore.format import record, record_reader
from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2

COMPILED = codec.compiled is not None


def msg_id_prefix(data: bytes) -> str:
    """The message id prefix (store host and port) of the record ``data`` starts with."""
    view = record_reader.RecordView(data, 0)
    return record.msg_id_prefix(view.store_host, view.store_port)


def reference_message(data: bytes, prefix: str) -> bytes:
    """The reference StoredMessage bytes of one checked record, its message id with ``prefix``: what the
    compiled encoder hands over for a record it leaves to the reference (IPv6 hosts, text that is not
    UTF-8)."""
    rec = record_reader.decode(data, 0, verify_crc=False)
    message = convert.stored_message(model.StoredMessage(rec, f"{prefix}{rec.physical_offset:016X}"))
    return message.SerializeToString(deterministic=True)


def pull_response(result: model.RawPullResult) -> bytes:
    """Serialized PullResponse of the checked records (every message id with the first one's host)."""
    prefix = msg_id_prefix(result.records[0]) if result.records else ""
    return codec.compiled.pull_response(result.records, prefix, result.next_offset, result.min_offset,
                                        result.max_offset, reference_message)


def stored_message(data: bytes) -> bytes:
    """Serialized StoredMessage of one checked record (GetMessage)."""
    return codec.compiled.stored_message(data, msg_id_prefix(data), reference_message)


def receive_response(deliveries: list, pop_time_ms: int) -> bytes:
    """Serialized ReceiveResponse of pop's deliveries (mqstore.pop.receive.Delivery)."""
    if COMPILED:
        return codec.compiled.receive_response(deliveries, pop_time_ms, reference_stored)
    return reference_receive_response(deliveries, pop_time_ms)


def reference_stored(message: model.StoredMessage) -> bytes:
    """The reference StoredMessage bytes of a decoded message (what the compiled Receive encoder hands over
    for a record it leaves to the reference)."""
    return convert.stored_message(message).SerializeToString(deterministic=True)


def reference_receive_response(deliveries: list, pop_time_ms: int) -> bytes:
    response = consumer_pb2.ReceiveResponse(pop_time_ms=pop_time_ms)
    add = response.messages.add
    for d in deliveries:
        add(message=convert.stored_message(d.message), topic=d.topic, receipt_handle=d.receipt_handle,
            delivery_attempt=d.attempt, next_visible_time_ms=d.visible_at_ms)
    return response.SerializeToString(deterministic=True)


def get_messages_response(lookups: list[model.MessageLookup], encode_message=stored_message) -> bytes:
    """Serialized GetMessagesResponse of MessageStore.get_messages(raw=True): per lookup a FoundMessage
    (field 1), its fields in number order and defaults left out, as protobuf writes them."""
    out = bytearray()
    for lookup in lookups:
        if lookup.message is not None:
            message = encode_message(lookup.message)
            found = b"\x08\x01\x12" + _varint(len(message)) + message  # found = true, message
        else:
            reason = lookup.missing.encode("utf-8")
            found = ((b"\x1a" + _varint(len(reason)) + reason if reason else b"")  # missing_reason
                     + (b"\x20\x01" if lookup.damaged else b"")  # damaged = true
                     + (b"\x28\x01" if lookup.beyond_end else b""))  # beyond_log_end = true
        out += b"\x0a"
        out += _varint(len(found))
        out += found
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
