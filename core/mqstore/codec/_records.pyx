# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""WireMessages to commit log records: what mqstore.log.encoder.MessageEncoder.encode_batch does with
the messages (batch limits, queue choice, the TAGS/KEYS/UNIQ_KEY rules, user properties, the record
layout of mqstore.format.record), in C, giving the same EncodedBatch columns.

:meth:`AppendEncoder.encode` first checks every message without taking anything; if the reference
would refuse any of it, it returns None, having taken no UNIQ_KEY and no round-robin slot, and the
caller runs the reference encoder on the same messages (WireMessages.to_messages), which raises the
error that says why. So both paths give the same errors by construction, with the same side effects;
tests/property/test_codec_append.py checks that they accept and refuse the same requests and produce
the same bytes.

:func:`timer_batch` makes the timer topic's records of a delayed batch (mqstore.timer.scheduling's) as new
WireMessages over the same request bytes, for the AppendEncoder: what mqstore.timer.messages.timer_records gives,
or None wherever the reference could refuse anything (tests/property/test_codec_timer.py).

Thread-safety: an AppendEncoder holds only read-only settings, so one instance serves every thread;
the state a batch changes (UNIQ_KEY counter, round-robin slots) lives in the Python objects it calls.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython cimport array as carray
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeASCII
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memchr, memcmp, memcpy, memset, strlen

from mqstore.codec._request cimport Msg, Prop, Span, WireMessages, one_per_name, text_of
from mqstore.codec._wire cimport java_hash_utf8, put_be16, put_be32, put_be64, valid_utf8
from mqstore.codec._walk cimport RecordSpan, body_at_of, check_record
from mqstore.codec._stamp cimport ENTRY_FIELDS, Entries

cdef extern from "_crc.h":
    uint32_t mq_crc32(uint32_t crc, const uint8_t* p, size_t n) nogil  # zlib's crc32, folded where the CPU can
    void mq_crc64_init()
    uint64_t mq_crc64nvme(uint64_t crc, const uint8_t* p, size_t n) nogil  # CRC-64/NVME, folded likewise

mq_crc64_init()

# mqstore.format.record (tests compare the bytes with it)
cdef uint32_t MAGIC_V1 = 0xDAA320A7
cdef enum:
    HEADER_SIZE = 88
    FIXED_OVERHEAD = 91
    BLANK_SIZE = 8
    MAX_PROPERTIES_BYTES = 32767
    _NOGIL_FROM_BYTES = 16384  # batches from this size are written without the GIL (AppendEncoder._write)


# Where _put_record writes each field of the IPv4 layout (the only one gRPC appends produce: BORNHOST
# is the IPv4 peer, STOREHOST the encoder's IPv4 host), named as mqstore.format.record.Layout's fields;
# mqstore.codec checks them against record.IPV4 at import, so a change of the layout cannot go unseen.
WRITES = dict(born_port_at=52, store_timestamp_at=56, store_host_at=64, store_port_at=68, reconsume_times_at=72,
              prepared_transaction_offset_at=76, body_length_at=84, body_at=HEADER_SIZE, magic=MAGIC_V1,
              fixed_overhead=FIXED_OVERHEAD, blank_size=BLANK_SIZE, max_properties_bytes=MAX_PROPERTIES_BYTES)


cdef struct Plan:
    Span tags            # the tag stored (the field's or the TAGS property's)
    Span keys_prop       # the KEYS property, stored as given; ptr NULL: the keys field, joined
    Py_ssize_t keys_len  # bytes of the KEYS value; 0 = no KEYS
    Span uniq            # the UNIQ_KEY property; ptr NULL: a generated key
    Py_ssize_t props_len
    Py_ssize_t size
    int32_t qid          # -1 = round robin, assigned once the batch is accepted


cdef enum Reserved:
    USER = 0
    TAGS = 1
    KEYS = 2
    UNIQ_KEY = 3

cdef const char* HEX = b"0123456789ABCDEF"


cdef Reserved _reserved(Span name) noexcept nogil:
    if name.length == 4 and memcmp(name.ptr, b"TAGS", 4) == 0:
        return TAGS
    if name.length == 4 and memcmp(name.ptr, b"KEYS", 4) == 0:
        return KEYS
    if name.length == 8 and memcmp(name.ptr, b"UNIQ_KEY", 8) == 0:
        return UNIQ_KEY
    return USER


cdef bint _has_separator(Span s) noexcept nogil:
    """Holds \\x01 or \\x02, the property separators."""
    return memchr(s.ptr, 1, s.length) != NULL or memchr(s.ptr, 2, s.length) != NULL


cdef bint _valid_key(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """encoder._check_keys' rule for one key: non-empty, no space, \\t \\n \\v \\f \\r, \\x01 or \\x02."""
    cdef Py_ssize_t i
    if n == 0:
        return False
    for i in range(n):
        if s[i] == 0x20 or s[i] == 1 or s[i] == 2 or 9 <= s[i] <= 13:
            return False
    return True


cdef bint _valid_keys_property(Span s) noexcept nogil:
    """The KEYS property as stored: valid keys separated by single spaces."""
    cdef Py_ssize_t i, start = 0
    for i in range(s.length + 1):
        if i == s.length or s.ptr[i] == 0x20:
            if not _valid_key(s.ptr + start, i - start):
                return False
            start = i + 1
    return True


cdef bint _same_keys(WireMessages wire, const Msg* m, Span prop) noexcept nogil:
    """The keys field equals the KEYS property split at its spaces."""
    cdef Py_ssize_t k, stop, at = 0
    cdef Span key
    for k in range(m.keys_from, m.keys_to):
        if at > prop.length:
            return False
        stop = at
        while stop < prop.length and prop.ptr[stop] != 0x20:
            stop += 1
        key = wire.keys[k]
        if key.length != stop - at or memcmp(key.ptr, prop.ptr + at, key.length) != 0:
            return False
        at = stop + 1
    return at == prop.length + 1


cdef inline int32_t _hash_queue(Span key, int32_t queue_count) noexcept nogil:
    """Java String.hashCode of ``key`` floor-modulo ``queue_count`` (Python's %)."""
    cdef int32_t found = java_hash_utf8(key.ptr, key.length) % queue_count
    return found + queue_count if found < 0 else found


cdef int32_t _queue_of(WireMessages wire, const Msg* m, int32_t queue_count, bint compaction) noexcept nogil:
    """encoder._queues_for's rule for other than COMPACTION topics: the queue id, -1 for round robin, -2
    if refused. (COMPACTION topics route by the key: _compaction_queue, once the KEYS are known.)"""
    if compaction:
        return 0
    if m.has_qid:
        return m.qid if 0 <= m.qid < queue_count else -2
    if m.shard.length:
        return _hash_queue(m.shard, queue_count)
    return -1


cdef int32_t _compaction_queue(WireMessages wire, const Msg* m, const Plan* plan,
                               int32_t queue_count) noexcept nogil:
    """mqstore.message_keys.compaction_queue: the queue of the message's first key (the keys field's,
    else the KEYS property's first entry); -2 where the reference refuses (no key, or a queue_id or
    sharding_key that disagrees with the key's queue)."""
    cdef Span key
    cdef int32_t queue
    cdef const uint8_t* space
    if m.keys_to > m.keys_from:
        key = wire.keys[m.keys_from]
    elif plan.keys_prop.ptr != NULL:
        key = plan.keys_prop
        space = <const uint8_t*>memchr(key.ptr, 0x20, key.length)
        if space != NULL:
            key.length = space - key.ptr
    else:
        return -2
    if key.length == 0:
        return -2
    queue = _hash_queue(key, queue_count)
    if m.has_qid and m.qid != queue:
        return -2
    if m.shard.length and _hash_queue(m.shard, queue_count) != queue:
        return -2
    return queue


cdef bint _plan(WireMessages wire, const Msg* m, Plan* plan, Py_ssize_t fixed_bytes, Py_ssize_t generated_length,
                bint compaction, Py_ssize_t segment_size_bytes) noexcept nogil:
    """Fill ``plan`` with what the message's record holds; False if the reference would refuse it."""
    cdef Py_ssize_t k, props_len = 0, keys_len = 0
    cdef const Prop* prop
    cdef Reserved kind
    plan.tags = m.tags
    plan.keys_prop.ptr = plan.uniq.ptr = NULL
    for k in range(m.props_from, m.props_to):
        prop = &wire.props[k]
        kind = _reserved(prop.name)
        if kind == USER:
            if (prop.name.length == 0 or prop.value.length == 0 or _has_separator(prop.name)
                    or _has_separator(prop.value)):
                return False
            props_len += prop.name.length + prop.value.length + 2
        elif kind == TAGS:
            if prop.value.length == 0 or (m.tags.length and (m.tags.length != prop.value.length or memcmp(
                    m.tags.ptr, prop.value.ptr, m.tags.length) != 0)):
                return False
            plan.tags = prop.value
        elif kind == KEYS:
            if not _valid_keys_property(prop.value) or (m.keys_to > m.keys_from and
                                                        not _same_keys(wire, m, prop.value)):
                return False
            plan.keys_prop = prop.value
            keys_len = prop.value.length
        else:
            if not _valid_key(prop.value.ptr, prop.value.length):
                return False
            plan.uniq = prop.value
    if plan.tags.length:
        if _has_separator(plan.tags):
            return False
        props_len += 6 + plan.tags.length
    if plan.keys_prop.ptr == NULL and m.keys_to > m.keys_from:
        keys_len = -1
        for k in range(m.keys_from, m.keys_to):
            if not _valid_key(wire.keys[k].ptr, wire.keys[k].length):
                return False
            keys_len += wire.keys[k].length + 1
    if keys_len:
        props_len += 6 + keys_len
    plan.keys_len = keys_len
    props_len += 10 + (plan.uniq.length if plan.uniq.ptr != NULL else generated_length)
    plan.props_len = props_len
    plan.size = fixed_bytes + m.body.length + props_len
    return not ((m.body.length == 0 and not compaction) or props_len > MAX_PROPERTIES_BYTES
                or plan.size + BLANK_SIZE > segment_size_bytes or m.born_ts < 0)


cdef inline uint8_t* _put(uint8_t* out, const void* data, Py_ssize_t length) noexcept nogil:
    memcpy(out, data, length)
    return out + length


cdef uint8_t* _put_properties(uint8_t* out, WireMessages wire, const Msg* m, const Plan* plan,
                              const uint8_t* generated, Py_ssize_t generated_length) noexcept nogil:
    """PROPERTIES as encoder._properties builds them: user entries, then TAGS, KEYS, UNIQ_KEY."""
    cdef Py_ssize_t k
    cdef const Prop* prop
    for k in range(m.props_from, m.props_to):
        prop = &wire.props[k]
        if _reserved(prop.name) == USER:
            out = _put(out, prop.name.ptr, prop.name.length)
            out[0] = 1
            out = _put(out + 1, prop.value.ptr, prop.value.length)
            out[0] = 2
            out += 1
    if plan.tags.length:
        out = _put(_put(out, b"TAGS\x01", 5), plan.tags.ptr, plan.tags.length)
        out[0] = 2
        out += 1
    if plan.keys_len:
        out = _put(out, b"KEYS\x01", 5)
        if plan.keys_prop.ptr != NULL:
            out = _put(out, plan.keys_prop.ptr, plan.keys_prop.length)
        else:
            for k in range(m.keys_from, m.keys_to):
                if k > m.keys_from:
                    out[0] = 0x20
                    out += 1
                out = _put(out, wire.keys[k].ptr, wire.keys[k].length)
        out[0] = 2
        out += 1
    out = _put(out, b"UNIQ_KEY\x01", 9)
    if plan.uniq.ptr != NULL:
        out = _put(out, plan.uniq.ptr, plan.uniq.length)
    else:
        out = _put(out, generated, generated_length)
    out[0] = 2
    return out + 1


cdef uint32_t _body_crc(Span body) noexcept nogil:
    """zlib CRC32 of the body & 0x7FFFFFFF (mqstore.format.record.body_crc), by _crc.h's mq_crc32."""
    return mq_crc32(0, body.ptr, <size_t>body.length) & 0x7FFFFFFF


def body_crc(data) -> int:
    """_body_crc of a bytes-like object: what mqstore.format.record.body_crc gives (the property test's way in)."""
    cdef const uint8_t[::1] view = data
    return mq_crc32(0, &view[0] if view.shape[0] else NULL, <size_t>view.shape[0]) & 0x7FFFFFFF


def crc64nvme(data, uint64_t crc=0) -> int:
    """CRC-64/NVME of a bytes-like object (a memory map's view included) continuing from ``crc`` (0: from the
    start), by _crc.h's mq_crc64nvme without the GIL: mqstore.format.crc64's compiled path (a tier upload record's
    checksum of a whole segment)."""
    cdef const uint8_t[::1] view = data
    cdef size_t n = <size_t>view.shape[0]
    cdef const uint8_t* p = &view[0] if n else NULL
    cdef uint64_t result
    with nogil:
        result = mq_crc64nvme(crc, p, n)
    return result


cdef uint8_t* _put_record(uint8_t* out, WireMessages wire, const Msg* m, const Plan* plan, Span topic,
                          int64_t now_ms, const uint8_t* store_host, int32_t store_port,
                          const uint8_t* generated, Py_ssize_t generated_length) noexcept nogil:
    """One V1 record (mqstore.format.record's layout) with queue offset, physical offset and store time
    zero: the commit log stamps them inside its lock."""
    put_be32(out, <uint32_t>plan.size)
    put_be32(out + 4, MAGIC_V1)
    put_be32(out + 8, _body_crc(m.body))
    put_be32(out + 12, <uint32_t>plan.qid)
    put_be32(out + 16, <uint32_t>m.flag)
    memset(out + 20, 0, 20)  # QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG
    put_be64(out + 40, <uint64_t>(m.born_ts if m.born_ts else now_ms))
    if m.own_born:  # an InternalMessage's born host (_request.parse_internal_batches)
        memcpy(out + 48, m.born_host, 4)
        put_be32(out + 52, <uint32_t>m.born_port)  # offsets: WRITES
    else:
        memcpy(out + 48, wire.born_host, 4)
        put_be32(out + 52, <uint32_t>wire.born_port)
    memset(out + 56, 0, 8)  # STORETIMESTAMP
    memcpy(out + 64, store_host, 4)
    put_be32(out + 68, <uint32_t>store_port)
    memset(out + 72, 0, 12)  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET
    put_be32(out + 84, <uint32_t>m.body.length)
    out = _put(out + HEADER_SIZE, m.body.ptr, m.body.length)
    out[0] = <uint8_t>topic.length
    out = _put(out + 1, topic.ptr, topic.length)
    put_be16(out, <uint16_t>plan.props_len)
    return _put_properties(out + 2, wire, m, plan, generated, generated_length)


cdef struct CopyPlan:
    const char* body
    Py_ssize_t body_length
    const char* props
    Py_ssize_t props_length
    const char* born_host
    int32_t crc
    int32_t flag
    int32_t born_port
    int64_t born_ts
    int32_t qid
    int32_t tag_code
    bint generated          # no UNIQ_KEY given: the record's properties end with a fresh one's entry
    Py_ssize_t size


cdef uint8_t* _put_copy(uint8_t* out, const CopyPlan* plan, const uint8_t* topic, Py_ssize_t topic_length,
                        int64_t now_ms, const uint8_t* store_host, int32_t store_port, const uint8_t* generated,
                        Py_ssize_t generated_length) noexcept nogil:
    """One copy's V1 record, IPv4 layout (record.encode_parts with the copy's BODYCRC), stamped fields zero; a copy
    without a UNIQ_KEY gets ``generated`` (the key's characters) as the entry the reference appends."""
    put_be32(out, <uint32_t>plan.size)
    put_be32(out + 4, MAGIC_V1)
    put_be32(out + 8, <uint32_t>plan.crc)
    put_be32(out + 12, <uint32_t>plan.qid)
    put_be32(out + 16, <uint32_t>plan.flag)
    memset(out + 20, 0, 20)  # QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG
    put_be64(out + 40, <uint64_t>(plan.born_ts if plan.born_ts else now_ms))
    memcpy(out + 48, plan.born_host, 4)
    put_be32(out + 52, <uint32_t>plan.born_port)
    memset(out + 56, 0, 8)  # STORETIMESTAMP
    memcpy(out + 64, store_host, 4)
    put_be32(out + 68, <uint32_t>store_port)
    memset(out + 72, 0, 12)  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET
    put_be32(out + 84, <uint32_t>plan.body_length)
    out = _put(out + HEADER_SIZE, plan.body, plan.body_length)
    out[0] = <uint8_t>topic_length
    out = _put(out + 1, topic, topic_length)
    if not plan.generated:
        put_be16(out, <uint16_t>plan.props_length)
        return _put(out + 2, plan.props, plan.props_length)
    put_be16(out, <uint16_t>(plan.props_length + UNIQ_ENTRY_BYTES + generated_length))
    out = _put(out + 2, plan.props, plan.props_length)
    out = _put(out, b"UNIQ_KEY\x01", 9)
    out = _put(out, generated, generated_length)
    out[0] = 2
    return out + 1


cdef enum:
    UNIQ_ENTRY_BYTES = 10  # "UNIQ_KEY\x01", the key, "\x02": a generated key's entry less the key


cdef Py_ssize_t _plan_copies(list copies, CopyPlan* plans, int32_t queue_count, Py_ssize_t topic_length,
                             Py_ssize_t max_body_bytes, Py_ssize_t max_batch_body_bytes, Py_ssize_t room,
                             Py_ssize_t generated_length) except -2:
    """Each copy's plan (AppendEncoder.encode_copies): the number of round-robin queues wanted, or -1 where the
    reference would refuse the batch or a copy is unusual here. ``generated_length``: the characters of a fresh
    UNIQ_KEY (a copy without one gets one), or -1 where none may be made (such a copy is declined)."""
    cdef Py_ssize_t i, bodies = 0, length, round_robin = 0, extra
    cdef CopyPlan* plan
    cdef const char* text
    cdef object c, value, tags, shard
    for i in range(len(copies)):
        c, plan = copies[i], &plans[i]
        value = c.body
        if type(value) is not bytes or len(value) == 0 or len(value) > max_body_bytes:
            return -1
        plan.body, plan.body_length = PyBytes_AS_STRING(value), len(value)
        bodies += plan.body_length
        value = c.properties
        if type(value) is not bytes or len(value) > MAX_PROPERTIES_BYTES:
            return -1
        plan.props, plan.props_length = PyBytes_AS_STRING(value), len(value)
        value = c.born_host
        if type(value) is not bytes or len(value) != 4:
            return -1
        plan.born_host = PyBytes_AS_STRING(value)
        value = c.uniq_key
        if type(value) is not str:
            return -1
        plan.generated = not value  # the reference gives it a fresh UNIQ_KEY
        extra = 0
        if plan.generated:
            if generated_length < 0:
                return -1
            extra = UNIQ_ENTRY_BYTES + generated_length
            if plan.props_length + extra > MAX_PROPERTIES_BYTES:
                return -1
        plan.crc, plan.flag, plan.born_port = c.body_crc, c.flag, c.born_port  # OverflowError out of int32
        plan.born_ts = c.born_timestamp_ms
        if plan.born_ts < 0:
            return -1
        tags, shard, value = c.tags, c.sharding_key, c.queue_id
        plan.tag_code = 0
        if tags:
            text = PyUnicode_AsUTF8AndSize(tags, &length)
            plan.tag_code = java_hash_utf8(<const uint8_t*>text, length)
        if value is not None:
            plan.qid = value
            if not 0 <= plan.qid < queue_count:
                return -1
        elif shard:
            text = PyUnicode_AsUTF8AndSize(shard, &length)
            plan.qid = _hash_queue(_span(text, length), queue_count)
        else:
            plan.qid = -1
            round_robin += 1
        plan.size = FIXED_OVERHEAD + topic_length + plan.body_length + plan.props_length + extra
        if plan.size > room:
            return -1
    return round_robin if bodies <= max_batch_body_bytes else -1


cdef class AppendEncoder:
    """encoder.MessageEncoder.encode_batch for WireMessages: the store's limits and host, read-only."""

    cdef Py_ssize_t max_batch_messages, max_body_bytes, max_batch_body_bytes, segment_size_bytes
    cdef uint8_t store_host[4]
    cdef int32_t store_port

    def __init__(self, Py_ssize_t max_batch_messages, Py_ssize_t max_body_bytes, Py_ssize_t max_batch_body_bytes,
                 Py_ssize_t segment_size_bytes, bytes store_host, int32_t store_port):
        if len(store_host) != 4:
            raise ValueError(f"store host must be 4 bytes (IPv4), not {len(store_host)}")
        self.max_batch_messages, self.max_body_bytes = max_batch_messages, max_body_bytes
        self.max_batch_body_bytes, self.segment_size_bytes = max_batch_body_bytes, segment_size_bytes
        memcpy(self.store_host, PyBytes_AS_STRING(store_host), 4)
        self.store_port = store_port

    def encode(self, WireMessages wire, str topic, int32_t queue_count, bint compaction, int64_t now_ms, uniq,
               take_round_robin):
        """(buf, sizes, queue ids, tag codes, sys flags, UNIQ_KEYs) of the batch, or None if the
        reference encoder would refuse any of it (nothing is taken then). ``uniq`` is the encoder's
        UniqKeyGenerator; ``take_round_robin(topic, count)`` the first of ``count`` round-robin slots."""
        cdef bytes topic_bytes = topic.encode("utf-8")
        cdef Span topic_span
        cdef Py_ssize_t i, total = 0, generated_count = 0, round_robin = 0
        cdef Plan* plans
        if queue_count <= 0 or len(topic_bytes) > 255:
            raise ValueError(f"topic {topic!r}: {queue_count} queues, {len(topic_bytes)} bytes of name")
        if not self._batch_fits(wire):
            return None
        topic_span.ptr, topic_span.length = <const uint8_t*>PyBytes_AS_STRING(topic_bytes), len(topic_bytes)
        generated_length = uniq.key_length
        plans = <Plan*>malloc(wire.count * sizeof(Plan))
        if plans == NULL:
            raise MemoryError()
        try:
            for i in range(wire.count):
                plans[i].qid = _queue_of(wire, &wire.msgs[i], queue_count, compaction)
                if plans[i].qid == -2 or not _plan(wire, &wire.msgs[i], &plans[i], FIXED_OVERHEAD + topic_span.length,
                                                   generated_length, compaction, self.segment_size_bytes):
                    return None
                if compaction:
                    plans[i].qid = _compaction_queue(wire, &wire.msgs[i], &plans[i], queue_count)
                    if plans[i].qid == -2:
                        return None
                total += plans[i].size
                generated_count += plans[i].uniq.ptr == NULL
                round_robin += plans[i].qid == -1
            # Accepted: now take the UNIQ_KEYs and round-robin slots, as the reference does.
            if round_robin:
                _assign_round_robin(plans, wire.count, take_round_robin(topic, round_robin) % queue_count,
                                    queue_count)
            prefix, first = uniq.take(generated_count, now_ms) if generated_count else ("", 0)
            return self._write(wire, plans, total, topic_span, now_ms, prefix.encode("ascii"), first,
                               generated_length)
        finally:
            free(plans)

    def encode_copies(self, copies, str topic, int32_t queue_count, int64_t now_ms, take_round_robin, uniq=None):
        """encoder.MessageEncoder._encode_copies (the reference) for a batch of model.Copy to a topic that is not a
        compaction topic: (buf, sizes, queue ids, tag codes, sys flags, UNIQ_KEYs), or None (nothing taken) where
        the reference would refuse any of it, or a copy is unusual here (a host that is not IPv4, a field out of its
        range, a body, properties or born host that is not bytes, a uniq key that is not str); the caller then runs
        the reference, which raises why. A copy without a UNIQ_KEY (the Scheduler's timer records of MessageIn) gets
        a fresh one from ``uniq`` (the encoder's UniqKeyGenerator: one block taken for the batch once it is
        accepted, as the reference does); without ``uniq`` such a batch is declined."""
        cdef bytes topic_bytes = topic.encode("utf-8")
        cdef Py_ssize_t n = len(copies), i, total = 0, round_robin, generated_count = 0, prefix_length = 0
        cdef Py_ssize_t topic_length = len(topic_bytes)
        cdef Py_ssize_t generated_length = -1 if uniq is None else uniq.key_length
        cdef CopyPlan* plans
        cdef CopyPlan* plan
        cdef int32_t start
        cdef uint32_t counter = 0
        cdef uint8_t generated[128]
        cdef uint8_t* out
        if queue_count <= 0 or topic_length > 255:
            raise ValueError(f"topic {topic!r}: {queue_count} queues, {topic_length} bytes of name")
        if not isinstance(copies, list):
            raise TypeError(f"copies must be a list (model.Copies), not {type(copies).__name__}")
        if n == 0 or n > self.max_batch_messages:
            return None
        plans = <CopyPlan*>malloc(n * sizeof(CopyPlan))
        if plans == NULL:
            raise MemoryError()
        try:
            try:
                round_robin = _plan_copies(<list>copies, plans, queue_count, topic_length, self.max_body_bytes,
                                           self.max_batch_body_bytes, self.segment_size_bytes - BLANK_SIZE,
                                           generated_length if generated_length <= 128 else -1)
            except (OverflowError, TypeError, UnicodeError, AttributeError):
                return None  # a field out of its range or of another type: the reference says what
            if round_robin < 0:
                return None
            for i in range(n):
                generated_count += plans[i].generated
            # Accepted: now the UNIQ_KEYs and the round-robin slots, one block each as the reference takes them.
            if generated_count:
                prefix, first = uniq.take(generated_count, now_ms)
                prefix = prefix.encode("ascii")
                prefix_length = len(prefix)
                if prefix_length + 4 != generated_length:
                    raise ValueError(f"UNIQ_KEY prefix {prefix!r} does not make keys of {generated_length} characters")
                memcpy(generated, PyBytes_AS_STRING(prefix), prefix_length)
                counter = <uint32_t>(first & 0xFFFF)
            if round_robin:
                start = take_round_robin(topic, round_robin) % queue_count
                for i in range(n):
                    if plans[i].qid == -1:
                        plans[i].qid = start
                        start = start + 1 if start + 1 < queue_count else 0
            for i in range(n):
                total += plans[i].size
            buf = PyByteArray_FromStringAndSize(NULL, total)
            out = <uint8_t*>PyByteArray_AS_STRING(buf)
            sizes, queue_ids, tag_codes, uniq_keys = [], [], [], []
            for i in range(n):
                plan = &plans[i]
                if plan.generated:  # the next key of the block, as next_keys makes them
                    _put_hex16(generated + prefix_length, counter)
                    counter = (counter + 1) & 0xFFFF
                    uniq_keys.append(PyUnicode_DecodeASCII(<const char*>generated, generated_length, NULL))
                else:
                    uniq_keys.append(copies[i].uniq_key)
                out = _put_copy(out, plan, <const uint8_t*>PyBytes_AS_STRING(topic_bytes), topic_length, now_ms,
                                self.store_host, self.store_port, generated, generated_length)
                sizes.append(plan.size)
                queue_ids.append(plan.qid)
                tag_codes.append(plan.tag_code)
            return buf, sizes, queue_ids, tag_codes, [0] * n, uniq_keys
        finally:
            free(plans)

    cdef bint _batch_fits(self, WireMessages wire):
        """The batch limits: message count, each body, all bodies."""
        cdef Py_ssize_t i, bodies = 0
        if wire.count == 0 or wire.count > self.max_batch_messages:
            return False
        for i in range(wire.count):
            if wire.msgs[i].body.length > self.max_body_bytes:
                return False
            bodies += wire.msgs[i].body.length
        return bodies <= self.max_batch_body_bytes

    cdef object _write(self, WireMessages wire, const Plan* plans, Py_ssize_t total, Span topic, int64_t now_ms,
                       bytes prefix, first, Py_ssize_t generated_length):
        """The records back to back, and the columns of EncodedBatch."""
        cdef Py_ssize_t i, prefix_length = len(prefix)
        cdef uint32_t counter
        cdef uint8_t generated[128]
        cdef uint8_t* out
        cdef const Plan* plan
        if prefix_length and prefix_length + 4 != generated_length or generated_length > 128:
            raise ValueError(f"UNIQ_KEY prefix {prefix!r} does not make keys of {generated_length} characters")
        memcpy(generated, PyBytes_AS_STRING(prefix), prefix_length)
        counter = <uint32_t>(first & 0xFFFF)
        buf = PyByteArray_FromStringAndSize(NULL, total)
        out = <uint8_t*>PyByteArray_AS_STRING(buf)
        # The records, body CRCs included (most of the time here), without the GIL when the batch is
        # big enough to be worth the hand-over: other threads parse and answer meanwhile. The batch's
        # buffer is this call's own and ``wire`` stays referenced by the caller.
        if total >= _NOGIL_FROM_BYTES:
            with nogil:
                _put_records(out, wire, plans, topic, now_ms, self.store_host, self.store_port, generated,
                             prefix_length, generated_length, counter)
        else:
            _put_records(out, wire, plans, topic, now_ms, self.store_host, self.store_port, generated,
                         prefix_length, generated_length, counter)
        sizes, queue_ids, tag_codes, uniq_keys = [], [], [], []
        for i in range(wire.count):
            plan = &plans[i]
            if plan.uniq.ptr == NULL:  # the same keys as _put_records wrote, in the same order
                _put_hex16(generated + prefix_length, counter)
                counter = (counter + 1) & 0xFFFF
                uniq_keys.append(PyUnicode_DecodeASCII(<const char*>generated, generated_length, NULL))
            else:
                uniq_keys.append(text_of(plan.uniq))
            sizes.append(plan.size)
            queue_ids.append(plan.qid)
            tag_codes.append(java_hash_utf8(plan.tags.ptr, plan.tags.length) if plan.tags.length else 0)
        return buf, sizes, queue_ids, tag_codes, [0] * wire.count, uniq_keys


cdef void _put_records(uint8_t* out, WireMessages wire, const Plan* plans, Span topic, int64_t now_ms,
                       const uint8_t* store_host, int32_t store_port, uint8_t* generated,
                       Py_ssize_t prefix_length, Py_ssize_t generated_length, uint32_t counter) noexcept nogil:
    """The batch's records back to back; generated UNIQ_KEYs count up from ``counter`` (mod 2^16)."""
    cdef Py_ssize_t i
    for i in range(wire.count):
        if plans[i].uniq.ptr == NULL:
            _put_hex16(generated + prefix_length, counter)
            counter = (counter + 1) & 0xFFFF
        out = _put_record(out, wire, &wire.msgs[i], &plans[i], topic, now_ms, store_host, store_port, generated,
                          generated_length)


cdef void _assign_round_robin(Plan* plans, Py_ssize_t count, int32_t start, int32_t queue_count) noexcept nogil:
    """Round-robin queues, one block per batch in message order (encoder._queues_for)."""
    cdef Py_ssize_t i
    for i in range(count):
        if plans[i].qid == -1:
            plans[i].qid = start
            start = start + 1 if start + 1 < queue_count else 0


cdef inline void _put_hex16(uint8_t* out, uint32_t value) noexcept nogil:
    out[0] = HEX[(value >> 12) & 0xF]
    out[1] = HEX[(value >> 8) & 0xF]
    out[2] = HEX[(value >> 4) & 0xF]
    out[3] = HEX[value & 0xF]


# ---- the timer topic's records of a delayed batch (mqstore.timer.messages.timer_records) ---------------

cdef int64_t MAX_VALUE_MS = 1LL << 62  # mqstore.timer.messages.MAX_VALUE_MS
cdef enum Asked:
    ASKED_NONE = 0
    ASKED_DELAY_SEC = 1
    ASKED_DELAY_MS = 2
    ASKED_DELIVER_MS = 3

# The names timer_batch writes (mqstore.timer.messages: OUT_MS, REAL_TOPIC, REAL_QID, SHARDING_KEY).
tm_DELAY_SEC, tm_DELAY_MS, tm_DELIVER_MS = "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_DELIVER_MS"  # messages.ASKING
cdef const char* NAME_OUT_MS = b"TIMER_OUT_MS"
cdef const char* NAME_REAL_TOPIC = b"REAL_TOPIC"
cdef const char* NAME_REAL_QID = b"REAL_QID"
cdef const char* NAME_SHARDING_KEY = b"TIMER_SHARDING_KEY"


cdef Asked _asking(Span name) noexcept nogil:
    """Which delivery-time property ``name`` is (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS), if any."""
    if name.length == 15 and memcmp(name.ptr, b"TIMER_DELAY_SEC", 15) == 0:
        return ASKED_DELAY_SEC
    if name.length == 14 and memcmp(name.ptr, b"TIMER_DELAY_MS", 14) == 0:
        return ASKED_DELAY_MS
    if name.length == 16 and memcmp(name.ptr, b"TIMER_DELIVER_MS", 16) == 0:
        return ASKED_DELIVER_MS
    return ASKED_NONE


cdef int64_t _whole_number(Span s) noexcept nogil:
    """A property's value as Python's int() reads plain ASCII digits; -1 for anything else (a sign, spaces,
    underscores, other digits: the reference reads those or says why) or more than MAX_VALUE_MS."""
    cdef int64_t value = 0
    cdef Py_ssize_t i
    if s.length == 0 or s.length > 19:
        return -1
    for i in range(s.length):
        if not 0x30 <= s.ptr[i] <= 0x39:
            return -1
        value = value * 10 + (s.ptr[i] - 0x30)
    return value if value <= MAX_VALUE_MS else -1


cdef int64_t _due(WireMessages wire, const Msg* m, int32_t queue_count, int64_t now_ms,
                  int64_t max_delay_ms) noexcept nogil:
    """messages._due of a message (its delivery field as convert._timed makes it a property): when it is due,
    or -1 wherever the reference could refuse the message or anything about it is unusual (it then decides)."""
    cdef Py_ssize_t k
    cdef const Prop* prop
    cdef Span asked[4]
    cdef Asked kind = ASKED_NONE
    cdef int64_t value
    memset(asked, 0, sizeof(asked))
    if not m.timer_marked or m.body.length == 0 or m.born_ts < 0:
        return -1
    if m.has_qid and not 0 <= m.qid < queue_count:
        return -1
    if (m.tags.length and _has_separator(m.tags)) or (m.shard.length and _has_separator(m.shard)):
        return -1
    for k in range(m.keys_from, m.keys_to):
        if not _valid_key(wire.keys[k].ptr, wire.keys[k].length):
            return -1
    for k in range(m.props_from, m.props_to):
        prop = &wire.props[k]
        kind = _asking(prop.name)
        if kind != ASKED_NONE:
            asked[<int>kind] = prop.value
        elif ((prop.name.length >= 6 and memcmp(prop.name.ptr, b"TIMER_", 6) == 0) or _reserved(prop.name) != USER
              or (prop.name.length == 10 and memcmp(prop.name.ptr, NAME_REAL_TOPIC, 10) == 0)
              or (prop.name.length == 8 and memcmp(prop.name.ptr, NAME_REAL_QID, 8) == 0)
              or prop.name.length == 0 or prop.value.length == 0 or _has_separator(prop.name)
              or _has_separator(prop.value)):
            return -1  # a name the timer sets, TAGS/KEYS/UNIQ_KEY, another TIMER_ name, an empty or bad entry
    if m.delay_ms or m.deliver_at_ms:  # the fields win over the properties (convert._timed)
        if m.delay_ms < 0 or m.deliver_at_ms < 0:
            return -1
        if m.delay_ms:
            kind, value = ASKED_DELAY_MS, m.delay_ms
        else:
            kind, value = ASKED_DELIVER_MS, m.deliver_at_ms
    else:
        kind = (ASKED_DELAY_SEC if asked[1].ptr != NULL else ASKED_DELAY_MS if asked[2].ptr != NULL
                else ASKED_DELIVER_MS if asked[3].ptr != NULL else ASKED_NONE)
        if kind == ASKED_NONE:
            return -1
        value = _whole_number(asked[<int>kind])
    if value < 0 or value > MAX_VALUE_MS:
        return -1
    return _due_ms(kind, value, now_ms, max_delay_ms)


cdef inline int64_t _due_ms(int kind, int64_t value, int64_t now_ms, int64_t max_delay_ms) noexcept nogil:
    """The due time asked by ``value`` of ``kind`` (a delay in s or ms, or a time in ms), never before now;
    -1 when it is past the max delay (the reference refuses it)."""
    cdef int64_t due
    if kind == ASKED_DELAY_SEC:
        if value > max_delay_ms // 1000 + 1:
            return -1
        due = now_ms + value * 1000
    elif kind == ASKED_DELAY_MS:
        due = now_ms + value
    else:
        due = value
    if due - now_ms > max_delay_ms:
        return -1
    return due if due > now_ms else now_ms


cdef Py_ssize_t _put_decimal(uint8_t* out, int64_t value) noexcept nogil:
    """``str(value)`` of a value >= 0 at ``out``; returns its length."""
    cdef uint8_t digits[20]
    cdef Py_ssize_t n = 0, i
    while True:
        digits[n] = <uint8_t>(0x30 + value % 10)
        n += 1
        value //= 10
        if value == 0:
            break
    for i in range(n):
        out[i] = digits[n - 1 - i]
    return n


cdef inline Span _span(const void* ptr, Py_ssize_t length) noexcept nogil:
    cdef Span s
    s.ptr, s.length = <const uint8_t*>ptr, length
    return s


def timer_batch(WireMessages wire, str timer_topic, str real_topic, int32_t queue_count, int64_t now_ms,
                int64_t max_delay_ms):
    """(the timer topic's records of a delayed batch, as WireMessages for AppendEncoder, and their due times), what
    mqstore.timer.messages.timer_records makes of the same messages (``real_topic`` has ``queue_count`` queues):
    each message's asking properties left out, TIMER_OUT_MS, REAL_TOPIC, REAL_QID (a queue_id given) and
    TIMER_SHARDING_KEY added, queue 0, the tags and keys as they are (the encoder writes TAGS and KEYS after the
    sorted properties, as the reference's Copy does). None wherever the reference could refuse the batch or
    anything is unusual (a message not timer-marked or with a name the timer sets, TAGS, KEYS or UNIQ_KEY
    properties, a value int() reads that is not plain digits, a bad key, tag or property, an empty body, a
    negative born time): the Scheduler then converts the batch and the reference decides, in its own words."""
    cdef WireMessages out
    cdef Msg* m
    cdef Msg* made
    cdef Py_ssize_t i, k, length, at = 0
    cdef int64_t due
    cdef uint8_t* digits
    cdef bytes topic_bytes = real_topic.encode("utf-8")
    cdef Span topic_span = _span(PyBytes_AS_STRING(topic_bytes), len(topic_bytes))
    if wire.count == 0 or wire.timer_marks != wire.count or _has_separator(topic_span):
        return None
    dues = []
    for i in range(wire.count):
        due = _due(wire, &wire.msgs[i], queue_count, now_ms, max_delay_ms)
        if due < 0:
            return None
        dues.append(due)
    # Accepted: the records, their new values' digits in one bytes object that the spans point into.
    number_bytes = PyBytes_FromStringAndSize(NULL, wire.count * 32)
    digits = <uint8_t*>PyBytes_AS_STRING(number_bytes)
    out = WireMessages.__new__(WireMessages)
    out.raw, out.extra, out.topic, out.replication = wire.raw, (number_bytes, topic_bytes), timer_topic, wire.replication
    memcpy(out.born_host, wire.born_host, 4)
    out.born_port = wire.born_port
    for i in range(wire.count):
        m = &wire.msgs[i]
        made = out.new_message()
        made.body, made.tags, made.flag, made.born_ts = m.body, m.tags, m.flag, m.born_ts
        made.own_born, made.born_port = m.own_born, m.born_port
        memcpy(made.born_host, m.born_host, 4)
        made.has_qid, made.qid = True, 0
        for k in range(m.keys_from, m.keys_to):
            out.add_key(wire.keys[k])
        made.keys_to = out.keys_count
        for k in range(m.props_from, m.props_to):
            if _asking(wire.props[k].name) == ASKED_NONE:
                out.add_prop(wire.props[k].name, wire.props[k].value, k)
        length = _put_decimal(digits + at, dues[i])
        out.add_prop(_span(NAME_OUT_MS, 12), _span(digits + at, length), 0)
        at += length
        out.add_prop(_span(NAME_REAL_TOPIC, 10), topic_span, 0)
        if m.has_qid:
            length = _put_decimal(digits + at, m.qid)
            out.add_prop(_span(NAME_REAL_QID, 8), _span(digits + at, length), 0)
            at += length
        if m.shard.length:
            out.add_prop(_span(NAME_SHARDING_KEY, 18), m.shard, 0)
        made.props_to = one_per_name(out, made.props_from)
        out.count += 1
    return out, dues


# ---- the timer records of a delayed MessageIn batch (mqstore.timer.messages._timer_copies) -------------------

cdef enum:
    MAX_TIMER_ENTRIES = 64


cdef bint _utf8_of(object text, Span* out) except -1:
    """A str's UTF-8 (cached in the str) into ``out``; False for anything that is not exactly a str."""
    cdef const char* ptr
    cdef Py_ssize_t length
    if type(text) is not str:
        return False
    ptr = PyUnicode_AsUTF8AndSize(text, &length)  # UnicodeEncodeError for a lone surrogate: the caller declines
    out.ptr, out.length = <const uint8_t*>ptr, length
    return True


cdef int64_t _message_due(dict props, int64_t now_ms, int64_t max_delay_ms) except -2:
    """messages._due's delivery time of a message whose asking property is plain digits and within the limit; -1
    for anything else (the reference decides, or raises why)."""
    cdef Span text
    cdef int64_t value
    cdef Asked kind
    if tm_DELAY_SEC in props:
        kind, raw = ASKED_DELAY_SEC, props[tm_DELAY_SEC]
    elif tm_DELAY_MS in props:
        kind, raw = ASKED_DELAY_MS, props[tm_DELAY_MS]
    elif tm_DELIVER_MS in props:
        kind, raw = ASKED_DELIVER_MS, props[tm_DELIVER_MS]
    else:
        return -1
    if not _utf8_of(raw, &text):
        return -1
    value = _whole_number(text)
    if value < 0:
        return -1
    return _due_ms(kind, value, now_ms, max_delay_ms)


cdef bint _plain_entry(Span name, Span value) noexcept nogil:
    """A user property the timer record keeps as it is: a name and a value, neither empty nor holding a
    separator, the name none the timer reads or sets (TIMER_*, REAL_TOPIC, REAL_QID) or the encoder checks (TAGS,
    KEYS, UNIQ_KEY)."""
    if name.length == 0 or value.length == 0 or _has_separator(name) or _has_separator(value):
        return False
    if name.length >= 6 and memcmp(name.ptr, b"TIMER_", 6) == 0:
        return False
    if (name.length == 10 and memcmp(name.ptr, NAME_REAL_TOPIC, 10) == 0) or \
            (name.length == 8 and memcmp(name.ptr, NAME_REAL_QID, 8) == 0):
        return False
    return _reserved(name) == USER


cdef Py_ssize_t _timer_entries(object message, dict props, Span topic, int32_t queue_count, int64_t due,
                               Entry* entries, uint8_t* numbers) except -2:
    """The timer record's properties but TAGS and KEYS (messages._timer_copies' ``out``), sorted by name, into
    ``entries`` (MAX_TIMER_ENTRIES; ``numbers``: 40 bytes for the digits they point into): their count, or -1 where
    the reference decides."""
    cdef Py_ssize_t count = 0
    cdef Span name, value, shard
    cdef long long qid
    cdef object queue_id = message.queue_id
    if len(props) > MAX_TIMER_ENTRIES - 4:
        return -1
    for raw_name, raw_value in props.items():
        if not _utf8_of(raw_name, &name) or not _utf8_of(raw_value, &value):
            return -1
        if _asking(name) != ASKED_NONE:
            continue
        if not _plain_entry(name, value):
            return -1
        entries[count].name, entries[count].value, entries[count].order = name, value, count
        count += 1
    value = _span(numbers, _put_decimal(numbers, due))
    entries[count].name, entries[count].value, entries[count].order = _span(NAME_OUT_MS, 12), value, count
    entries[count + 1].name, entries[count + 1].value, entries[count + 1].order = _span(NAME_REAL_TOPIC, 10), topic, 0
    count += 2
    if queue_id is not None:
        if type(queue_id) is not int:
            return -1
        qid = queue_id  # OverflowError: the caller declines
        if not 0 <= qid < queue_count:
            return -1
        value = _span(numbers + 20, _put_decimal(numbers + 20, qid))
        entries[count].name, entries[count].value, entries[count].order = _span(NAME_REAL_QID, 8), value, 0
        count += 1
    if not _utf8_of(message.sharding_key, &shard):
        return -1
    if shard.length:
        if _has_separator(shard):
            return -1
        entries[count].name, entries[count].value, entries[count].order = _span(NAME_SHARDING_KEY, 18), shard, 0
        count += 1
    qsort(entries, count, sizeof(Entry), _compare_entries)  # the names are distinct
    return count


cdef uint8_t* _put_entries(uint8_t* out, const Entry* entries, Py_ssize_t count, Span tags) noexcept nogil:
    """The properties' ``name\x01value\x02`` entries in order, then TAGS when there are tags; the end written."""
    cdef Py_ssize_t i
    for i in range(count):
        out = _put(out, entries[i].name.ptr, entries[i].name.length)
        out[0] = 1
        out = _put(out + 1, entries[i].value.ptr, entries[i].value.length)
        out[0] = 2
        out += 1
    if tags.length:
        out = _put(_put(out, b"TAGS\x01", 5), tags.ptr, tags.length)
        out[0] = 2
        out += 1
    return out


cdef object _timer_properties(const Entry* entries, Py_ssize_t count, Span tags, tuple keys):
    """The PROPERTIES bytes: the entries, then TAGS and KEYS as the encoder writes them; None for a bad key."""
    cdef Py_ssize_t i, total = 0, n = len(keys)
    cdef Span key
    cdef uint8_t* out
    for i in range(count):
        total += entries[i].name.length + entries[i].value.length + 2
    if tags.length:
        total += 6 + tags.length
    for i in range(n):
        if not _utf8_of(keys[i], &key) or not _valid_key(key.ptr, key.length):
            return None
        total += key.length + 1
    if n:
        total += 5
    made = PyBytes_FromStringAndSize(NULL, total)
    out = <uint8_t*>PyBytes_AS_STRING(made)
    out = _put_entries(out, entries, count, tags)
    if n:
        out = _put(out, b"KEYS\x01", 5)
        for i in range(n):
            _utf8_of(keys[i], &key)
            if i:
                out[0] = 0x20
                out += 1
            out = _put(out, key.ptr, key.length)
        out[0] = 2
    return made


cdef object _timer_copy_of(object message, Span topic, int32_t queue_count, int64_t due, object Copy):
    """One message's timer record as a Copy (messages._timer_copies'), or None where the reference decides."""
    cdef Entry entries[MAX_TIMER_ENTRIES]
    cdef uint8_t numbers[40]
    cdef Py_ssize_t count
    cdef Span tags
    cdef object props = message.properties, body = message.body, keys = message.keys
    if type(props) is not dict or type(body) is not bytes or len(<bytes>body) == 0 or type(keys) is not tuple:
        return None
    count = _timer_entries(message, <dict>props, topic, queue_count, due, entries, numbers)
    if count < 0 or not _utf8_of(message.tags, &tags) or (tags.length and _has_separator(tags)):
        return None
    made = _timer_properties(entries, count, tags, <tuple>keys)
    if made is None:
        return None
    return Copy(body, _body_crc(_span(PyBytes_AS_STRING(body), len(<bytes>body))), made, message.tags, "",
                message.flag, message.born_timestamp_ms, message.born_host, message.born_port, 0, "")


def timer_copies(messages, str real_topic, int32_t queue_count, int64_t now_ms, int64_t max_delay_ms, Copy, Copies):
    """What mqstore.timer.messages._timer_copies makes of a delayed batch of MessageIn for ``real_topic`` (its
    reference: the same Copy objects, byte for byte, and due times): (``Copies`` of ``Copy``, due times), or None
    wherever the reference could raise or decline, or anything is unusual here (a value int() reads that is not
    plain digits, a delay past the limit, a queue_id out of range or not an int, a property that is empty, holds a
    separator or has a name the timer or the encoder treats apart, a bad tag, key or sharding key, a field of
    another type, more than 60 properties): the caller then runs the reference, which says why."""
    cdef Span topic
    cdef int64_t due
    if type(messages) is not list or not _utf8_of(real_topic, &topic) or topic.length == 0 or _has_separator(topic):
        return None
    converted, dues = Copies(), []
    try:
        for message in <list>messages:
            props = message.properties
            if type(props) is not dict:
                return None
            due = _message_due(<dict>props, now_ms, max_delay_ms)
            if due < 0:
                return None
            made = _timer_copy_of(message, topic, queue_count, due, Copy)
            if made is None:
                return None
            converted.append(made)
            dues.append(due)
    except (OverflowError, UnicodeError, AttributeError):
        return None  # a field out of its range or of another kind: the reference says what
    return converted, dues


# ---- a delivered copy's properties from the timer record's (mqstore.timer.messages.delivered_copy) ----------

cdef enum:
    MAX_COPY_ENTRIES = 64

cdef struct Entry:
    Span name
    Span value
    Py_ssize_t order


cdef int _compare_entries(const void* a, const void* b) noexcept nogil:
    cdef const Entry* x = <const Entry*>a
    cdef const Entry* y = <const Entry*>b
    cdef int found = memcmp(x.name.ptr, y.name.ptr, min(x.name.length, y.name.length))
    if found:
        return found
    if x.name.length != y.name.length:
        return -1 if x.name.length < y.name.length else 1
    return -1 if x.order < y.order else (1 if x.order > y.order else 0)


cdef inline bint _is(Span s, const char* name) noexcept nogil:
    cdef Py_ssize_t n = strlen(name)
    return s.length == n and memcmp(s.ptr, name, n) == 0


def timer_copy(bytes raw, int64_t timer_offset, int64_t now_ms, int64_t store_timestamp_ms):
    """What mqstore.timer.messages.delivered_copy makes of a timer record's properties ``raw`` (its PROPERTIES
    bytes), and the record's origin (TIMER_ORIGIN, else ``timer_offset``): (real topic, origin, the copy's
    properties bytes, tags, UNIQ_KEY, queue id or None, sharding key). None for anything unusual (not UTF-8, an
    entry without a name or value or with a second separator, a name twice, no REAL_TOPIC, TIMER_OUT_MS or
    UNIQ_KEY, a name the copy gets already, an origin or REAL_QID that is not plain digits, more than 64
    entries): the caller then decodes the properties and the reference decides."""
    return _copy_parts(<const uint8_t*>PyBytes_AS_STRING(raw), len(raw), timer_offset, now_ms, store_timestamp_ms)


cdef object _copy_parts(const uint8_t* p, Py_ssize_t n, int64_t timer_offset, int64_t now_ms,
                        int64_t store_timestamp_ms):
    """:func:`timer_copy` of the ``n`` properties bytes at ``p``."""
    cdef Py_ssize_t at = 0, end, sep, count = 0, i, size
    cdef Entry entries[MAX_COPY_ENTRIES + 4]
    cdef Span name, value, real, qid, shard, tags, keys, uniq, origin
    cdef uint8_t numbers[64]
    cdef Py_ssize_t used = 0, length
    cdef int64_t origin_value, qid_value = -1
    cdef bint found_out, has_enqueue
    cdef uint8_t* out
    real.ptr = qid.ptr = shard.ptr = tags.ptr = keys.ptr = uniq.ptr = origin.ptr = NULL
    real.length = qid.length = shard.length = tags.length = keys.length = uniq.length = origin.length = 0
    if not valid_utf8(p, n):
        return None
    while at < n:
        end = at
        while end < n and p[end] != 2:
            end += 1
        sep = at
        while sep < end and p[sep] != 1:
            sep += 1
        if sep == end or sep == at or sep + 1 == end or memchr(p + sep + 1, 1, end - sep - 1) != NULL:
            return None
        name.ptr, name.length = p + at, sep - at
        value.ptr, value.length = p + sep + 1, end - sep - 1
        at = end + 1
        if _is(name, b"REAL_TOPIC"):
            if real.ptr != NULL:
                return None  # a name twice (the reference's last wins): unusual here
            real = value
        elif _is(name, b"REAL_QID"):
            if qid.ptr != NULL:
                return None
            qid = value
        elif _is(name, b"TIMER_SHARDING_KEY"):
            if shard.ptr != NULL:
                return None
            shard = value
        elif _is(name, b"TIMER_ORIGIN"):
            if origin.ptr != NULL:
                return None
            origin = value
        elif _is(name, b"TAGS"):
            if tags.ptr != NULL:
                return None
            tags = value
        elif _is(name, b"KEYS"):
            if keys.ptr != NULL:
                return None
            keys = value
        elif _is(name, b"UNIQ_KEY"):
            if uniq.ptr != NULL:
                return None
            uniq = value
        elif _is(name, b"TIMER_ROLLED_FROM"):
            pass
        elif (_is(name, b"TIMER_DELIVER_MS") or _is(name, b"TIMER_DEQUEUE_MS") or _is(name, b"TIMER_UNIT")
              or count >= MAX_COPY_ENTRIES):
            return None
        else:
            entries[count].name, entries[count].value, entries[count].order = name, value, count
            count += 1
    if real.ptr == NULL or uniq.ptr == NULL:
        return None
    origin_value = timer_offset
    if origin.ptr != NULL:
        origin_value = _whole_number(origin)
        if origin_value < 0:
            return None
    if qid.ptr != NULL:
        qid_value = _whole_number(qid)
        if qid_value < 0 or qid_value > 0x7FFFFFFF:
            return None
    # TIMER_OUT_MS becomes TIMER_DELIVER_MS; TIMER_ENQUEUE_MS (the record's store time unless it has one),
    # TIMER_DEQUEUE_MS and TIMER_UNIT are added.
    found_out = has_enqueue = False
    for i in range(count):
        if _is(entries[i].name, b"TIMER_OUT_MS"):
            entries[i].name = _span(b"TIMER_DELIVER_MS", 16)
            found_out = True
        elif _is(entries[i].name, b"TIMER_ENQUEUE_MS"):
            has_enqueue = True
    if not found_out:
        return None
    if not has_enqueue:
        length = _put_signed(numbers + used, store_timestamp_ms)
        entries[count].name, entries[count].value, entries[count].order = _span(b"TIMER_ENQUEUE_MS", 16), \
            _span(numbers + used, length), count
        used += length
        count += 1
    length = _put_signed(numbers + used, now_ms)
    entries[count].name, entries[count].value, entries[count].order = _span(b"TIMER_DEQUEUE_MS", 16), \
        _span(numbers + used, length), count
    used += length
    count += 1
    length = _put_signed(numbers + used, timer_offset)
    entries[count].name, entries[count].value, entries[count].order = _span(b"TIMER_UNIT", 10), \
        _span(numbers + used, length), count
    used += length
    count += 1
    qsort(entries, count, sizeof(Entry), _compare_entries)
    size = 0
    for i in range(count):
        if i and (entries[i - 1].name.length == entries[i].name.length
                  and memcmp(entries[i - 1].name.ptr, entries[i].name.ptr, entries[i].name.length) == 0):
            return None  # a name twice
        size += entries[i].name.length + entries[i].value.length + 2
    size += (6 + tags.length if tags.length else 0) + 6 + keys.length + 10 + uniq.length
    made = PyBytes_FromStringAndSize(NULL, size)
    out = <uint8_t*>PyBytes_AS_STRING(made)
    out = _put_entries(out, entries, count, tags)
    # KEYS: the keys split at spaces, the empty ones left out, joined by single spaces (none left: no KEYS).
    length = _put_keys(out + 5, keys)
    if length:
        memcpy(out, b"KEYS\x01", 5)
        out += 5 + length
        out[0] = 2
        out += 1
    out = _put(_put(out, b"UNIQ_KEY\x01", 9), uniq.ptr, uniq.length)
    out[0] = 2
    out += 1
    size = out - <uint8_t*>PyBytes_AS_STRING(made)
    return (text_of(real), origin_value, made[:size], text_of(tags), text_of(uniq),
            qid_value if qid.ptr != NULL else None, text_of(shard))


cdef Py_ssize_t _put_keys(uint8_t* out, Span keys) noexcept nogil:
    """``" ".join(k for k in keys.split(" ") if k)`` at ``out``; returns its length."""
    cdef Py_ssize_t i, n = 0
    cdef bint pending_space = False
    for i in range(keys.length):
        if keys.ptr[i] == 0x20:
            pending_space = n > 0
            continue
        if pending_space:
            out[n] = 0x20
            n += 1
            pending_space = False
        out[n] = keys.ptr[i]
        n += 1
    return n


cdef Py_ssize_t _put_signed(uint8_t* out, int64_t value) noexcept nogil:
    """``str(value)`` at ``out``; returns its length."""
    if value < 0:
        out[0] = 0x2D
        return 1 + _put_decimal(out + 1, -value)
    return _put_decimal(out, value)


# ---- the timer's enqueue (mqstore.timer.runs is the reference: noted_run, encode_units)
cdef enum:
    QUEUE_OFFSET_AT = 20
    PHYSICAL_OFFSET_AT = 28
    SYSFLAG_AT = 36
    STAMP_V4_AT = 56
    STAMP_V6_AT = 68
    BORN_HOST_V6 = 0x10
    UNIT_SIZE = 48
    PRE_UNIT_SIZE = 40  # mqstore.timer.runs.PRE_UNIT: five native int64s
    CQ_ENTRY_SIZE = 20
    KIND_DELIVER = 1
    KIND_ROLL = 2
    KIND_CANCEL = 4


cdef inline int64_t _be64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) |
                     (<uint64_t>p[3] << 32) | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) |
                     (<uint64_t>p[6] << 8) | <uint64_t>p[7])


cdef carray.array _INT64S = carray.array("q")


def timer_note_physicals(entries, Py_ssize_t start):
    """mqstore.timer.runs.note_physicals: the physical offsets of ``entries[start:]`` (AppendResults.entries: a
    list, or the compiled stamp's Entries, whose column is copied) as an array of int64, what Timer.note keeps of
    a batch."""
    cdef Py_ssize_t n = len(entries), i
    cdef tuple entry
    cdef Entries columns
    if start < 0:
        raise ValueError("start must not be negative")
    cdef carray.array out = carray.clone(_INT64S, n - start if n > start else 0, False)
    if type(entries) is Entries:
        columns = entries
        for i in range(start, n):
            out.data.as_longlongs[i - start] = columns.cells[i * ENTRY_FIELDS]
        return out
    if not isinstance(entries, list):
        raise TypeError(f"entries must be a list or Entries, not {type(entries).__name__}")
    for i in range(start, n):
        entry = entries[i]  # checked: a tuple
        if len(entry) < 1:
            raise ValueError(f"entries[{i}] is empty")
        out.data.as_longlongs[i - start] = entry[0]
    return out


def timer_noted_units(const uint8_t[::1] buf, int64_t seg_start, int64_t seg_end, const uint8_t[::1] entries,
                      Py_ssize_t index, int64_t first_offset, dict notes, int64_t read_ms, int64_t horizon,
                      int64_t precision, set rolled, bytearray units):
    """mqstore.timer.runs.noted_units: the noted records' headers checked and their units made in one pass (a
    note is a batch's: its physical offsets walked in C, no lookup a record), each a pre-unit written into
    ``units`` (room for the whole run made once, what was not used given back at the end)."""
    cdef Py_ssize_t n = entries.shape[0] // CQ_ENTRY_SIZE, buf_size = buf.shape[0], scheduled = 0, at = 0
    cdef Py_ssize_t noted_n = 0, base = len(units), made = 0
    cdef int64_t physical, size, position, queue_offset, stamp, noted_stamp = 0, due, slot, rest
    cdef int64_t pre[5]
    cdef const uint8_t* p
    cdef const int64_t[::1] physicals
    cdef tuple note
    cdef object noted = None  # the note's physical offsets (an array of int64) while one is walked
    cdef list dues = None
    cdef object got
    cdef bint any_rolled = len(rolled) > 0
    if precision <= 0 or index < 0:
        raise ValueError("precision must be positive, index not negative")
    PyByteArray_Resize(units, base + (n - index if n > index else 0) * PRE_UNIT_SIZE)
    try:
        while index < n:
            queue_offset = first_offset + index
            if noted is None:
                got = notes.pop(queue_offset, None)
                if got is None:
                    break
                note = got
                noted, dues, noted_stamp, at = note[0], note[1], note[2], note[3]  # checked: a list of due times
                physicals = noted
                noted_n = min(physicals.shape[0], len(dues))
            p = &entries[index * CQ_ENTRY_SIZE]
            physical, size = _be64(p), <int32_t>(<uint32_t>_be64(p + 4))  # the size: the low half of bytes 4-12
            position = physical - seg_start
            if (not seg_start <= physical < seg_end or size < FIXED_OVERHEAD or at < 0 or at >= noted_n
                    or physicals[at] != physical or position + STAMP_V6_AT + 8 > buf_size):
                break
            p = &buf[position]
            stamp = _be64(p + (STAMP_V6_AT if p[SYSFLAG_AT + 3] & BORN_HOST_V6 else STAMP_V4_AT))
            if (_be64(p + QUEUE_OFFSET_AT) != queue_offset or _be64(p + PHYSICAL_OFFSET_AT) != physical
                    or stamp != noted_stamp):
                break
            due = dues[at]
            index += 1
            at += 1
            if at == physicals.shape[0]:
                noted = None
            if any_rolled and queue_offset in rolled:
                continue
            rest = due % precision  # C's remainder: Python's is never negative for a positive precision
            if rest < 0:
                rest += precision
            slot = due - rest
            if slot < read_ms:
                slot = read_ms
            if slot >= horizon:
                pre[0], pre[4] = horizon, KIND_ROLL
            else:
                pre[0], pre[4] = slot, KIND_DELIVER
                scheduled += 1
            pre[1], pre[2], pre[3] = due, queue_offset, physical
            memcpy(<uint8_t*>PyByteArray_AS_STRING(units) + base + made * PRE_UNIT_SIZE, pre, PRE_UNIT_SIZE)
            made += 1
    finally:
        PyByteArray_Resize(units, base + made * PRE_UNIT_SIZE)
    if noted is not None:  # the rest of the note walked, for the next run
        notes[first_offset + index] = (noted, dues, noted_stamp, at)
    return index, scheduled


def timer_units(const uint8_t[::1] units, int64_t position, dict slots, int64_t enqueued_to, read):
    """mqstore.timer.runs.encode_units: the units' bytes from their pre-units in one buffer, CRCs included. The
    slot of the unit before is kept in C (a batch's units mostly share one) and its list written when the slot
    changes and at the end."""
    if units.shape[0] % PRE_UNIT_SIZE:
        raise ValueError(f"{units.shape[0]} bytes are not whole pre-units of {PRE_UNIT_SIZE}")
    cdef Py_ssize_t n = units.shape[0] // PRE_UNIT_SIZE, i
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n * UNIT_SIZE)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef int64_t pre[5]
    cdef list slot = None
    cdef object got, key
    cdef int64_t slot_ms, timer_offset, kind, slot_of = 0, first = 0, last = 0, count = 0
    for i in range(n):
        memcpy(pre, &units[i * PRE_UNIT_SIZE], PRE_UNIT_SIZE)
        slot_ms, timer_offset, kind = pre[0], pre[2], pre[4]
        if slot is None or slot_ms != slot_of:
            if slot is not None:
                slot[0], slot[1], slot[2] = first, last, count
            key = slot_ms
            got = slots.get(key)
            if got is None:
                got = read(key)
                slots[key] = got
            slot = <list>got
            slot_of, first, last, count = slot_ms, slot[0], slot[1], slot[2]
        if count == 0:
            first = position
        put_be64(o, <uint64_t>pre[1])
        put_be64(o + 8, <uint64_t>slot_ms)
        put_be64(o + 16, <uint64_t>timer_offset)
        put_be64(o + 24, <uint64_t>pre[3])
        put_be64(o + 32, <uint64_t>last)
        put_be16(o + 40, <uint16_t>kind)
        o[42] = 0
        o[43] = 0
        put_be32(o + 44, mq_crc32(0, o, 44))  # _crc.h: sliced for a short input
        last = position
        count += 1
        position += UNIT_SIZE
        o += UNIT_SIZE
        if kind != KIND_CANCEL and timer_offset >= enqueued_to:
            enqueued_to = timer_offset + 1
    if slot is not None:
        slot[0], slot[1], slot[2] = first, last, count
    return out, enqueued_to


# ---- the timer's delivery (mqstore.timer.delivery.copy_run is the reference)
cdef enum:
    FLAG_AT = 16
    BORN_TIMESTAMP_AT = 40
    BORN_HOST_AT = 48


def timer_copy_run(const uint8_t[::1] buf, int64_t seg_start, int64_t seg_end, int64_t low, int64_t visible,
                   bytes timer_topic, int64_t owned_from, list physicals, list offsets, Py_ssize_t index,
                   int64_t now_ms, copy_type, list out):
    """mqstore.timer.delivery.copy_run: from entry ``index`` of ``physicals`` (timer records' log offsets; their
    units' queue offsets in ``offsets``), while each lies in the segment buffer ``buf`` (log offsets
    ``seg_start``..``seg_end``), the record checked as the timer's lookup checks it (whole, CRC, PHYSICALOFFSET,
    between ``low`` and ``visible``, the timer topic's from ``owned_from``) and its delivered copy made from its
    bytes in the same pass (:func:`timer_copy`'s properties, the body, BODYCRC and header fields as stored):
    ``(real topic, origin, copy_type(...))`` appended to ``out``, or None where anything is not so (the caller
    then goes the reference way for that unit). Returns the index of the first entry not taken."""
    cdef Py_ssize_t n = len(physicals), size = buf.shape[0], position, body_at, born_len
    cdef Py_ssize_t topic_length = len(timer_topic)
    cdef const uint8_t* topic = <const uint8_t*>PyBytes_AS_STRING(timer_topic)
    cdef const uint8_t* p
    cdef int64_t physical
    cdef RecordSpan span
    cdef object parts, got
    if len(offsets) != n or index < 0:
        raise ValueError("physicals and offsets differ in length, or index is negative")
    if size == 0:
        return _none_run(physicals, index, seg_start, seg_end, out)
    p = &buf[0]
    while index < n:
        physical = physicals[index]
        if not seg_start <= physical < seg_end:
            break
        got = None
        position = physical - seg_start
        if (low <= physical < visible and 0 <= position and position + FIXED_OVERHEAD <= size
                and check_record(p, position, size, True, True, seg_start, &span)
                and physical + (span.end - position) <= visible and physical >= owned_from
                and p[span.topic_at] == topic_length and memcmp(p + span.topic_at + 1, topic, topic_length) == 0):
            parts = _copy_parts(p + span.props_at + 2, span.end - span.props_at - 2, offsets[index], now_ms,
                                span.store_timestamp_ms)
            if parts is not None:
                body_at = position + body_at_of(span.sys_flag)
                born_len = 16 if span.sys_flag & BORN_HOST_V6 else 4
                got = (parts[0], parts[1], copy_type(
                    PyBytes_FromStringAndSize(<const char*>p + body_at, span.topic_at - body_at),
                    <int32_t>_be32(p + position + 8), parts[2], parts[3], parts[4],
                    <int32_t>_be32(p + position + FLAG_AT), _be64(p + position + BORN_TIMESTAMP_AT),
                    PyBytes_FromStringAndSize(<const char*>p + position + BORN_HOST_AT, born_len),
                    <int32_t>_be32(p + position + BORN_HOST_AT + born_len), parts[5], parts[6]))
        out.append(got)
        index += 1
    return index


cdef Py_ssize_t _none_run(list physicals, Py_ssize_t index, int64_t seg_start, int64_t seg_end, list out):
    """None for each entry from ``index`` in the segment (an empty buffer holds no record)."""
    cdef int64_t physical
    while index < len(physicals):
        physical = physicals[index]
        if not seg_start <= physical < seg_end:
            break
        out.append(None)
        index += 1
    return index


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]
