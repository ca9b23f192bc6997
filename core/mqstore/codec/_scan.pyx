# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The record walk (recovery, consume-queue rebuild, the Index's Tail frames) and the Java hash of
``topic#key`` in C: mqstore.format.record_scan._scan_python and routing_fields, and
mqstore.format.index_file's key_hashes are the references, and tests/property/test_codec_scan.py requires the same results.

:func:`scan` stops where the reference stops and returns what it returns; why a record failed is
still said by the reference (record_reader.check), which only runs on the one record that failed.

Thread-safety: pure functions over the caller's buffer (which must not change during the call).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp

from mqstore.codec._walk cimport (FIXED_OVERHEAD, SYS_FLAG_AT, RecordSpan, be32, be64, body_at_of,
                                  check_record, store_timestamp_at_of)
from mqstore.codec._wire cimport java_hash_utf8_continue

# mqstore.format.record: the fields _scan reads (checked against record.IPV4 / LAYOUTS by mqstore.codec).
cdef uint32_t MAGIC_V1 = 0xDAA320A7
cdef enum:
    INT_MIN_HASH = -2147483648

# Per layout (index = (SYSFLAG & HOSTS_V6) >> 4): where the body starts, where STORETIMESTAMP is.
LAYOUT = {"body_at": tuple(body_at_of(layout << 4) for layout in range(4)),
          "store_timestamp_at": tuple(store_timestamp_at_of(layout << 4) for layout in range(4))}


def scan(const uint8_t[::1] buf, Py_ssize_t position, Py_ssize_t limit, bint verify_crc, base, list out):
    """record_scan._scan_python: (stop position, records, store time of the last one); appends
    (physical offset, sys flag, store time, topic bytes, properties bytes) per record to ``out``
    unless it is None. The checks of each record are _walk.check_record's."""
    cdef const uint8_t* p = &buf[0] if buf.shape[0] else NULL
    cdef Py_ssize_t count = 0
    cdef int64_t last_ts = 0
    cdef int64_t base_offset = 0 if base is None else base
    cdef bint check_offset = base is not None
    cdef RecordSpan r
    if limit > buf.shape[0]:
        raise ValueError(f"limit {limit} is past the buffer's {buf.shape[0]} bytes")
    if position < 0:
        raise ValueError(f"position {position} is before the buffer")
    while limit - position >= FIXED_OVERHEAD and check_record(p, position, limit, verify_crc, check_offset,
                                                              base_offset, &r):
        last_ts = r.store_timestamp_ms
        if out is not None:
            out.append((r.physical_offset, r.sys_flag, r.store_timestamp_ms,
                        PyBytes_FromStringAndSize(<const char*>p + r.topic_at + 1, r.props_at - r.topic_at - 1),
                        PyBytes_FromStringAndSize(<const char*>p + r.props_at + 2, r.end - r.props_at - 2)))
        count += 1
        position = r.end
    return position, count, last_ts


def key_hashes(uint32_t prefix_state, suffixes, fallback):
    """index_file.key_hashes: abs(Java hashCode(prefix + s)) for each suffix (Integer.MIN_VALUE -> 0),
    from the prefix's hash state. A suffix that is not valid UTF-8 text (a lone surrogate) is hashed
    by ``fallback`` (the reference java_hash_continue)."""
    cdef const char* text
    cdef Py_ssize_t length
    cdef int32_t h
    out = []
    for suffix in suffixes:
        try:
            text = PyUnicode_AsUTF8AndSize(suffix, &length)
            h = java_hash_utf8_continue(prefix_state, <const uint8_t*>text, length)
        except UnicodeEncodeError:
            h = fallback(prefix_state, suffix)
        out.append(0 if h == INT_MIN_HASH else (-h if h < 0 else h))
    return out


cdef uint32_t MAGIC_BLANK = 0xCBD43194


cdef object _tags_of(const uint8_t* props, Py_ssize_t length):
    """record_reader.find_property(props, "TAGS") or "": the value of the last entry that starts with
    TAGS\\x01 and is not empty. (An occurrence of the marker can only lie inside one entry, since it
    holds no 0x02, so find_property's search and this walk over the entries find the same ones.)"""
    cdef Py_ssize_t start = 0, end
    cdef const uint8_t* found = NULL
    cdef Py_ssize_t found_length = 0
    cdef const uint8_t* stop
    while start < length:
        stop = <const uint8_t*>memchr(props + start, 2, length - start)
        end = length if stop == NULL else stop - props
        if end - start > 5 and memcmp(props + start, b"TAGS\x01", 5) == 0:
            found, found_length = props + start + 5, end - start - 5
        start = end + 1
    if found == NULL:
        return ""
    return PyUnicode_DecodeUTF8(<const char*>found, found_length, "replace")


def routing_records(const uint8_t[::1] buf, Py_ssize_t position, Py_ssize_t end, Py_ssize_t max_records):
    """record_scan.routing_fields of the records from ``position`` while it is below ``end``, at most
    ``max_records``: (list of (size, topic bytes, queue id, queue offset, sys flag, TAGS, store time),
    stop position, whether a blank record stops it). It stops before the first record whose fields
    do not lie within the buffer as a valid record's do; the caller goes on there with the reference."""
    cdef const uint8_t* p = &buf[0] if buf.shape[0] else NULL
    cdef Py_ssize_t n = buf.shape[0], body_at, topic_at, props_at, props_end, record_end
    cdef int32_t total, body_len, sys_flag
    if position < 0:
        raise ValueError(f"position {position} is before the buffer")
    out = []
    while position < end and len(out) < max_records:
        if n - position < 8:
            break
        if be32(p + position + 4) == MAGIC_BLANK:
            return out, position, True
        if be32(p + position + 4) != MAGIC_V1 or n - position < FIXED_OVERHEAD:
            break
        total = <int32_t>be32(p + position)
        sys_flag = <int32_t>be32(p + position + SYS_FLAG_AT)
        body_at = position + body_at_of(sys_flag)
        record_end = position + total
        if total < body_at_of(sys_flag) + 3 or record_end > n:
            break
        body_len = <int32_t>be32(p + body_at - 4)
        topic_at = body_at + body_len
        if body_len < 0 or topic_at >= record_end:
            break
        props_at = topic_at + 1 + p[topic_at]
        if props_at + 2 > record_end:
            break
        props_end = props_at + 2 + <int16_t>((p[props_at] << 8) | p[props_at + 1])
        if props_end != record_end:
            break
        out.append((total, PyBytes_FromStringAndSize(<const char*>p + topic_at + 1, props_at - topic_at - 1),
                    <int32_t>be32(p + position + 12), be64(p + position + 20), sys_flag,
                    _tags_of(p + props_at + 2, props_end - props_at - 2),
                    be64(p + position + store_timestamp_at_of(sys_flag))))
        position = record_end
    return out, position, False


cdef inline bint _entry_is(const uint8_t* e, Py_ssize_t n, const char* name, Py_ssize_t name_len) noexcept nogil:
    return n > name_len + 1 and memcmp(e, name, name_len) == 0 and e[name_len] == 1  # (a value, not empty)


def compaction_fields(const uint8_t[::1] raw):
    """mqstore.compaction.rounds.compaction_fields_python: (the compaction key or None, whether the record is a
    tombstone, its body) of one valid record: the first word of the last non-empty KEYS property, decoded as
    UTF-8 with replacement; a tombstone has an empty body or a last non-empty DELETE property of "true"."""
    cdef Py_ssize_t n = raw.shape[0]
    if n < FIXED_OVERHEAD:
        raise ValueError(f"not a valid record: {n} bytes")
    cdef const uint8_t* p = &raw[0]
    cdef Py_ssize_t body_at = body_at_of(<int32_t>be32(p + SYS_FLAG_AT))
    cdef Py_ssize_t body_len = <int32_t>be32(p + body_at - 4)
    cdef Py_ssize_t topic_at = body_at + body_len
    if body_len < 0 or topic_at >= n:
        raise ValueError("not a valid record: its body runs past its end")
    cdef Py_ssize_t props_at = topic_at + 3 + p[topic_at]
    if props_at > n:
        raise ValueError("not a valid record: its topic runs past its end")
    cdef Py_ssize_t props_end = props_at + ((<Py_ssize_t>p[props_at - 2] << 8) | p[props_at - 1])
    if props_end > n:
        raise ValueError("not a valid record: its properties run past its end")
    cdef const uint8_t* key = NULL
    cdef Py_ssize_t key_len = 0, at = props_at, end, k
    cdef int delete = -1  # the last non-empty DELETE: -1 none, 1 "true", 0 another value
    cdef const void* stop
    while at < props_end:
        stop = memchr(p + at, 2, props_end - at)
        end = props_end if stop == NULL else <const uint8_t*>stop - p
        if _entry_is(p + at, end - at, "KEYS", 4):
            key, key_len = p + at + 5, end - at - 5
        elif _entry_is(p + at, end - at, "DELETE", 6):
            delete = 1 if end - at - 7 == 4 and memcmp(p + at + 7, b"true", 4) == 0 else 0
        at = end + 1
    word = None
    if key != NULL:
        for k in range(key_len):
            if key[k] == 0x20:
                key_len = k
                break
        if key_len:
            word = PyUnicode_DecodeUTF8(<const char*>key, key_len, "replace")
    return word, body_len == 0 or delete == 1, PyBytes_FromStringAndSize(<const char*>p + body_at, body_len)
