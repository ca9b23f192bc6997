# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Placing and stamping a batch inside the append lock, in C: mqstore.log.stamp's place, queue_ranges and
stamp (the reference), with the same results; tests/property/test_codec_stamp.py compares the two.

The per-record work under the lock was Python's: a loop per record to place it, a struct pack per
stamped field, a tuple per entry and another loop in the dispatcher to group the entries per queue.
Here one pass stamps the records and the next writes each queue's consume queue entries as one bytes
object. The entries (AppendResults.entries) are :class:`Entries`, int64 columns that index and iterate as the
reference's list of tuples (and compare equal to it), so a batch makes no Python object per record here; the
AppendResponse (_responses) and the timer's note (_records.timer_note_physicals) read the columns.

Thread-safety: pure functions over the caller's buffer, called under the commit log's lock.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

from mqstore.codec._wire cimport put_be32, put_be64

# mqstore.format.record and cq_unit (checked against them by mqstore.codec at import).
cdef enum:
    QUEUE_OFFSET_AT = 20
    PHYSICAL_OFFSET_AT = 28
    SYS_FLAG_HOST_BYTE_AT = 39
    HOSTS_V6 = 0x30
    LAYOUT_SHIFT = 4
    BLANK_SIZE = 8
    TX_MASK = 12
    TX_PREPARED = 4
    TX_ROLLBACK = 12
    CQ_ENTRY = 20
    MAX_QUEUE_ID = 65535
cdef Py_ssize_t STORE_TIMESTAMP_AT[4]
STORE_TIMESTAMP_AT[:] = [56, 68, 56, 68]
LAYOUT = dict(queue_offset_at=QUEUE_OFFSET_AT, physical_offset_at=PHYSICAL_OFFSET_AT,
              sys_flag_host_byte_at=SYS_FLAG_HOST_BYTE_AT, hosts_v6=HOSTS_V6, layout_shift=LAYOUT_SHIFT,
              blank_size=BLANK_SIZE, tx_mask=TX_MASK, tx_prepared=TX_PREPARED, tx_rollback=TX_ROLLBACK,
              cq_entry=CQ_ENTRY, store_timestamp_at=tuple(STORE_TIMESTAMP_AT))


cdef class Entries:
    """A stamped batch's entries: per record (physical offset, size, queue id, queue offset, tag code, sys flag),
    held as int64 columns (_stamp.pxd); ``len``, indexing (negative too, and slices: a list), iteration and
    ``==`` as the list of tuples mqstore.log.stamp.stamp gives. Immutable once stamp made it."""

    def __dealloc__(self):
        PyMem_Free(self.cells)

    def __len__(self):
        return self.count

    cdef tuple _entry(self, Py_ssize_t index):
        cdef int64_t* c = self.cells + index * ENTRY_FIELDS
        return (c[0], c[1], c[2], c[3], c[4], c[5])

    def __getitem__(self, index):
        cdef Py_ssize_t i
        if isinstance(index, slice):
            return [self._entry(i) for i in range(*index.indices(self.count))]
        i = index
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError("entry index out of range")
        return self._entry(i)

    def __iter__(self):
        cdef Py_ssize_t i
        for i in range(self.count):
            yield self._entry(i)

    def __eq__(self, other):
        if isinstance(other, (Entries, list)):
            return list(self) == list(other)
        return NotImplemented

    def __ne__(self, other):
        if isinstance(other, (Entries, list)):
            return list(self) != list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"Entries({list(self)!r})"


cdef Entries _new_entries(Py_ssize_t count):
    cdef Entries entries = Entries.__new__(Entries)
    entries.cells = <int64_t*>PyMem_Malloc((count if count > 0 else 1) * ENTRY_FIELDS * sizeof(int64_t))
    if entries.cells == NULL:
        raise MemoryError()
    entries.count = 0  # records stamped so far: the columns past it are not written yet
    return entries


def place(list sizes, int64_t written_offset, int64_t segment_size):
    """mqstore.log.stamp.place: (chunks, log end)."""
    cdef int64_t pos = written_offset, room, size
    cdef Py_ssize_t i, buf_from = 0, buf_at = 0
    cdef int64_t phys_from = pos
    if segment_size <= BLANK_SIZE:
        raise ValueError(f"segment size {segment_size} leaves no room for a record")
    chunks = []
    for i in range(len(sizes)):
        size = sizes[i]
        room = segment_size - pos % segment_size
        if size + BLANK_SIZE > room:
            if buf_at > buf_from:
                chunks.append((buf_from, phys_from, buf_at, buf_at - buf_from))
            pos += room
            buf_from, phys_from = buf_at, pos
        buf_at += size
        pos += size
    if buf_at > buf_from:
        chunks.append((buf_from, phys_from, buf_at, buf_at - buf_from))
    return chunks, pos


cdef struct Queue:
    int64_t next_offset
    int64_t first
    Py_ssize_t count     # entries of the batch in this queue
    Py_ssize_t filled    # written into its run so far
    uint8_t* run         # the run's bytes (inside the bytes object in ``runs``)
    int64_t end          # physical end of its last entry
    bint known           # given in first_offsets


cdef inline bint _takes_queue_offset(int32_t flag) noexcept nogil:
    return (flag & TX_MASK) != TX_PREPARED and (flag & TX_MASK) != TX_ROLLBACK


def queue_ranges(list queue_ids, list sys_flags, dict next_offsets, str topic):
    """mqstore.log.stamp.queue_ranges: {queue id: (first, end)} in the order the queue ids first appear."""
    cdef Py_ssize_t n = len(queue_ids), i, slots = 0, used = 0
    cdef int64_t qid
    cdef int32_t* counts = NULL
    cdef int32_t* order = NULL
    if len(sys_flags) != n:
        raise ValueError("queue ids and sys flags differ in length")
    for i in range(n):
        if _takes_queue_offset(<int32_t>sys_flags[i]):
            qid = queue_ids[i]
            if not 0 <= qid <= MAX_QUEUE_ID:  # as stamp refuses it
                raise ValueError(f"queue id {qid} is outside [0, {MAX_QUEUE_ID}]")
            slots = max(slots, qid + 1)
    counts = <int32_t*>calloc(slots + 1, sizeof(int32_t))
    order = <int32_t*>malloc((slots + 1) * sizeof(int32_t))
    if counts == NULL or order == NULL:
        free(counts)
        free(order)
        raise MemoryError()
    try:
        for i in range(n):
            if not _takes_queue_offset(<int32_t>sys_flags[i]):
                continue
            qid = queue_ids[i]
            if counts[qid] == 0:
                order[used] = <int32_t>qid
                used += 1
            counts[qid] += 1
        ranges = {}
        for i in range(used):
            key = order[i]
            first = next_offsets.get((topic, key), 0)
            ranges[key] = (first, first + counts[order[i]])
        return ranges
    finally:
        free(counts)
        free(order)


def stamp(bytearray buf, list chunks, list sizes, list queue_ids, list tag_codes, list sys_flags,
          dict first_offsets, int64_t now_ms):
    """mqstore.log.stamp.stamp: (entries, runs)."""
    cdef Py_ssize_t n = len(sizes), index = 0, at, buf_to, buf_from, limit = PyByteArray_GET_SIZE(buf), size
    cdef Py_ssize_t queue_slots = 0
    cdef int64_t phys_from, phys, qoff
    cdef int32_t qid, flag
    cdef uint8_t* base = <uint8_t*>PyByteArray_AS_STRING(buf)
    cdef uint8_t* rec
    cdef Queue* queues = NULL
    cdef Queue* q
    cdef int64_t* physicals = NULL
    cdef int64_t* cell
    cdef Entries entries
    if not (len(queue_ids) == len(tag_codes) == len(sys_flags) == n):
        raise ValueError("sizes, queue ids, tag codes and sys flags differ in length")
    for key in first_offsets:
        if not 0 <= key <= MAX_QUEUE_ID:
            raise ValueError(f"queue id {key} is outside [0, {MAX_QUEUE_ID}]")
        queue_slots = max(queue_slots, key + 1)
    queues = <Queue*>calloc(queue_slots + 1, sizeof(Queue))
    physicals = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    if queues == NULL or physicals == NULL:
        free(queues)
        free(physicals)
        raise MemoryError()
    try:
        for key, value in first_offsets.items():
            queues[<Py_ssize_t>key].next_offset = value
            queues[<Py_ssize_t>key].first = value
            queues[<Py_ssize_t>key].known = True
        entries = _new_entries(n)
        # Pass 1: queue offsets, physical offsets and the time into the records; the entries.
        for chunk in chunks:
            buf_from, phys_from, buf_to = chunk[0], chunk[1], chunk[2]
            if buf_from < 0 or buf_to > limit:
                raise ValueError(f"chunk {chunk} is outside the batch's {limit} bytes")
            at = buf_from
            while at < buf_to:
                if index >= n:
                    raise ValueError(f"the chunks hold more records than the batch's {n}")
                size, qid, flag = sizes[index], queue_ids[index], sys_flags[index]
                if size <= 0 or at + size > buf_to:
                    raise ValueError(f"record {index} of {size} bytes at {at} crosses its chunk's end {buf_to}")
                phys = phys_from + (at - buf_from)
                qoff = 0
                if _takes_queue_offset(flag):
                    if not 0 <= qid < queue_slots or not queues[qid].known:
                        raise KeyError(qid)
                    q = &queues[qid]
                    qoff = q.next_offset
                    q.next_offset += 1
                    q.count += 1
                rec = base + at
                put_be64(rec + QUEUE_OFFSET_AT, <uint64_t>qoff)
                put_be64(rec + PHYSICAL_OFFSET_AT, <uint64_t>phys)
                put_be64(rec + STORE_TIMESTAMP_AT[(rec[SYS_FLAG_HOST_BYTE_AT] & HOSTS_V6) >> LAYOUT_SHIFT],
                         <uint64_t>now_ms)
                physicals[index] = phys
                cell = entries.cells + index * ENTRY_FIELDS
                cell[0] = phys
                cell[1] = size
                cell[2] = qid
                cell[3] = qoff
                cell[4] = tag_codes[index]
                cell[5] = flag
                entries.count = index + 1
                at += size
                index += 1
        if index != n:
            raise ValueError(f"the chunks place {index} records, the batch has {n}")
        # Pass 2: each queue's consume queue entries, in batch order, as one bytes object.
        runs = {}
        for index in range(n):
            flag, qid = sys_flags[index], queue_ids[index]
            if not _takes_queue_offset(flag):
                continue
            q = &queues[qid]
            if q.run == NULL:
                data = PyBytes_FromStringAndSize(NULL, q.count * CQ_ENTRY)
                q.run = <uint8_t*>PyBytes_AS_STRING(data)
                runs[qid] = (q.first, data, 0)
            rec = q.run + q.filled * CQ_ENTRY
            size = sizes[index]
            put_be64(rec, <uint64_t>physicals[index])
            put_be32(rec + 8, <uint32_t>size)
            put_be64(rec + 12, <uint64_t><int64_t>tag_codes[index])
            q.filled += 1
            q.end = physicals[index] + size
        for qid_key, run in runs.items():
            runs[qid_key] = (run[0], run[1], queues[<Py_ssize_t>qid_key].end)
        return entries, runs
    finally:
        free(queues)
        free(physicals)
