# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The consume-queue rebuild's walk over one segment range in C: records to consume queue runs.

mqstore.queue.dispatch's reference loop (Dispatcher._replay_segment_python over
record_scan.routing_records) is the specification; mqstore.queue.replay applies what this returns
with the reference's rules, and tests/property/test_codec_replay.py requires identical consume queues.

:func:`replay_runs` walks records from a position while it is below an end and:
- stops at a blank record (the end of a segment's data), and before the first record it does not
  take on (_walk.check_record fails within the buffer, CRC and PHYSICALOFFSET not checked: exactly
  where _scan.routing_records stops); the caller goes on there with the reference, which reads it as
  it stands;
- counts every record it walks and keeps the store time of the last one;
- skips the records of prepared and rolled-back transactions (dispatch._NO_CQ: they get no entry);
- groups the others per (topic bytes, queue id) into runs of consecutive queue offsets, in log order
  per queue, each run's entries packed in the cq_unit format: physical offset (``base`` + the
  record's position: where it lies, as the reference takes it), TOTALSIZE, tag code. The tag code is
  MessageEncoder.tag_code of TAGS as _scan._tags_of finds it (the same rule: the last non-empty
  ``TAGS`` entry): Java's String.hashCode of the text decoded with "replace", 0 when there is none.

Nothing here knows the consume queues' state: which runs are written, trimmed or make a queue
"behind" is the caller's (mqstore.queue.replay), since those rules hold per queue.

Thread-safety: a pure function over the caller's buffer (which must not change during the call).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memset

from mqstore.codec._walk cimport (FIXED_OVERHEAD, RecordSpan, be32, be64, body_at_of, check_record,
                                  store_timestamp_at_of)
from mqstore.codec._wire cimport java_hash_utf8, put_be32, put_be64, valid_utf8

# mqstore.format.record and cq_unit: the fields read and written here besides _walk's (checked by mqstore.codec).
cdef uint32_t MAGIC_BLANK = 0xCBD43194
cdef enum:
    QUEUE_ID_AT = 12
    QUEUE_OFFSET_AT = 20
    TX_MASK = 0xC
    TX_PREPARED = 0x4
    TX_ROLLBACK = 0xC
    CQ_ENTRY = 20
    FIRST_ENTRIES = 256       # entries a queue's buffer starts with (it doubles when full)
    FIRST_RUNS = 4
    FIRST_SLOTS = 64          # hash table slots at start (a power of two; doubles at half full)

LAYOUT = {"body_at": tuple(body_at_of(layout << 4) for layout in range(4)),
          "store_timestamp_at": tuple(store_timestamp_at_of(layout << 4) for layout in range(4)),
          "magic_blank": MAGIC_BLANK, "fixed_overhead": FIXED_OVERHEAD, "queue_id_at": QUEUE_ID_AT,
          "queue_offset_at": QUEUE_OFFSET_AT, "tx_mask": TX_MASK, "tx_prepared": TX_PREPARED,
          "tx_rollback": TX_ROLLBACK, "cq_entry": CQ_ENTRY}


ctypedef struct Run:
    int64_t first_offset      # queue offset of its first entry
    Py_ssize_t first_entry    # index of its first entry in the group's entries
    int64_t physical_end      # physical offset + size of its last entry's record

ctypedef struct Group:        # one (topic, queue id): its entries and their runs, in log order
    const uint8_t* topic      # into the caller's buffer
    Py_ssize_t topic_length
    int32_t queue_id
    uint64_t hash
    bint continues            # whether a next record at next_offset extends the last run
    int64_t next_offset
    uint8_t* entries
    Py_ssize_t entry_count, entry_capacity
    Run* runs
    Py_ssize_t run_count, run_capacity

ctypedef struct Table:        # groups in order of first appearance, found through open addressing
    Group* groups
    Py_ssize_t count, capacity
    Py_ssize_t* slots         # group index + 1; 0 is a free slot
    Py_ssize_t slot_count


cdef extern from *:
    void __builtin_prefetch(const void* address) nogil


cdef inline bint same_bytes(const uint8_t* a, const uint8_t* b, Py_ssize_t length) noexcept nogil:
    """memcmp(a, b, length) == 0 for the short strings here (a topic, a property name), without a call."""
    cdef Py_ssize_t i
    for i in range(length):
        if a[i] != b[i]:
            return False
    return True


cdef inline uint64_t key_hash(const uint8_t* topic, Py_ssize_t length, int32_t queue_id) noexcept nogil:
    cdef uint64_t h = 14695981039346656037ULL  # FNV-1a
    cdef Py_ssize_t i
    for i in range(length):
        h = (h ^ topic[i]) * 1099511628211ULL
    h = (h ^ <uint32_t>queue_id) * 1099511628211ULL
    return h ^ (h >> 29)


cdef void* grown(void* block, Py_ssize_t size) except NULL:
    cdef void* bigger = PyMem_Realloc(block, size)
    if bigger == NULL:
        raise MemoryError(f"the consume-queue rebuild could not allocate {size} bytes")
    return bigger


cdef int rehash(Table* t, Py_ssize_t slot_count) except -1:
    cdef Py_ssize_t* slots = <Py_ssize_t*>grown(NULL, slot_count * sizeof(Py_ssize_t))
    cdef Py_ssize_t index, at
    memset(slots, 0, slot_count * sizeof(Py_ssize_t))
    for index in range(t.count):
        at = t.groups[index].hash & (slot_count - 1)
        while slots[at]:
            at = (at + 1) & (slot_count - 1)
        slots[at] = index + 1
    PyMem_Free(t.slots)
    t.slots, t.slot_count = slots, slot_count
    return 0


cdef Group* find_group(Table* t, const uint8_t* topic, Py_ssize_t length, int32_t queue_id) except NULL:
    """The group of (topic, queue id), added when new. The pointer holds until the next call."""
    cdef uint64_t h = key_hash(topic, length, queue_id)
    cdef Py_ssize_t at = h & (t.slot_count - 1)
    cdef Group* g
    while t.slots[at]:
        g = &t.groups[t.slots[at] - 1]
        if (g.hash == h and g.queue_id == queue_id and g.topic_length == length
                and same_bytes(g.topic, topic, length)):
            return g
        at = (at + 1) & (t.slot_count - 1)
    if t.count == t.capacity:
        t.groups = <Group*>grown(t.groups, 2 * t.capacity * sizeof(Group))
        t.capacity *= 2
    g = &t.groups[t.count]
    memset(g, 0, sizeof(Group))
    g.topic, g.topic_length, g.queue_id, g.hash = topic, length, queue_id, h
    t.count += 1
    t.slots[at] = t.count
    if 2 * t.count > t.slot_count:
        rehash(t, 2 * t.slot_count)
    return g


cdef int add_entry(Group* g, int64_t queue_offset, int64_t physical_offset, int32_t size,
                   int64_t tag_code) except -1:
    """Append one entry, starting a run unless it is the next offset of the last one."""
    cdef uint8_t* e
    if g.entry_count == g.entry_capacity:
        g.entry_capacity = g.entry_capacity * 2 if g.entry_capacity else FIRST_ENTRIES
        g.entries = <uint8_t*>grown(g.entries, g.entry_capacity * CQ_ENTRY)
    if not (g.run_count and g.continues and queue_offset == g.next_offset):
        if g.run_count == g.run_capacity:
            g.run_capacity = g.run_capacity * 2 if g.run_capacity else FIRST_RUNS
            g.runs = <Run*>grown(g.runs, g.run_capacity * sizeof(Run))
        g.runs[g.run_count].first_offset = queue_offset
        g.runs[g.run_count].first_entry = g.entry_count
        g.run_count += 1
    g.runs[g.run_count - 1].physical_end = physical_offset + size
    g.continues = queue_offset != INT64_MAX  # no offset follows the largest one
    g.next_offset = queue_offset + 1 if g.continues else queue_offset
    e = g.entries + g.entry_count * CQ_ENTRY
    put_be64(e, <uint64_t>physical_offset)
    put_be32(e + 8, <uint32_t>size)
    put_be64(e + 12, <uint64_t>tag_code)
    g.entry_count += 1
    return 0


cdef int64_t tag_code(const uint8_t* props, Py_ssize_t length) except? -1:
    """MessageEncoder.tag_code of _scan._tags_of(props): the value of the last ``TAGS`` entry that is
    not empty, decoded with "replace" (so never a lone surrogate), Java-hashed; 0 without one."""
    cdef Py_ssize_t start = 0, end, found_length = 0, text_length
    cdef const uint8_t* found = NULL
    cdef const uint8_t* stop
    cdef const char* text
    while start < length:
        stop = <const uint8_t*>memchr(props + start, 2, length - start)
        end = length if stop == NULL else stop - props
        if end - start > 5 and same_bytes(props + start, <const uint8_t*>b"TAGS\x01", 5):
            found, found_length = props + start + 5, end - start - 5
        start = end + 1
    if found == NULL:
        return 0
    if valid_utf8(found, found_length):
        return java_hash_utf8(found, found_length)
    # Each ill-formed part becomes U+FFFD, as Python's decoder decides; the result is valid UTF-8.
    decoded = PyUnicode_DecodeUTF8(<const char*>found, found_length, "replace")
    text = PyUnicode_AsUTF8AndSize(decoded, &text_length)
    return java_hash_utf8(<const uint8_t*>text, text_length)


cdef list runs_of(Table* t):
    """[(topic bytes, queue id, [(first queue offset, entries bytes, physical end), ...]), ...]."""
    cdef Group* g
    cdef Py_ssize_t index, r, stop
    out = []
    for index in range(t.count):
        g = &t.groups[index]
        runs = []
        for r in range(g.run_count):
            stop = g.runs[r + 1].first_entry if r + 1 < g.run_count else g.entry_count
            runs.append((g.runs[r].first_offset,
                         PyBytes_FromStringAndSize(<const char*>g.entries + g.runs[r].first_entry * CQ_ENTRY,
                                                   (stop - g.runs[r].first_entry) * CQ_ENTRY),
                         g.runs[r].physical_end))
        out.append((PyBytes_FromStringAndSize(<const char*>g.topic, g.topic_length), g.queue_id, runs))
    return out


def replay_runs(const uint8_t[::1] buf, Py_ssize_t position, Py_ssize_t end, int64_t base):
    """The records from ``position`` while it is below ``end`` (``base``: the physical offset of the
    buffer's byte 0) as consume queue runs: (runs as :func:`runs_of` gives them, stop position,
    whether a blank record stops it, records walked, store time of the last one (0 for none))."""
    cdef const uint8_t* p = &buf[0] if buf.shape[0] else NULL
    cdef Py_ssize_t n = buf.shape[0], count = 0, index
    cdef int64_t last_ts = 0
    cdef RecordSpan r
    cdef bint blank = False
    cdef Group* g
    cdef Table t
    if position < 0:
        raise ValueError(f"position {position} is before the buffer")
    memset(&t, 0, sizeof(Table))
    try:
        t.groups = <Group*>grown(NULL, FIRST_SLOTS * sizeof(Group))
        t.capacity = FIRST_SLOTS
        rehash(&t, FIRST_SLOTS)
        while position < end:
            if n - position < 8:
                break
            if be32(p + position + 4) == MAGIC_BLANK:
                blank = True
                break
            # _scan.routing_records' conditions: a V1 record within the buffer, its lengths agreeing.
            if n - position < FIXED_OVERHEAD or not check_record(p, position, n, False, False, 0, &r):
                break
            __builtin_prefetch(p + r.end)  # the next header, loaded while this record is handled
            if (r.sys_flag & TX_MASK) != TX_PREPARED and (r.sys_flag & TX_MASK) != TX_ROLLBACK:
                g = find_group(&t, p + r.topic_at + 1, p[r.topic_at], <int32_t>be32(p + position + QUEUE_ID_AT))
                add_entry(g, be64(p + position + QUEUE_OFFSET_AT), base + position, <int32_t>(r.end - position),
                          tag_code(p + r.props_at + 2, r.end - r.props_at - 2))
            count += 1
            last_ts = r.store_timestamp_ms
            position = r.end
        return runs_of(&t), position, blank, count, last_ts
    finally:
        for index in range(t.count):
            PyMem_Free(t.groups[index].entries)
            PyMem_Free(t.groups[index].runs)
        PyMem_Free(t.groups)
        PyMem_Free(t.slots)
