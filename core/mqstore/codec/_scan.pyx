# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The record walk (recovery, consume-queue rebuild, the Index's Tail frames) and the Java hash of
``topic#key`` in C: mqstore.format.record_scan._scan_python and routing_fields, and
mqstore.format.index_file's key_hashes are the references, and tests/property/test_codec_scan.py requires the same results.
A compaction record's key, tombstone flag and body (compaction_fields; rounds.compaction_fields_python, checked by
test_codec_compaction_fields.py), and the Compactor Scan's LatestValue bytes of a chunk of compaction log records
(scan_values; reads.scan's Latest items serialized, checked page by page by test_codec_scan_page.py).

:func:`scan` stops where the reference stops and returns what it returns; why a record failed is
still said by the reference (record_reader.check), which only runs on the one record that failed.

Thread-safety: pure functions over the caller's buffer (which must not change during the call); scan_values
reads the caller's ``latest`` dict and appends to its bytearray holding the GIL throughout.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy, memset

from mqstore.codec._walk cimport (FIXED_OVERHEAD, SYS_FLAG_AT, RecordSpan, be32, be64, body_at_of,
                                  check_record, store_timestamp_at_of)
from mqstore.codec._wire cimport java_hash_utf8_continue, put_varint, varint_size

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


cdef struct KeyFields:
    const uint8_t* key  # the first word of the last non-empty KEYS (NULL: none)
    Py_ssize_t key_len
    Py_ssize_t body_at
    Py_ssize_t body_len
    bint tombstone


cdef int _key_fields(const uint8_t* p, Py_ssize_t n, KeyFields* f) except -1:
    """The compaction fields of the valid record ``p[:n]`` (compaction_fields's, without objects)."""
    if n < FIXED_OVERHEAD:
        raise ValueError(f"not a valid record: {n} bytes")
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
    if key != NULL:
        for k in range(key_len):
            if key[k] == 0x20:
                key_len = k
                break
        if not key_len:
            key = NULL
    f.key, f.key_len, f.body_at, f.body_len = key, key_len, body_at, body_len
    f.tombstone = body_len == 0 or delete == 1
    return 0


def compaction_fields(const uint8_t[::1] raw):
    """mqstore.compaction.rounds.compaction_fields_python: (the compaction key or None, whether the record is a
    tombstone, its body) of one valid record: the first word of the last non-empty KEYS property, decoded as
    UTF-8 with replacement; a tombstone has an empty body or a last non-empty DELETE property of "true"."""
    cdef Py_ssize_t n = raw.shape[0]
    cdef KeyFields f
    _key_fields(&raw[0] if n else NULL, n, &f)
    cdef const uint8_t* p = &raw[0]
    word = None if f.key == NULL else PyUnicode_DecodeUTF8(<const char*>f.key, f.key_len, "replace")
    return word, f.tombstone, PyBytes_FromStringAndSize(<const char*>p + f.body_at, f.body_len)


# ---- segment_keys: a segment's keyed records as (MD5 digest, entry) pairs in one call --------------------
# RFC 1321 MD5 of a key's UTF-8 bytes: offset_map.digest's (hashlib.md5(key.encode()).digest()).

cdef uint32_t* _MD5_K = [  # floor(abs(sin(i + 1)) * 2**32)
    0xD76AA478, 0xE8C7B756, 0x242070DB, 0xC1BDCEEE, 0xF57C0FAF, 0x4787C62A, 0xA8304613, 0xFD469501,
    0x698098D8, 0x8B44F7AF, 0xFFFF5BB1, 0x895CD7BE, 0x6B901122, 0xFD987193, 0xA679438E, 0x49B40821,
    0xF61E2562, 0xC040B340, 0x265E5A51, 0xE9B6C7AA, 0xD62F105D, 0x02441453, 0xD8A1E681, 0xE7D3FBC8,
    0x21E1CDE6, 0xC33707D6, 0xF4D50D87, 0x455A14ED, 0xA9E3E905, 0xFCEFA3F8, 0x676F02D9, 0x8D2A4C8A,
    0xFFFA3942, 0x8771F681, 0x6D9D6122, 0xFDE5380C, 0xA4BEEA44, 0x4BDECFA9, 0xF6BB4B60, 0xBEBFBC70,
    0x289B7EC6, 0xEAA127FA, 0xD4EF3085, 0x04881D05, 0xD9D4D039, 0xE6DB99E5, 0x1FA27CF8, 0xC4AC5665,
    0xF4292244, 0x432AFF97, 0xAB9423A7, 0xFC93A039, 0x655B59C3, 0x8F0CCC92, 0xFFEFF47D, 0x85845DD1,
    0x6FA87E4F, 0xFE2CE6E0, 0xA3014314, 0x4E0811A1, 0xF7537E82, 0xBD3AF235, 0x2AD7D2BB, 0xEB86D391,
]
cdef uint8_t* _MD5_S = [7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                        5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20,
                        4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                        6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21]


cdef inline uint32_t _le32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef void _md5_block(uint32_t* h, const uint8_t* p) noexcept nogil:
    cdef uint32_t m[16]
    cdef uint32_t a = h[0], b = h[1], c = h[2], d = h[3], f, t
    cdef int i, g
    for i in range(16):
        m[i] = _le32(p + 4 * i)
    for i in range(64):
        if i < 16:
            f, g = (b & c) | (~b & d), i
        elif i < 32:
            f, g = (d & b) | (~d & c), (5 * i + 1) & 15
        elif i < 48:
            f, g = b ^ c ^ d, (3 * i + 5) & 15
        else:
            f, g = c ^ (b | ~d), (7 * i) & 15
        t = d
        d = c
        c = b
        f = f + a + _MD5_K[i] + m[g]
        b = b + ((f << _MD5_S[i]) | (f >> (32 - _MD5_S[i])))
        a = t
    h[0] += a
    h[1] += b
    h[2] += c
    h[3] += d


cdef void _md5(const uint8_t* p, Py_ssize_t n, uint8_t* out) noexcept nogil:
    cdef uint32_t h[4]
    cdef uint8_t tail[128]
    cdef Py_ssize_t done = 0, rest, padded, k
    cdef uint64_t bits = (<uint64_t>n) << 3
    h[0], h[1], h[2], h[3] = 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476
    while n - done >= 64:
        _md5_block(h, p + done)
        done += 64
    rest = n - done
    padded = 64 if rest < 56 else 128
    memcpy(tail, p + done, rest)
    tail[rest] = 0x80
    memset(tail + rest + 1, 0, padded - rest - 1 - 8)
    for k in range(8):
        tail[padded - 8 + k] = (bits >> (8 * k)) & 0xFF
    _md5_block(h, tail)
    if padded == 128:
        _md5_block(h, tail + 64)
    for k in range(16):
        out[k] = (h[k >> 2] >> (8 * (k & 3))) & 0xFF


def md5_digest(const uint8_t[::1] data):
    """hashlib.md5(data).digest() (the walk's MD5, exposed for its test)."""
    cdef uint8_t out[16]
    _md5(&data[0] if data.shape[0] else NULL, data.shape[0], out)
    return PyBytes_FromStringAndSize(<const char*>out, 16)


cdef inline void _append(bytearray out, const uint8_t* src, Py_ssize_t n) except *:
    cdef Py_ssize_t old = len(out)
    PyByteArray_Resize(out, old + n)
    memcpy(PyByteArray_AS_STRING(out) + old, src, n)


def segment_keys(const uint8_t[::1] data, const int64_t[::1] positions, const int32_t[::1] sizes, int64_t base,
                 int64_t first, Py_ssize_t buckets):
    """mqstore.compaction.rounds.segment_keys_python: a segment's keyed records in one call. ``data`` holds the
    segment whose first byte is at ``base``; record k is ``data[positions[k] - base:][:sizes[k]]``, entry
    ``first + k`` of the round. Returns (pairs, tombstones): ``pairs`` a list of ``buckets`` bytearrays, each the
    (MD5 digest of the record's compaction key in UTF-8, entry) pairs (offset_map.PAIR: 16 bytes, int64
    little-endian) of the keyed records whose digest's first 4 bytes (big-endian) times ``buckets``, shifted
    right by 32, is that bucket's number, in log order; ``tombstones`` a bytearray of the keyed tombstones'
    entries (int64, native order), in log order. Keyless records are left out. The key is compaction_fields's
    (the first word of the last non-empty KEYS, UTF-8 decoded with replacement: ill-formed bytes are hashed as
    the replacement character's, as the digest of the decoded string is)."""
    cdef Py_ssize_t n = positions.shape[0], limit = data.shape[0], k, j, at, size, count = 0, b
    cdef const uint8_t* p = &data[0] if limit else NULL
    cdef KeyFields f
    cdef uint8_t pair[24]
    cdef int64_t entry
    cdef bint ascii
    cdef const char* utf8
    cdef Py_ssize_t utf8_len
    if sizes.shape[0] != n:
        raise ValueError(f"{n} positions but {sizes.shape[0]} sizes")
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, not {buckets}")
    parts = [bytearray() for _ in range(buckets)]
    tombstones = bytearray()
    cdef list plist = parts
    for k in range(n):
        at, size = positions[k] - base, sizes[k]
        if at < 0 or size < 0 or at + size > limit:
            raise ValueError(f"record {k} ({size} bytes at {positions[k]}) is not inside the segment at {base} "
                             f"({limit} bytes)")
        _key_fields(p + at, size, &f)
        if f.key == NULL:
            continue
        ascii = True
        for j in range(f.key_len):
            if f.key[j] & 0x80:
                ascii = False
                break
        if ascii:
            _md5(f.key, f.key_len, pair)
        else:  # as the reference: the key decoded with replacement, then encoded
            word = PyUnicode_DecodeUTF8(<const char*>f.key, f.key_len, "replace")
            utf8 = PyUnicode_AsUTF8AndSize(word, &utf8_len)
            _md5(<const uint8_t*>utf8, utf8_len, pair)
        entry = first + k
        for j in range(8):
            pair[16 + j] = (<uint64_t>entry >> (8 * j)) & 0xFF
        b = <Py_ssize_t>((<uint64_t>be32(pair) * <uint64_t>buckets) >> 32)
        _append(plist[b], pair, 24)
        if f.tombstone:
            _append(tombstones, <const uint8_t*>&entry, 8)
    return parts, tombstones


# ---- Scan: the ScanPage.values of a chunk of compaction log records ---------------------------------------
# What mqstore.compaction.reads.scan's reference take (Latest items) and compactor_service.servicer.latest_value
# give once serialized: per live record a LatestValue, fields in number order, zero values left out.

cdef inline Py_ssize_t _int_field_size(uint64_t value) noexcept nogil:
    return 1 + varint_size(value) if value else 0


cdef inline Py_ssize_t _put_int_field(uint8_t* out, Py_ssize_t at, uint8_t tag, uint64_t value) noexcept nogil:
    if value:
        out[at] = tag
        at = put_varint(out, at + 1, value)
    return at


def scan_values(const uint8_t[::1] data, int64_t start, const int64_t[::1] positions, const int32_t[::1] sizes,
                const int64_t[::1] offsets, const int64_t[::1] store_ms, dict latest, int32_t queue_id,
                bint include_tombstones, Py_ssize_t room, bytearray out):
    """The take of mqstore.compaction.reads.scan in wire bytes: for each record of the chunk (a qlog.Chunk's
    buffer and columns) that is the latest of its key (``latest[key] == its queue offset``) and not a
    tombstone unless ``include_tombstones``, appends a ScanPage.values item (a LatestValue: key, found,
    tombstone, value, queue_id, queue_offset, store_timestamp_ms) to ``out``, at most ``room`` of them,
    stopping after the room-th. Returns (records gone through, values appended)."""
    cdef Py_ssize_t count = offsets.shape[0], i, at, n, content, size, key_len, old
    cdef Py_ssize_t kept = 0
    cdef const uint8_t* p
    cdef const char* key
    cdef uint8_t* w
    cdef KeyFields f
    cdef object found
    if positions.shape[0] != count or sizes.shape[0] != count or store_ms.shape[0] != count:
        raise ValueError("the chunk's columns differ in length")
    for i in range(count):
        at = positions[i] - start
        n = sizes[i]
        if at < 0 or n < 0 or at + n > data.shape[0]:
            raise ValueError(f"record {i} of the chunk lies outside its {data.shape[0]} bytes")
        p = &data[0] + at
        _key_fields(p, n, &f)
        if f.key == NULL or (f.tombstone and not include_tombstones):
            continue
        word = PyUnicode_DecodeUTF8(<const char*>f.key, f.key_len, "replace")
        found = latest.get(word)
        if found is None or <int64_t>found != offsets[i]:
            continue
        key = PyUnicode_AsUTF8AndSize(word, &key_len)
        content = (1 + varint_size(<uint64_t>key_len) + key_len + 2 + (2 if f.tombstone else 0)
                   + (1 + varint_size(<uint64_t>f.body_len) + f.body_len if f.body_len else 0)
                   + _int_field_size(<uint64_t><int64_t>queue_id) + _int_field_size(<uint64_t>offsets[i])
                   + _int_field_size(<uint64_t>store_ms[i]))
        size = 1 + varint_size(<uint64_t>content) + content
        old = len(out)
        PyByteArray_Resize(out, old + size)
        w = <uint8_t*>PyByteArray_AS_STRING(out)
        at = old
        w[at] = 0x0A  # ScanPage.values
        at = put_varint(w, at + 1, <uint64_t>content)
        w[at] = 0x0A  # key
        at = put_varint(w, at + 1, <uint64_t>key_len)
        memcpy(w + at, key, key_len)
        at += key_len
        w[at], w[at + 1] = 0x10, 1  # found
        at += 2
        if f.tombstone:
            w[at], w[at + 1] = 0x18, 1
            at += 2
        if f.body_len:
            w[at] = 0x22  # value
            at = put_varint(w, at + 1, <uint64_t>f.body_len)
            memcpy(w + at, p + f.body_at, f.body_len)
            at += f.body_len
        at = _put_int_field(w, at, 0x28, <uint64_t><int64_t>queue_id)
        at = _put_int_field(w, at, 0x30, <uint64_t>offsets[i])
        at = _put_int_field(w, at, 0x38, <uint64_t>store_ms[i])
        kept += 1
        if kept == room:
            return i + 1, kept
    return count, kept
