# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Response messages serialised from the store's results, with no protobuf object per field: the
bytes protobuf's SerializeToString gives for the same message (fields in number order, zero values
left out as proto3 does), which tests/property/test_codec_append.py and test_codec_read.py check.

Thread-safety: pure functions.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memchr, memcmp, memcpy

from mqstore.codec._request cimport Prop, Span  # one Span and Prop for the request and the response side
from mqstore.codec._stamp cimport ENTRY_FIELDS, Entries
from mqstore.codec._wire cimport put_varint, valid_utf8, varint_size

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
    cdef Py_ssize_t prefix_length, uniq_length, msg_id_length, content, i, j
    cdef const char* prefix = PyUnicode_AsUTF8AndSize(batch.msg_id_prefix, &prefix_length)
    cdef const char* uniq
    cdef int64_t store_ts = batch.store_timestamp_ms
    cdef int64_t replicas = <int32_t>batch.replicas, epoch = batch.epoch
    cdef uint64_t physical_offset, queue_offset
    cdef int64_t queue_id, size  # int32 fields: a negative one is sign-extended to 10 bytes, as protobuf does
    cdef uint8_t* out
    cdef Py_ssize_t at, count
    cdef object entries = batch.entries
    cdef list uniq_keys = batch.uniq_keys
    cdef Entries columns = entries if type(entries) is Entries else None  # the compiled stamp's: no tuple read
    cdef const int64_t* cell
    msg_id_length = prefix_length + 16
    count = min(len(entries), len(uniq_keys))  # as zip
    for i in range(count):
        if columns is not None:
            cell = columns.cells + i * ENTRY_FIELDS
            physical_offset, size, queue_id, queue_offset = <uint64_t>cell[0], <int32_t>cell[1], <int32_t>cell[2], \
                <uint64_t>cell[3]
        else:
            entry = entries[i]
            physical_offset, size, queue_id, queue_offset = entry[0], <int32_t>entry[1], <int32_t>entry[2], entry[3]
        uniq = PyUnicode_AsUTF8AndSize(uniq_keys[i], &uniq_length)
        content = (1 + varint_size(msg_id_length) + msg_id_length
                   + (1 + varint_size(uniq_length) + uniq_length if uniq_length else 0)
                   + int_field_size(<uint64_t>queue_id) + int_field_size(queue_offset)
                   + int_field_size(physical_offset) + int_field_size(<uint64_t>size)
                   + int_field_size(<uint64_t>store_ts) + int_field_size(<uint64_t>durability)
                   + int_field_size(<uint64_t>replicas) + int_field_size(<uint64_t>epoch))
        reserve(buf, 1 + varint_size(<uint64_t>content) + content)
        out, at = buf.data, buf.length
        out[at] = 0x0A  # AppendResponse.results, length-delimited
        at = put_varint(out, at + 1, <uint64_t>content)
        out[at] = 0x0A  # AppendResult.msg_id: prefix + 16 hex digits of the physical offset
        at = put_varint(out, at + 1, <uint64_t>msg_id_length)
        memcpy(out + at, prefix, prefix_length)
        at += prefix_length
        for j in range(16):
            out[at + j] = HEX[(physical_offset >> (60 - 4 * j)) & 0xF]
        at += 16
        at = put_text_field(out, at, 0x12, uniq, uniq_length)
        at = put_int_field(out, at, 0x18, <uint64_t>queue_id)
        at = put_int_field(out, at, 0x20, queue_offset)
        at = put_int_field(out, at, 0x28, physical_offset)
        at = put_int_field(out, at, 0x30, <uint64_t>size)
        at = put_int_field(out, at, 0x38, <uint64_t>store_ts)
        at = put_int_field(out, at, 0x40, <uint64_t>durability)
        at = put_int_field(out, at, 0x48, <uint64_t>replicas)
        buf.length = put_int_field(out, at, 0x50, <uint64_t>epoch)
    return 0


# ---- Pull and GetMessage: StoredMessage bytes from the stored record's bytes --------------------------
# What mqstore_rpc.convert.stored_message gives, serialized with deterministic=True (map entries sorted
# by key as protobuf's upb runtime sorts them: bytewise, and of two names where one starts the other,
# the longer first). The record is an IPv4 one already checked by the store (CommitLog.checked_at); its offsets
# are those _records.WRITES names (mqstore.codec checks them against mqstore.format.record at import).
# A record of another host layout, or whose topic or properties are not valid UTF-8 (the reference
# decodes them with "replace"), is handed to the reference (``fallback``): the same bytes either way.

cdef enum:
    HOSTS_V6 = 0x30
    HOST_TEXT_MAX = 28  # "255.255.255.255:-2147483648"
    LOCAL_PROPS = 64    # properties items decoded without a malloc


cdef struct Fields:
    const uint8_t* rec
    Span topic
    Span body
    Span tags
    Span uniq
    Span keys
    Prop* props          # sorted by name, one per name
    Py_ssize_t count
    char born[HOST_TEXT_MAX]
    char store[HOST_TEXT_MAX]
    Py_ssize_t born_length
    Py_ssize_t store_length


cdef inline uint32_t be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>be32(p) << 32) | be32(p + 4)


cdef inline uint64_t i32(const uint8_t* p) noexcept nogil:
    """An int32 field as protobuf writes it: a negative one sign-extended to 64 bits."""
    return <uint64_t><int64_t><int32_t>be32(p)


cdef int compare_props(const void* a, const void* b) noexcept nogil:
    cdef const Prop* x = <const Prop*>a
    cdef const Prop* y = <const Prop*>b
    cdef int c = memcmp(x.name.ptr, y.name.ptr, min(x.name.length, y.name.length))
    if c:
        return c
    if x.name.length != y.name.length:  # one name starts the other: upb puts the longer first
        return 1 if x.name.length < y.name.length else -1
    return -1 if x.order < y.order else (1 if x.order > y.order else 0)


cdef Py_ssize_t split_props(const uint8_t* p, Py_ssize_t n, Prop* out) noexcept nogil:
    """``name\\x01value\\x02`` items into ``out``, skipping those without a name or a value; then sorted
    by name with only the last of each name kept. Returns how many."""
    cdef Py_ssize_t count = 0, kept = 0, i, start = 0, end
    cdef const uint8_t* sep
    while start < n:
        sep = <const uint8_t*>memchr(p + start, 2, n - start)
        end = sep - p if sep != NULL else n
        sep = <const uint8_t*>memchr(p + start, 1, end - start)
        if sep != NULL and sep > p + start and sep + 1 < p + end:
            out[count].name.ptr, out[count].name.length = p + start, sep - (p + start)
            out[count].value.ptr, out[count].value.length = sep + 1, p + end - (sep + 1)
            out[count].order = count
            count += 1
        start = end + 1
    qsort(out, count, sizeof(Prop), compare_props)
    for i in range(count):
        if (i + 1 < count and out[i + 1].name.length == out[i].name.length
                and memcmp(out[i + 1].name.ptr, out[i].name.ptr, out[i].name.length) == 0):
            continue  # a later one of the same name follows
        out[kept] = out[i]
        kept += 1
    return kept


cdef Span find_prop(const Fields* f, const char* name, Py_ssize_t length) noexcept nogil:
    cdef Span none
    cdef Py_ssize_t i
    none.ptr, none.length = NULL, 0
    for i in range(f.count):
        if f.props[i].name.length == length and memcmp(f.props[i].name.ptr, name, length) == 0:
            return f.props[i].value
    return none


cdef Py_ssize_t host_text(char* out, const uint8_t* host, const uint8_t* port) noexcept nogil:
    return snprintf(out, HOST_TEXT_MAX, "%u.%u.%u.%u:%d", host[0], host[1], host[2], host[3],
                    <int32_t>be32(port))


cdef Py_ssize_t props_bytes(const uint8_t* rec, Py_ssize_t length) noexcept nogil:
    """PROPERTIESLENGTH of a checked IPv4 record (0 for another layout: read_fields refuses it)."""
    cdef Py_ssize_t props_at
    if be32(rec + 36) & HOSTS_V6 or length < 91:
        return 0
    props_at = 88 + <int32_t>be32(rec + 84)
    props_at += 1 + rec[props_at]
    return (rec[props_at] << 8) | rec[props_at + 1]


cdef bint read_fields(Fields* f, const uint8_t* rec, Py_ssize_t length) noexcept nogil:
    """The fields of a checked IPv4 record; False when the reference has to encode it."""
    cdef Py_ssize_t topic_at, props_at, props_length
    if be32(rec + 36) & HOSTS_V6 or length < 91:
        return False
    f.rec = rec
    f.body.ptr, f.body.length = rec + 88, <int32_t>be32(rec + 84)
    topic_at = 88 + f.body.length
    f.topic.ptr, f.topic.length = rec + topic_at + 1, rec[topic_at]
    props_at = topic_at + 1 + f.topic.length
    props_length = (rec[props_at] << 8) | rec[props_at + 1]
    if (props_at + 2 + props_length > length or not valid_utf8(f.topic.ptr, f.topic.length)
            or not valid_utf8(rec + props_at + 2, props_length)):
        return False
    f.count = split_props(rec + props_at + 2, props_length, f.props)
    f.tags = find_prop(f, "TAGS", 4)
    f.uniq = find_prop(f, "UNIQ_KEY", 8)
    f.keys = find_prop(f, "KEYS", 4)
    f.born_length = host_text(f.born, rec + 48, rec + 52)
    f.store_length = host_text(f.store, rec + 64, rec + 68)
    return True


cdef inline Py_ssize_t text_size(Py_ssize_t length, int tag_bytes) noexcept nogil:
    return tag_bytes + varint_size(<uint64_t>length) + length if length else 0


cdef inline int int2_size(uint64_t value) noexcept nogil:
    """A varint field of a two-byte tag (field numbers 16 and up); 0 when left out."""
    return 2 + varint_size(value) if value else 0


cdef Py_ssize_t message_size(const Fields* f, Py_ssize_t msg_id_length) noexcept nogil:
    cdef const uint8_t* r = f.rec
    cdef Py_ssize_t size, i, start, entry
    size = (text_size(f.topic.length, 1) + int_field_size(i32(r + 12)) + int_field_size(be64(r + 20))
            + int_field_size(be64(r + 28)) + int_field_size(i32(r)) + text_size(msg_id_length, 1)
            + text_size(f.uniq.length, 1) + text_size(f.body.length, 1) + text_size(f.tags.length, 1)
            + int_field_size(i32(r + 16)) + int_field_size(i32(r + 36)) + int_field_size(be64(r + 40))
            + int_field_size(be64(r + 56)) + text_size(f.born_length, 2) + text_size(f.store_length, 2)
            + int2_size(i32(r + 72)) + int2_size(be64(r + 76)) + int2_size(be32(r + 8)))
    start = 0
    for i in range(f.keys.length + 1):
        if i == f.keys.length or f.keys.ptr[i] == 32:
            size += text_size(i - start, 1)
            start = i + 1
    for i in range(f.count):
        entry = text_size(f.props[i].name.length, 1) + text_size(f.props[i].value.length, 1)
        size += 1 + varint_size(<uint64_t>entry) + entry
    return size


cdef inline Py_ssize_t put_int2_field(uint8_t* out, Py_ssize_t at, uint8_t tag, uint64_t value) noexcept nogil:
    if value:
        out[at], out[at + 1] = tag, 0x01
        at = put_varint(out, at + 2, value)
    return at


cdef inline Py_ssize_t put_text2_field(uint8_t* out, Py_ssize_t at, uint8_t tag, const char* text,
                                       Py_ssize_t length) noexcept nogil:
    out[at] = tag
    return put_text_field(out, at + 1, 0x01, text, length)


cdef Py_ssize_t put_message(uint8_t* out, Py_ssize_t at, const Fields* f, const char* prefix,
                            Py_ssize_t prefix_length) noexcept nogil:
    """Writes the StoredMessage's fields in number order, as protobuf does."""
    cdef const uint8_t* r = f.rec
    cdef uint64_t physical_offset = be64(r + 28)
    cdef Py_ssize_t i, start, entry
    at = put_text_field(out, at, 0x0A, <const char*>f.topic.ptr, f.topic.length)
    at = put_int_field(out, at, 0x10, i32(r + 12))
    at = put_int_field(out, at, 0x18, be64(r + 20))
    at = put_int_field(out, at, 0x20, physical_offset)
    at = put_int_field(out, at, 0x28, i32(r))
    out[at] = 0x32  # msg_id: the prefix and 16 hex digits of the physical offset
    at = put_varint(out, at + 1, <uint64_t>(prefix_length + 16))
    memcpy(out + at, prefix, prefix_length)
    at += prefix_length
    for i in range(16):
        out[at + i] = HEX[(physical_offset >> (60 - 4 * i)) & 0xF]
    at += 16
    at = put_text_field(out, at, 0x3A, <const char*>f.uniq.ptr, f.uniq.length)
    at = put_text_field(out, at, 0x42, <const char*>f.body.ptr, f.body.length)
    at = put_text_field(out, at, 0x4A, <const char*>f.tags.ptr, f.tags.length)
    start = 0
    for i in range(f.keys.length + 1):  # keys: KEYS split at spaces, empty ones left out
        if i == f.keys.length or f.keys.ptr[i] == 32:
            at = put_text_field(out, at, 0x52, <const char*>f.keys.ptr + start, i - start)
            start = i + 1
    for i in range(f.count):  # properties: one map entry (key = 1, value = 2) per name
        entry = text_size(f.props[i].name.length, 1) + text_size(f.props[i].value.length, 1)
        out[at] = 0x5A
        at = put_varint(out, at + 1, <uint64_t>entry)
        at = put_text_field(out, at, 0x0A, <const char*>f.props[i].name.ptr, f.props[i].name.length)
        at = put_text_field(out, at, 0x12, <const char*>f.props[i].value.ptr, f.props[i].value.length)
    at = put_int_field(out, at, 0x60, i32(r + 16))
    at = put_int_field(out, at, 0x68, i32(r + 36))
    at = put_int_field(out, at, 0x70, be64(r + 40))
    at = put_int_field(out, at, 0x78, be64(r + 56))
    at = put_text2_field(out, at, 0x82, f.born, f.born_length)
    at = put_text2_field(out, at, 0x8A, f.store, f.store_length)
    at = put_int2_field(out, at, 0x90, i32(r + 72))
    at = put_int2_field(out, at, 0x98, be64(r + 76))
    return put_int2_field(out, at, 0xA0, be32(r + 8))


cdef Prop* props_space(Prop* local, Py_ssize_t most) except NULL:
    """Room for ``most`` properties items: ``local`` (LOCAL_PROPS on the caller's stack) when it is enough, else
    malloc'd (props_release gives it back)."""
    if most <= LOCAL_PROPS:
        return local
    cdef Prop* props = <Prop*>malloc(sizeof(Prop) * most)
    if props == NULL:
        raise MemoryError()
    return props


cdef inline void props_release(Prop* props, Prop* local) noexcept:
    if props != local:
        free(props)


cdef int _put_stored(Buffer* buf, bytes record, const char* prefix, Py_ssize_t prefix_length, fallback,
                     bint framed) except -1:
    """One StoredMessage into ``buf``; ``framed``: as PullResponse.messages (tag and length first)."""
    cdef const uint8_t* rec = <const uint8_t*>(<const char*>record)
    cdef Py_ssize_t length = len(record), size
    cdef Fields f
    cdef bytes encoded
    cdef Prop local[LOCAL_PROPS]
    cdef Py_ssize_t most = props_bytes(rec, length) // 2 + 1  # an item takes at least 2 bytes
    f.props = props_space(&local[0], most)
    try:
        if read_fields(&f, rec, length):
            size = message_size(&f, prefix_length + 16)
            reserve(buf, 1 + 10 + size)
            if framed:
                buf.data[buf.length] = 0x0A
                buf.length = put_varint(buf.data, buf.length + 1, <uint64_t>size)
            buf.length = put_message(buf.data, buf.length, &f, prefix, prefix_length)
            return 0
    finally:
        props_release(f.props, &local[0])
    encoded = fallback(record, (<bytes>prefix[:prefix_length]).decode("ascii"))
    size = len(encoded)
    reserve(buf, 1 + 10 + size)
    if framed:
        buf.data[buf.length] = 0x0A
        buf.length = put_varint(buf.data, buf.length + 1, <uint64_t>size)
    memcpy(buf.data + buf.length, <const char*>encoded, size)
    buf.length += size
    return 0


def stored_message(bytes record, str msg_id_prefix, fallback):
    """mqstore.v1.StoredMessage bytes of a checked record (GetMessage); ``msg_id_prefix`` is the part
    of the message id before the physical offset; ``fallback(record, msg_id_prefix)`` the reference."""
    cdef Buffer buf
    cdef Py_ssize_t prefix_length
    cdef const char* prefix = PyUnicode_AsUTF8AndSize(msg_id_prefix, &prefix_length)
    buf.data, buf.length, buf.capacity = NULL, 0, 0
    try:
        _put_stored(&buf, record, prefix, prefix_length, fallback, False)
        return PyBytes_FromStringAndSize(<const char*>buf.data, buf.length)
    finally:
        free(buf.data)


def pull_response(list records, str msg_id_prefix, int64_t next_offset, int64_t min_offset, int64_t max_offset,
                  fallback):
    """mqstore.v1.PullResponse bytes: a StoredMessage per checked record (every message id with
    ``msg_id_prefix``, as mqstore.queue.pull gives them), then the offsets."""
    cdef Buffer buf
    cdef Py_ssize_t prefix_length
    cdef const char* prefix = PyUnicode_AsUTF8AndSize(msg_id_prefix, &prefix_length)
    cdef uint8_t* out
    buf.data, buf.length, buf.capacity = NULL, 0, 0
    try:
        for record in records:
            _put_stored(&buf, record, prefix, prefix_length, fallback, True)
        reserve(&buf, 33)
        out = buf.data
        buf.length = put_int_field(out, buf.length, 0x10, <uint64_t>next_offset)
        buf.length = put_int_field(out, buf.length, 0x18, <uint64_t>min_offset)
        buf.length = put_int_field(out, buf.length, 0x20, <uint64_t>max_offset)
        return PyBytes_FromStringAndSize(<const char*>buf.data, buf.length)
    finally:
        free(buf.data)


# ---- Receive: from the store's decoded records ---------------------------------------------------------
# A pop Receive hands over Record objects (mqstore.format.record_reader.Record), not record bytes: the
# receive decodes them for its own rules. Their fixed fields are written into a record header of the
# on-disk layout (the offsets read_fields' readers use), their text and body pointed at where Python keeps
# them, so message_size and put_message serve both paths. A record the reference has to encode (an IPv6
# host, a value outside its field's range, an empty property name or value, text that is not UTF-8, a
# message id that is not its physical offset's) goes to ``fallback``: the same bytes either way.

cdef enum:
    HEADER_BYTES = 88


cdef inline void put_be32(uint8_t* p, uint32_t value) noexcept nogil:
    p[0], p[1], p[2], p[3] = (value >> 24) & 0xFF, (value >> 16) & 0xFF, (value >> 8) & 0xFF, value & 0xFF


cdef inline void put_be64(uint8_t* p, uint64_t value) noexcept nogil:
    put_be32(p, <uint32_t>(value >> 32))
    put_be32(p + 4, <uint32_t>value)


cdef enum:
    INT32, UINT32, INT64  # a header field's kind


cdef bint header_int(uint8_t* p, object value, int kind):
    """``value`` at ``p`` as the layout's 4 (INT32, UINT32) or 8 (INT64) big-endian bytes; False when it is not an
    int of the field's range."""
    cdef int64_t v
    if type(value) is not int:
        return False
    try:
        v = value
    except OverflowError:
        return False
    if kind == INT64:
        put_be64(p, <uint64_t>v)
        return True
    if (v < 0 or v > 0xFFFFFFFF) if kind == UINT32 else (v < -2147483648 or v > 2147483647):
        return False
    put_be32(p, <uint32_t>v)
    return True


cdef bint utf8_of(object text, Span* out):
    """``text``'s UTF-8 (kept by the str object); False for what is not a str or has no UTF-8 (surrogates)."""
    cdef Py_ssize_t length
    cdef const char* ptr
    if type(text) is not str:
        return False
    try:
        ptr = PyUnicode_AsUTF8AndSize(text, &length)
    except UnicodeError:
        return False
    out.ptr, out.length = <const uint8_t*>ptr, length
    return True


cdef bint host_of(uint8_t* p, object host, object port):
    if type(host) is not bytes or len(<bytes>host) != 4:
        return False
    memcpy(p, <const char*>(<bytes>host), 4)
    return header_int(p + 4, port, INT32)


cdef bint object_fields(Fields* f, uint8_t* header, object rec, Py_ssize_t most) except -1:
    """The fields of a decoded Record into ``f`` (``header``: HEADER_BYTES of the layout, ``f.props``: room
    for ``most`` properties); False when the reference has to encode it."""
    cdef object body = rec.body, properties = rec.properties
    cdef Py_ssize_t i
    if not (header_int(header, rec.size, INT32) and header_int(header + 8, rec.body_crc, UINT32)
            and header_int(header + 12, rec.queue_id, INT32) and header_int(header + 16, rec.flag, INT32)
            and header_int(header + 20, rec.queue_offset, INT64) and header_int(header + 28, rec.physical_offset, INT64)
            and header_int(header + 36, rec.sys_flag, INT32) and header_int(header + 40, rec.born_timestamp_ms, INT64)
            and host_of(header + 48, rec.born_host, rec.born_port)
            and header_int(header + 56, rec.store_timestamp_ms, INT64)
            and host_of(header + 64, rec.store_host, rec.store_port)
            and header_int(header + 72, rec.reconsume_times, INT32)
            and header_int(header + 76, rec.prepared_transaction_offset, INT64)):
        return False
    if type(body) is not bytes or type(properties) is not dict or len(<dict>properties) > most:
        return False
    if not utf8_of(rec.topic, &f.topic):
        return False
    f.rec = header
    f.body.ptr, f.body.length = <const uint8_t*>(<const char*>(<bytes>body)), len(<bytes>body)
    i = 0
    for name, value in (<dict>properties).items():
        if not (utf8_of(name, &f.props[i].name) and utf8_of(value, &f.props[i].value)):
            return False
        if f.props[i].name.length == 0 or f.props[i].value.length == 0:
            return False
        f.props[i].order = i
        i += 1
    f.count = i
    qsort(f.props, f.count, sizeof(Prop), compare_props)
    f.tags = find_prop(f, "TAGS", 4)
    f.uniq = find_prop(f, "UNIQ_KEY", 8)
    f.keys = find_prop(f, "KEYS", 4)
    f.born_length = host_text(f.born, header + 48, header + 52)
    f.store_length = host_text(f.store, header + 64, header + 68)
    return True


cdef bint offset_id(object msg_id, uint64_t physical_offset, Span* prefix):
    """The part of ``msg_id`` before its 16 hex digits, when they are ``physical_offset``'s (upper case)."""
    cdef Span text
    cdef Py_ssize_t i
    if not utf8_of(msg_id, &text) or text.length < 16:
        return False
    for i in range(16):
        if text.ptr[text.length - 16 + i] != HEX[(physical_offset >> (60 - 4 * i)) & 0xF]:
            return False
    prefix.ptr, prefix.length = text.ptr, text.length - 16
    return True


cdef int _put_received(Buffer* buf, object delivery, fallback) except -1:
    """One ReceiveResponse.messages item (tag, length, ReceivedMessage) of a pop delivery."""
    cdef object message = delivery.message
    cdef object rec = message.record
    cdef object properties = rec.properties
    cdef uint8_t header[HEADER_BYTES]
    cdef Fields f
    cdef Span topic, handle, prefix
    cdef Prop local[LOCAL_PROPS]
    cdef Py_ssize_t most = len(properties) if type(properties) is dict else 0
    cdef Py_ssize_t stored_size, size
    cdef uint64_t attempt, visible
    cdef bint ours
    cdef bytes encoded = None
    cdef int32_t attempt32
    cdef int64_t visible64
    prefix.ptr, prefix.length = NULL, 0
    if not (utf8_of(delivery.topic, &topic) and utf8_of(delivery.receipt_handle, &handle)):
        raise TypeError("a delivery's topic and receipt handle are str")
    attempt32, visible64 = delivery.attempt, delivery.visible_at_ms  # OverflowError as protobuf's ValueError
    attempt, visible = <uint64_t><int64_t>attempt32, <uint64_t>visible64
    f.props = props_space(&local[0], most)
    try:
        ours = object_fields(&f, header, rec, most) and offset_id(message.msg_id, be64(header + 28), &prefix)
        if ours:
            stored_size = message_size(&f, prefix.length + 16)
        else:
            encoded = fallback(message)
            stored_size = len(encoded)
        size = (1 + varint_size(<uint64_t>stored_size) + stored_size + text_size(topic.length, 1)
                + text_size(handle.length, 1) + int_field_size(attempt) + int_field_size(visible))
        reserve(buf, 1 + 10 + size)
        buf.data[buf.length] = 0x0A
        buf.length = put_varint(buf.data, buf.length + 1, <uint64_t>size)
        buf.data[buf.length] = 0x0A
        buf.length = put_varint(buf.data, buf.length + 1, <uint64_t>stored_size)
        if ours:
            buf.length = put_message(buf.data, buf.length, &f, <const char*>prefix.ptr, prefix.length)
        else:
            memcpy(buf.data + buf.length, <const char*>encoded, stored_size)
            buf.length += stored_size
        buf.length = put_text_field(buf.data, buf.length, 0x12, <const char*>topic.ptr, topic.length)
        buf.length = put_text_field(buf.data, buf.length, 0x1A, <const char*>handle.ptr, handle.length)
        buf.length = put_int_field(buf.data, buf.length, 0x20, attempt)
        buf.length = put_int_field(buf.data, buf.length, 0x28, visible)
    finally:
        props_release(f.props, &local[0])
    return 0


def receive_response(list deliveries, int64_t pop_time_ms, fallback):
    """mqstore.v1.ReceiveResponse bytes of pop's deliveries (mqstore.pop.receive.Delivery: message, topic,
    receipt_handle, attempt, visible_at_ms); ``fallback(message)`` the reference StoredMessage bytes of a
    delivery's StoredMessage that this encoder leaves to it."""
    cdef Buffer buf
    buf.data, buf.length, buf.capacity = NULL, 0, 0
    try:
        for delivery in deliveries:
            _put_received(&buf, delivery, fallback)
        reserve(&buf, 11)
        buf.length = put_int_field(buf.data, buf.length, 0x10, <uint64_t>pop_time_ms)
        return PyBytes_FromStringAndSize(<const char*>buf.data, buf.length)
    finally:
        free(buf.data)
