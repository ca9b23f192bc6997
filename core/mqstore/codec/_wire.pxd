# cython: language_level=3
"""C helpers shared by the compiled codec modules: protobuf varints and tags, UTF-8 validation, Java's
String.hashCode over UTF-8 bytes, and big-endian stores. All are inline and take raw pointers; none
touches a Python object, so callers may use them without the GIL.

Reading helpers return the position after what they read, or -1 when the bytes are not valid there
(the caller then rejects the whole request). The acceptance rules are protobuf's (upb, the parser of
the Python protobuf package), measured, not guessed: tests/property/test_codec_append.py feeds both
the same bytes.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

# Protobuf wire types.
cdef enum:
    WT_VARINT = 0
    WT_FIXED64 = 1
    WT_LEN = 2
    WT_SGROUP = 3
    WT_EGROUP = 4
    WT_FIXED32 = 5


cdef inline Py_ssize_t read_varint(const uint8_t* p, Py_ssize_t at, Py_ssize_t end, uint64_t* out) noexcept nogil:
    """A varint of at most 10 bytes; bits past the 64th are dropped (as upb does)."""
    cdef uint64_t value = 0
    cdef unsigned int shift = 0
    cdef uint8_t b
    while shift < 70:
        if at >= end:
            return -1
        b = p[at]
        at += 1
        if shift < 64:
            value |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = value
            return at
        shift += 7
    return -1


cdef inline Py_ssize_t read_varint32(const uint8_t* p, Py_ssize_t at, Py_ssize_t end, uint32_t* out) noexcept nogil:
    """A tag or a length: at most 5 bytes, and the value must fit 32 bits (upb rejects the rest)."""
    cdef uint64_t value
    at = read_varint(p, at, min(end, at + 5), &value)
    if at < 0 or value >> 32:
        return -1
    out[0] = <uint32_t>value
    return at


cdef inline Py_ssize_t read_length(const uint8_t* p, Py_ssize_t at, Py_ssize_t end, Py_ssize_t* out) noexcept nogil:
    """The length of a length-delimited field; -1 unless that many bytes follow it."""
    cdef uint32_t length
    at = read_varint32(p, at, end, &length)
    if at < 0 or <uint64_t>length > <uint64_t>(end - at):
        return -1
    out[0] = <Py_ssize_t>length
    return at


cdef inline Py_ssize_t skip_field(const uint8_t* p, Py_ssize_t at, Py_ssize_t end, uint32_t tag,
                                  int depth) noexcept nogil:
    """Skip one unknown field whose tag was just read; groups are skipped whole, ``depth`` is how many
    more nested groups or messages may open (upb allows 100 in all)."""
    cdef uint64_t ignored
    cdef Py_ssize_t length
    cdef uint32_t inner
    cdef unsigned int wire_type = tag & 7
    if wire_type == WT_VARINT:
        return read_varint(p, at, end, &ignored)
    if wire_type == WT_FIXED64:
        return at + 8 if end - at >= 8 else -1
    if wire_type == WT_FIXED32:
        return at + 4 if end - at >= 4 else -1
    if wire_type == WT_LEN:
        at = read_length(p, at, end, &length)
        return at + length if at >= 0 else -1
    if wire_type == WT_SGROUP:
        if depth <= 0:
            return -1
        while True:
            # Field number 0 is refused everywhere but here: upb skips a group's fields without
            # checking their numbers (measured; tests/property/test_codec_append.py's edge cases).
            at = read_varint32(p, at, end, &inner)
            if at < 0:
                return -1
            if inner & 7 == WT_EGROUP:
                return at if inner >> 3 == tag >> 3 else -1
            at = skip_field(p, at, end, inner, depth - 1)
            if at < 0:
                return -1
    return -1  # an end-group nobody opened, or wire type 6 or 7


cdef inline bint valid_utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """Well-formed UTF-8 (Unicode's table 3-7: no overlong forms, no surrogates, nothing past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint64_t word
    cdef uint8_t c, c1
    while i < n:
        if i + 8 <= n:
            memcpy(&word, s + i, 8)
            if not (word & 0x8080808080808080ULL):
                i += 8
                continue
        c = s[i]
        if c < 0x80:
            i += 1
        elif c < 0xC2:
            return False
        elif c < 0xE0:
            if i + 1 >= n or s[i + 1] & 0xC0 != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0 != 0x80 or s[i + 2] & 0xC0 != 0x80 or (c == 0xE0 and c1 < 0xA0)
                    or (c == 0xED and c1 > 0x9F)):
                return False
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0 != 0x80 or s[i + 2] & 0xC0 != 0x80 or s[i + 3] & 0xC0 != 0x80
                    or (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F)):
                return False
            i += 4
        else:
            return False
    return True


cdef inline int32_t java_hash_utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """Java's String.hashCode of valid UTF-8 text: over UTF-16 code units (a code point past U+FFFF
    is two surrogates), wrapping at 32 bits (mqstore.javahash is the reference)."""
    return java_hash_utf8_continue(0, s, n)


cdef inline int32_t java_hash_utf8_continue(uint32_t h, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """The hash of prefix + s from the prefix's state ``h`` (javahash.java_hash_continue)."""
    cdef uint32_t cp
    cdef Py_ssize_t i = 0
    cdef uint8_t c
    while i < n:
        c = s[i]
        if c < 0x80:
            cp = c
            i += 1
        elif c < 0xE0:
            cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F)
            i += 2
        elif c < 0xF0:
            cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F)
            i += 3
        else:
            cp = (((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6)
                  | (s[i + 3] & 0x3F)) - 0x10000
            h = 31 * h + (0xD800 + (cp >> 10))
            cp = 0xDC00 + (cp & 0x3FF)
            i += 4
        h = 31 * h + cp
    return <int32_t>h


cdef inline int varint_size(uint64_t value) noexcept nogil:
    cdef int size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


cdef inline Py_ssize_t put_varint(uint8_t* out, Py_ssize_t at, uint64_t value) noexcept nogil:
    while value >= 0x80:
        out[at] = <uint8_t>(value | 0x80)
        value >>= 7
        at += 1
    out[at] = <uint8_t>value
    return at + 1


cdef inline void put_be16(uint8_t* out, uint16_t value) noexcept nogil:
    out[0] = value >> 8
    out[1] = value & 0xFF


cdef inline void put_be32(uint8_t* out, uint32_t value) noexcept nogil:
    out[0] = value >> 24
    out[1] = (value >> 16) & 0xFF
    out[2] = (value >> 8) & 0xFF
    out[3] = value & 0xFF


cdef inline void put_be64(uint8_t* out, uint64_t value) noexcept nogil:
    put_be32(out, <uint32_t>(value >> 32))
    put_be32(out + 4, <uint32_t>value)
