# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The Index service's build in C: Tail frame bytes to the hashes each record indexes, and those hashes
into an unsealed IndexFile, with no Python object per record.

The references are pure Python and stay so: decode.decode_frame + records.index_keys + Writer._hashes
(which records index which keys) and index_file.IndexFile.put_hashes (the bytes);
tests/property/test_codec_index.py requires the same files and outcomes from both.

IndexColumns, filled by :meth:`IndexColumns.add` from a frame, holds per record, in log order:

  column            type     meaning
  ----------------- -------- ---------------------------------------------------------------------
  physical offset   int64    of the record
  store time        int64    STORETIMESTAMP (ms)
  key end           ssize_t  the record's hashes are hashes[key_end[i-1]:key_end[i]] (none: no keys)
  hashes            int32    key_hash("topic#key") of each key (index_file.key_hash)

The keys of a record are index_keys' rules: none for a rolled-back transaction record or an empty
topic; else UNIQ_KEY first (when not empty), then KEYS split on single spaces without the empty parts;
duplicates collapse keeping the first; at most ``max_keys``, the others counted in ``dropped`` (record
index -> (count, topic)). Property values are found as record_reader.find_property does (the last
non-empty entry of the name). A record whose topic or key values are not valid UTF-8 (the reference
decodes them with "replace"), or that has more than MAX_RAW_KEYS (64) distinct keys, goes to the
``fallback`` callable (the reference), which returns (hashes, dropped count, topic).

Thread-safety: an IndexColumns belongs to one thread; :meth:`IndexColumns.put` runs without the GIL
but its caller holds the index store's lock (the file is not thread-safe).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp

from mqstore.codec._walk cimport FIXED_OVERHEAD, RecordSpan, be32, check_record
from mqstore.codec._wire cimport java_hash_utf8_continue, put_be32, put_be64, valid_utf8

cdef extern from *:
    """
    /* Keeps the compiler from moving stores across it: a process killed inside put() must leave
       the file in one of the states the write order allows (entries, then header, then slots). */
    static inline void mqstore_store_barrier(void) { __asm__ __volatile__("" ::: "memory"); }
    """
    void store_barrier "mqstore_store_barrier"() noexcept nogil

cdef enum:
    TX_MASK = 0xC               # record.SYSFLAG_TX_MASK
    TX_ROLLBACK = 0xC           # record.SYSFLAG_TX_ROLLBACK
    MAX_RAW_KEYS = 64           # more distinct keys in one record: the reference handles it
    HEADER_SIZE = 40            # index_file.HEADER_SIZE
    SLOT_SIZE = 4               # index_file.SLOT_SIZE
    ENTRY_SIZE = 20             # index_file.ENTRY_SIZE
    INT_MAX = 0x7FFFFFFF
    INT_MIN_HASH = -2147483648

# Checked against mqstore.format.record and index_file when index_file is imported.
LAYOUT = {"tx_mask": TX_MASK, "tx_rollback": TX_ROLLBACK, "header_size": HEADER_SIZE, "slot_size": SLOT_SIZE,
          "entry_size": ENTRY_SIZE, "header": ">qqqqii", "entry": ">iqii", "slot": ">i"}


cdef struct Span:
    const uint8_t* at
    Py_ssize_t length


cdef struct Header:             # index_file.Header
    int64_t begin_timestamp_ms
    int64_t end_timestamp_ms
    int64_t begin_phy_offset
    int64_t end_phy_offset
    int32_t hash_slot_count
    int32_t index_count


cdef Span _property(const uint8_t* props, Py_ssize_t length, const char* marker, Py_ssize_t marker_length) noexcept nogil:
    """record_reader.find_property: the value of the last entry that starts with ``marker`` (name + 0x01)
    and is not empty; ``at`` NULL when there is none. (A marker holds no 0x02, so an occurrence can only
    lie inside one entry: find_property's search and this walk over the entries find the same ones.)"""
    cdef Span found
    cdef Py_ssize_t start = 0, end
    cdef const uint8_t* stop
    found.at, found.length = NULL, 0
    while start < length:
        stop = <const uint8_t*>memchr(props + start, 2, length - start)
        end = length if stop == NULL else stop - props
        if end - start > marker_length and memcmp(props + start, marker, marker_length) == 0:
            found.at, found.length = props + start + marker_length, end - start - marker_length
        start = end + 1
    return found


cdef int _add_key(Span* keys, int count, const uint8_t* at, Py_ssize_t length) noexcept nogil:
    """Append a key unless an equal one is there (first seen wins); -1 when MAX_RAW_KEYS are there."""
    cdef int i
    for i in range(count):
        if keys[i].length == length and memcmp(keys[i].at, at, length) == 0:
            return count
    if count == MAX_RAW_KEYS:
        return -1
    keys[count].at, keys[count].length = at, length
    return count + 1


cdef int _record_keys(const uint8_t* props, Py_ssize_t props_length, Span* keys) noexcept nogil:
    """The distinct keys of a record (UNIQ_KEY, then KEYS split on spaces), or -1 for the fallback."""
    cdef Span uniq = _property(props, props_length, b"UNIQ_KEY\x01", 9)
    cdef Span value = _property(props, props_length, b"KEYS\x01", 5)
    cdef int count = 0
    cdef Py_ssize_t start = 0, end
    cdef const uint8_t* space
    if (uniq.at != NULL and not valid_utf8(uniq.at, uniq.length)) or (
            value.at != NULL and not valid_utf8(value.at, value.length)):
        return -1
    if uniq.at != NULL:
        count = _add_key(keys, count, uniq.at, uniq.length)
    while start < value.length:
        space = <const uint8_t*>memchr(value.at + start, 32, value.length - start)
        end = value.length if space == NULL else space - value.at
        if end > start:
            count = _add_key(keys, count, value.at + start, end - start)
            if count < 0:
                return -1
        start = end + 1
    return count


cdef class IndexColumns:
    """The records of Tail frames as columns (see the module's docstring). Owned by one thread."""

    cdef int64_t* _phy
    cdef int64_t* _ts
    cdef Py_ssize_t* _key_end
    cdef int32_t* _hashes
    cdef Py_ssize_t _count, _capacity, _hash_count, _hash_capacity
    cdef readonly Py_ssize_t max_keys
    cdef readonly dict dropped           # record index -> (keys dropped, topic), for the few that drop keys
    cdef object _fallback

    def __cinit__(self, Py_ssize_t max_keys, fallback):
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys}")
        self.max_keys = max_keys
        self.dropped = {}
        self._fallback = fallback

    def __dealloc__(self):
        PyMem_Free(self._phy)
        PyMem_Free(self._ts)
        PyMem_Free(self._key_end)
        PyMem_Free(self._hashes)

    def __len__(self):
        return self._count

    cdef int _grow_records(self) except -1:
        cdef Py_ssize_t capacity = max(64, 2 * self._capacity)
        self._phy = <int64_t*>_resized(self._phy, capacity * sizeof(int64_t))
        self._ts = <int64_t*>_resized(self._ts, capacity * sizeof(int64_t))
        self._key_end = <Py_ssize_t*>_resized(self._key_end, capacity * sizeof(Py_ssize_t))
        self._capacity = capacity
        return 0

    cdef int _reserve_hashes(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t capacity = self._hash_capacity
        if self._hash_count + more <= capacity:
            return 0
        capacity = max(256, 2 * capacity, self._hash_count + more)
        self._hashes = <int32_t*>_resized(self._hashes, capacity * sizeof(int32_t))
        self._hash_capacity = capacity
        return 0

    def add(self, const uint8_t[::1] buf, Py_ssize_t position, int64_t base):
        """Append the records of ``buf`` from ``position`` while they pass record_scan's checks (body CRC,
        and each naming its own physical offset ``base + position``); return where the walk stopped
        (``len(buf)`` when every record passed)."""
        cdef const uint8_t* p = &buf[0] if buf.shape[0] else NULL
        cdef Py_ssize_t limit = buf.shape[0]
        cdef RecordSpan r
        while limit - position >= FIXED_OVERHEAD and check_record(p, position, limit, True, True, base, &r):
            if self._count == self._capacity:
                self._grow_records()
            self._phy[self._count] = r.physical_offset
            self._ts[self._count] = r.store_timestamp_ms
            self._add_hashes(p, position, &r)
            self._key_end[self._count] = self._hash_count
            self._count += 1
            position = r.end
        return position

    cdef int _add_hashes(self, const uint8_t* p, Py_ssize_t position, RecordSpan* r) except -1:
        cdef const uint8_t* topic = p + r.topic_at + 1
        cdef Py_ssize_t topic_length = r.props_at - r.topic_at - 1
        cdef Span keys[MAX_RAW_KEYS]
        cdef int count, kept, i
        cdef uint32_t prefix
        cdef int32_t h
        if (r.sys_flag & TX_MASK) == TX_ROLLBACK or topic_length == 0:
            return 0
        count = _record_keys(p + r.props_at + 2, r.end - r.props_at - 2, keys)
        if count < 0 or not valid_utf8(topic, topic_length):
            return self._add_fallback(p, position, r)
        kept = min(count, self.max_keys)
        self._reserve_hashes(kept)
        prefix = <uint32_t>java_hash_utf8_continue(0, topic, topic_length) * 31 + 35  # "topic#"
        for i in range(kept):
            h = java_hash_utf8_continue(prefix, keys[i].at, keys[i].length)
            self._hashes[self._hash_count] = 0 if h == INT_MIN_HASH else (-h if h < 0 else h)
            self._hash_count += 1
        if count > kept:
            self.dropped[self._count] = (count - kept, PyUnicode_DecodeUTF8(<const char*>topic, topic_length, NULL))
        return 0

    cdef int _add_fallback(self, const uint8_t* p, Py_ssize_t position, RecordSpan* r) except -1:
        """The reference's answer for a record the C rules do not cover (see the module's docstring)."""
        hashes, dropped, topic = self._fallback(
            r.physical_offset, r.sys_flag, r.store_timestamp_ms,
            PyBytes_FromStringAndSize(<const char*>p + r.topic_at + 1, r.props_at - r.topic_at - 1),
            PyBytes_FromStringAndSize(<const char*>p + r.props_at + 2, r.end - r.props_at - 2))
        self._reserve_hashes(len(hashes))
        for h in hashes:
            if not 0 <= h <= INT_MAX:
                raise ValueError(f"the fallback gave key hash {h} for the record at {r.physical_offset}")
            self._hashes[self._hash_count] = h
            self._hash_count += 1
        if dropped:
            self.dropped[self._count] = (dropped, topic)
        return 0

    # -- reading the columns (the few records the writer handles in Python) -------------------------
    def physical_offset(self, Py_ssize_t i):
        self._check_index(i)
        return self._phy[i]

    def store_timestamp_ms(self, Py_ssize_t i):
        self._check_index(i)
        return self._ts[i]

    def hashes_of(self, Py_ssize_t i):
        """The key hashes of record ``i``, as a list."""
        cdef Py_ssize_t j, start
        self._check_index(i)
        start = self._key_end[i - 1] if i else 0
        return [self._hashes[j] for j in range(start, self._key_end[i])]

    def first_at_or_after(self, int64_t physical_offset):
        """The index of the first record at or after ``physical_offset`` (len(self) if none)."""
        cdef Py_ssize_t low = 0, high = self._count, middle
        while low < high:
            middle = (low + high) // 2
            if self._phy[middle] < physical_offset:
                low = middle + 1
            else:
                high = middle
        return low

    cdef int _check_index(self, Py_ssize_t i) except -1:
        if not 0 <= i < self._count:
            raise IndexError(f"record {i} of {self._count}")
        return 0

    # -- into an IndexFile -----------------------------------------------------------------------------
    def put(self, uint8_t[::1] mm, Py_ssize_t slot_count, Py_ssize_t entry_count, tuple header, Py_ssize_t start):
        """index_file.IndexFile.put_hashes for records ``start``, ``start + 1``, ... into the mapped file
        ``mm`` whose header is ``header`` (the six fields), each as that method writes it: its entries,
        then the header, then the slots. A record without keys is skipped. Stops before the first record
        that does not fit, or at a slot that points past indexCount. Returns (index of the record it
        stopped at, records put, records skipped, the header after the last record put, None or
        (slot, its value, indexCount) for the slot that stopped it)."""
        cdef Header h
        cdef Py_ssize_t i, applied = 0, skipped = 0
        cdef int64_t bad_slot = -1
        cdef int32_t bad_value = 0
        h.begin_timestamp_ms, h.end_timestamp_ms, h.begin_phy_offset, h.end_phy_offset, \
            h.hash_slot_count, h.index_count = header
        if slot_count < 1 or not 1 <= h.index_count <= entry_count or mm.shape[0] < (
                HEADER_SIZE + SLOT_SIZE * slot_count + ENTRY_SIZE * entry_count):
            raise ValueError(f"a mapping of {mm.shape[0]} bytes with header {header} does not hold "
                             f"{slot_count} slots and {entry_count} entries")
        i = start
        with nogil:
            while i < self._count:
                if self._key_end[i] == (self._key_end[i - 1] if i else 0):
                    skipped += 1
                elif _put_record(&mm[0], slot_count, entry_count, &h, self._phy[i], self._ts[i],
                                 self._hashes + (self._key_end[i - 1] if i else 0),
                                 self._key_end[i] - (self._key_end[i - 1] if i else 0), &bad_slot, &bad_value):
                    applied += 1
                else:
                    break
                i += 1
        bad = None if bad_slot < 0 else (bad_slot, bad_value, h.index_count)
        return (i, applied, skipped, (h.begin_timestamp_ms, h.end_timestamp_ms, h.begin_phy_offset,
                                      h.end_phy_offset, h.hash_slot_count, h.index_count), bad)


cdef void* _resized(void* block, size_t size_bytes) except NULL:
    cdef void* grown = PyMem_Realloc(block, size_bytes)
    if grown == NULL:
        raise MemoryError(f"index columns: cannot grow to {size_bytes} bytes")
    return grown


cdef bint _put_record(uint8_t* mm, Py_ssize_t slot_count, Py_ssize_t entry_count, Header* h, int64_t phy,
                      int64_t ts, const int32_t* hashes, Py_ssize_t n, int64_t* bad_slot,
                      int32_t* bad_value) noexcept nogil:
    """One message's keys, as IndexFile.put_hashes; False (nothing of the header or slots written) when
    they do not fit or a slot is bad (then ``bad_slot``/``bad_value`` say which)."""
    cdef uint8_t* entries = mm + HEADER_SIZE + SLOT_SIZE * slot_count
    cdef int32_t first_number = h.index_count, number = h.index_count, old
    cdef bint first = first_number == 1
    cdef int64_t begin_ts = ts if first else h.begin_timestamp_ms
    cdef int64_t diff = 0
    cdef int32_t new_slots = 0
    cdef Py_ssize_t j, k, slot
    cdef uint8_t* entry
    if number + n > entry_count:
        return False
    if not first and begin_ts > 0 and ts > begin_ts:  # the difference of two int64 fits a uint64
        diff = <int64_t>min((<uint64_t>ts - <uint64_t>begin_ts) // 1000, <uint64_t>INT_MAX)
    for j in range(n):
        slot = hashes[j] % slot_count
        old = -1
        for k in range(j - 1, -1, -1):  # this message's newer entry of the same bucket, if any
            if hashes[k] % slot_count == slot:
                old = first_number + <int32_t>k
                break
        if old < 0:
            old = <int32_t>be32(mm + HEADER_SIZE + SLOT_SIZE * slot)
            if not 0 <= old < first_number:
                bad_slot[0], bad_value[0] = slot, old
                return False
            new_slots += old == 0
        entry = entries + ENTRY_SIZE * number
        put_be32(entry, <uint32_t>hashes[j])
        put_be64(entry + 4, <uint64_t>phy)
        put_be32(entry + 12, <uint32_t>diff)
        put_be32(entry + 16, <uint32_t>old)
        number += 1
    store_barrier()
    if first:
        h.begin_phy_offset = phy
    h.begin_timestamp_ms, h.end_timestamp_ms, h.end_phy_offset = begin_ts, ts, phy
    h.hash_slot_count += new_slots
    h.index_count = number
    put_be64(mm, <uint64_t>h.begin_timestamp_ms)
    put_be64(mm + 8, <uint64_t>h.end_timestamp_ms)
    put_be64(mm + 16, <uint64_t>h.begin_phy_offset)
    put_be64(mm + 24, <uint64_t>h.end_phy_offset)
    put_be32(mm + 32, <uint32_t>h.hash_slot_count)
    put_be32(mm + 36, <uint32_t>h.index_count)
    store_barrier()
    for j in range(n):
        put_be32(mm + HEADER_SIZE + SLOT_SIZE * (hashes[j] % slot_count), <uint32_t>(first_number + j))
    return True
