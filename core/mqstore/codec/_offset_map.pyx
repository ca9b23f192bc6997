# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compaction round's key map in C: mqstore.compaction.offset_map.PyOffsetMap is the reference (the
slot layout is in its docstring), and tests/property/test_codec_offset_map.py requires the same tables
and results from both.

Not thread-safe: owned by one round.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from mqstore.errors import InvalidArgument, invariant

cdef enum:
    SLOT_BYTES = 24
    PAIR_BYTES = 24
    ENTRY_COST_BYTES = 32

LAYOUT = {"slot_bytes": SLOT_BYTES, "pair_bytes": PAIR_BYTES, "entry_cost_bytes": ENTRY_COST_BYTES}


cdef inline uint64_t le64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(7, -1, -1):
        v = (v << 8) | p[k]
    return v


cdef inline void put_le64(uint8_t* p, uint64_t v) noexcept nogil:
    cdef int k
    for k in range(8):
        p[k] = v & 0xFF
        v >>= 8


cdef class OffsetMap:
    cdef public Py_ssize_t capacity, slots, size
    cdef public int64_t last_offset
    cdef readonly bytearray table
    cdef uint8_t* _t

    def __init__(self, Py_ssize_t memory_bytes):
        if memory_bytes < ENTRY_COST_BYTES:
            raise InvalidArgument(f"offset_map_memory_bytes {memory_bytes} holds no key; at least "
                                  f"{ENTRY_COST_BYTES} (one key) is needed")
        self.capacity = memory_bytes // ENTRY_COST_BYTES
        self.slots = self.capacity * 4 // 3 + 1
        self.table = bytearray(self.slots * SLOT_BYTES)
        self._t = <uint8_t*>(<char*>self.table)
        self.size = 0
        self.last_offset = -1

    def __len__(self):
        return self.size

    def clear(self):
        memset(self._t, 0, self.slots * SLOT_BYTES)
        self.size = 0
        self.last_offset = -1

    cdef inline Py_ssize_t _find(self, const uint8_t* d, bint* found) noexcept nogil:
        cdef Py_ssize_t i = <Py_ssize_t>(le64(d + 8) % <uint64_t>self.slots)
        cdef uint8_t* at
        while True:
            at = self._t + i * SLOT_BYTES
            if le64(at + 16) == 0:
                found[0] = False
                return i
            if memcmp(at, d, 16) == 0:
                found[0] = True
                return i
            i += 1
            if i == self.slots:
                i = 0

    cdef inline bint _can_put(self, const uint8_t* d) noexcept nogil:
        cdef bint found
        if self.size < self.capacity:
            return True
        self._find(d, &found)
        return found

    cdef inline void _put(self, const uint8_t* d, int64_t value) noexcept nogil:
        cdef bint found
        cdef Py_ssize_t i = self._find(d, &found)
        cdef uint8_t* at = self._t + i * SLOT_BYTES
        if not found:
            memcpy(at, d, 16)
            self.size += 1
        put_le64(at + 16, <uint64_t>(value + 1))

    cdef inline int64_t _get(self, const uint8_t* d) noexcept nogil:
        cdef bint found
        cdef Py_ssize_t i = self._find(d, &found)
        return <int64_t>le64(self._t + i * SLOT_BYTES + 16) - 1 if found else -1

    @staticmethod
    cdef const uint8_t* _digest(bytes key_digest) except NULL:
        if len(key_digest) != 16:
            invariant(False, "a key digest is 16 bytes")
            return NULL
        return <const uint8_t*>(<char*>key_digest)

    def can_put(self, bytes key_digest):
        return self._can_put(OffsetMap._digest(key_digest))

    def put(self, bytes key_digest, int64_t value):
        cdef const uint8_t* d = OffsetMap._digest(key_digest)
        if value < 0:
            invariant(False, "a map value is a queue offset or entry index, not negative")
        if not self._can_put(d):
            invariant(False, "put into a full offset map (ask can_put first)")
        self._put(d, value)
        self.last_offset = value

    def get(self, bytes key_digest):
        cdef int64_t v = self._get(OffsetMap._digest(key_digest))
        return None if v < 0 else v

    def put_pairs(self, const uint8_t[::1] pairs, int64_t min_value):
        cdef Py_ssize_t n = pairs.shape[0] // PAIR_BYTES, k
        cdef const uint8_t* p
        cdef int64_t value
        for k in range(n):
            p = &pairs[k * PAIR_BYTES]
            value = <int64_t>le64(p + 16)
            if value < min_value:
                continue
            if not self._can_put(p):
                return k
            if value < 0:
                invariant(False, "a map value is a queue offset or entry index, not negative")
            self._put(p, value)
        return n

    def mark_superseded(self, const uint8_t[::1] pairs, bytearray bits):
        cdef Py_ssize_t n = pairs.shape[0] // PAIR_BYTES, k, marked = 0, nbits = len(bits)
        cdef uint8_t* b = <uint8_t*>(<char*>bits)
        cdef const uint8_t* p
        cdef int64_t value, latest
        for k in range(n):
            p = &pairs[k * PAIR_BYTES]
            value = <int64_t>le64(p + 16)
            latest = self._get(p)
            if latest >= 0 and value < latest:
                if value < 0 or (value >> 3) >= nbits:
                    invariant(False, "a pair's value indexes the round's bitset")
                b[value >> 3] |= <uint8_t>(1 << (value & 7))
                marked += 1
        return marked
