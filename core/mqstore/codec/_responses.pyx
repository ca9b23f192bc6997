# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Response messages serialised from the store's results, with no protobuf object per field: the
bytes protobuf's SerializeToString gives for the same message (fields in number order, zero values
left out as proto3 does), which tests/property/test_codec_append.py checks.

Thread-safety: pure functions.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from mqstore.codec._wire cimport put_varint, varint_size

cdef const char* HEX = b"0123456789ABCDEF"


cdef struct Buffer:
    uint8_t* data
    Py_ssize_t length
    Py_ssize_t capacity


cdef int reserve(Buffer* buf, Py_ssize_t extra) except -1:
    cdef Py_ssize_t capacity
    cdef uint8_t* moved
    if buf.length + extra <= buf.capacity:
        return 0
    capacity = max(buf.length + extra, 2 * buf.capacity, 256)
    moved = <uint8_t*>realloc(buf.data, capacity)
    if moved == NULL:
        raise MemoryError()
    buf.data, buf.capacity = moved, capacity
    return 0


cdef inline int int_field_size(uint64_t value) noexcept nogil:
    """Bytes of a varint field (tag of one byte) holding ``value``; 0 when proto3 leaves it out."""
    return 1 + varint_size(value) if value else 0


cdef inline Py_ssize_t put_int_field(uint8_t* out, Py_ssize_t at, uint8_t tag, uint64_t value) noexcept nogil:
    if value:
        out[at] = tag
        at = put_varint(out, at + 1, value)
    return at


cdef inline Py_ssize_t put_text_field(uint8_t* out, Py_ssize_t at, uint8_t tag, const char* text,
                                      Py_ssize_t length) noexcept nogil:
    if length:
        out[at] = tag
        at = put_varint(out, at + 1, <uint64_t>length)
        memcpy(out + at, text, length)
        at += length
    return at


def append_response(batches, dict durability_codes):
    """mqstore.v1.AppendResponse bytes: one AppendResult per message of each AppendResults, in order
    (what mqstore_rpc.convert.append_response builds with protobuf). ``durability_codes`` maps the
    store's durability names to the Durability enum's numbers."""
    cdef Buffer buf
    buf.data, buf.length, buf.capacity = NULL, 0, 0
    try:
        for batch in batches:
            _put_batch(&buf, batch, durability_codes[batch.durability])
        return PyBytes_FromStringAndSize(<const char*>buf.data, buf.length)
    finally:
        free(buf.data)


cdef int _put_batch(Buffer* buf, batch, int32_t durability) except -1:
    cdef Py_ssize_t prefix_length, uniq_length, msg_id_length, content, i
    cdef const char* prefix = PyUnicode_AsUTF8AndSize(batch.msg_id_prefix, &prefix_length)
    cdef const char* uniq
    cdef int64_t store_ts = batch.store_timestamp_ms
    cdef uint64_t physical_offset, queue_offset
    cdef int64_t queue_id, size  # int32 fields: a negative one is sign-extended to 10 bytes, as protobuf does
    cdef uint8_t* out
    cdef Py_ssize_t at
    msg_id_length = prefix_length + 16
    for entry, uniq_key in zip(batch.entries, batch.uniq_keys):
        physical_offset, size, queue_id, queue_offset = entry[0], <int32_t>entry[1], <int32_t>entry[2], entry[3]
        uniq = PyUnicode_AsUTF8AndSize(uniq_key, &uniq_length)
        content = (1 + varint_size(msg_id_length) + msg_id_length
                   + (1 + varint_size(uniq_length) + uniq_length if uniq_length else 0)
                   + int_field_size(<uint64_t>queue_id) + int_field_size(queue_offset)
                   + int_field_size(physical_offset) + int_field_size(<uint64_t>size)
                   + int_field_size(<uint64_t>store_ts) + int_field_size(<uint64_t>durability))
        reserve(buf, 1 + varint_size(<uint64_t>content) + content)
        out, at = buf.data, buf.length
        out[at] = 0x0A  # AppendResponse.results, length-delimited
        at = put_varint(out, at + 1, <uint64_t>content)
        out[at] = 0x0A  # AppendResult.msg_id: prefix + 16 hex digits of the physical offset
        at = put_varint(out, at + 1, <uint64_t>msg_id_length)
        memcpy(out + at, prefix, prefix_length)
        at += prefix_length
        for i in range(16):
            out[at + i] = HEX[(physical_offset >> (60 - 4 * i)) & 0xF]
        at += 16
        at = put_text_field(out, at, 0x12, uniq, uniq_length)
        at = put_int_field(out, at, 0x18, <uint64_t>queue_id)
        at = put_int_field(out, at, 0x20, queue_offset)
        at = put_int_field(out, at, 0x28, physical_offset)
        at = put_int_field(out, at, 0x30, <uint64_t>size)
        at = put_int_field(out, at, 0x38, <uint64_t>store_ts)
        buf.length = put_int_field(out, at, 0x40, <uint64_t>durability)
    return 0
