# cython: language_level=3
"""The check of one commit log record in a buffer, shared by the compiled walks (_scan.scan, _index's
frame columns): exactly record_scan._scan_python's conditions, so every walk stops at the same record.

Layout facts (mqstore.format.record, checked against it through _scan.LAYOUT by mqstore.codec): the
SYSFLAG's host bits pick one of four layouts; an IPv6 born host adds 12 bytes before STORETIMESTAMP
and the body, an IPv6 store host 12 more before the body.
"""

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "_crc.h":
    uint32_t mq_crc32(uint32_t crc, const uint8_t* p, size_t n) nogil  # zlib's crc32, folded where the CPU can

cdef enum:
    MAGIC_V1_HIGH = 0xDAA3      # MAGIC_V1 = 0xDAA320A7, in two halves (an enum is a C int)
    MAGIC_V1_LOW = 0x20A7
    FIXED_OVERHEAD = 91
    HOSTS_V6 = 0x30             # SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6
    BORN_HOST_V6 = 0x10
    SYS_FLAG_AT = 36
    PHYSICAL_OFFSET_AT = 28
    BODY_CRC_AT = 8
    IPV4_BODY_AT = 88
    IPV4_STORE_TIMESTAMP_AT = 56
    V6_HOST_EXTRA = 12


cdef struct RecordSpan:
    Py_ssize_t end               # position after the record
    Py_ssize_t topic_at          # position of TOPICLENGTH (the topic follows it)
    Py_ssize_t props_at          # position of PROPERTIESLENGTH (the properties follow it)
    int32_t sys_flag
    int64_t store_timestamp_ms
    int64_t physical_offset


cdef inline uint32_t be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline int64_t be64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t>be32(p) << 32) | be32(p + 4))


cdef inline Py_ssize_t body_at_of(int32_t sys_flag) noexcept nogil:
    """Where the body starts, from the record's start (record.BODY_AT)."""
    return IPV4_BODY_AT + V6_HOST_EXTRA * (((sys_flag & HOSTS_V6) == HOSTS_V6) + ((sys_flag & HOSTS_V6) != 0))


cdef inline Py_ssize_t store_timestamp_at_of(int32_t sys_flag) noexcept nogil:
    """Where STORETIMESTAMP is, from the record's start (record.STORE_TIMESTAMP_AT)."""
    return IPV4_STORE_TIMESTAMP_AT + V6_HOST_EXTRA * ((sys_flag & BORN_HOST_V6) != 0)


cdef inline bint check_record(const uint8_t* p, Py_ssize_t position, Py_ssize_t limit, bint verify_crc,
                              bint check_offset, int64_t base_offset, RecordSpan* out) noexcept nogil:
    """True when a valid V1 record starts at ``position`` and ends by ``limit`` (with its body CRC when
    ``verify_crc``, and naming its own physical offset ``base_offset + position`` when ``check_offset``);
    its fields are then in ``out``. The caller makes sure FIXED_OVERHEAD bytes are there."""
    cdef int32_t total = <int32_t>be32(p + position)
    cdef Py_ssize_t end = position + total
    cdef int32_t sys_flag = <int32_t>be32(p + position + SYS_FLAG_AT)
    cdef Py_ssize_t body_at = position + body_at_of(sys_flag)
    cdef int32_t body_len
    cdef Py_ssize_t topic_at, props_at
    if (sys_flag & HOSTS_V6) and (end < body_at + 3 or end > limit):
        return False
    body_len = <int32_t>be32(p + body_at - 4)
    topic_at = body_at + body_len
    if (be32(p + position + 4) != ((<uint32_t>MAGIC_V1_HIGH << 16) | MAGIC_V1_LOW) or end > limit
            or end < body_at + 3 or topic_at < body_at or topic_at >= end
            or (check_offset and be64(p + position + PHYSICAL_OFFSET_AT) != base_offset + position)):
        return False
    props_at = topic_at + 1 + p[topic_at]
    if props_at + 2 > end or props_at + 2 + <int16_t>((p[props_at] << 8) | p[props_at + 1]) != end:
        return False
    if verify_crc and ((mq_crc32(0, p + body_at, <size_t>body_len) & 0x7FFFFFFF)
                       != be32(p + position + BODY_CRC_AT)):
        return False
    out.end = end
    out.topic_at = topic_at
    out.props_at = props_at
    out.sys_flag = sys_flag
    out.store_timestamp_ms = be64(p + position + store_timestamp_at_of(sys_flag))
    out.physical_offset = be64(p + position + PHYSICAL_OFFSET_AT)
    return True
