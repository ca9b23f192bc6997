# cython: language_level=3
"""What _stamp.pyx's stamp gives the append path's other compiled code (_responses' AppendResponse, _records'
timer note): a stamped batch's entries as int64 columns."""

from libc.stdint cimport int64_t

cdef enum:
    ENTRY_FIELDS = 6  # physical offset, size, queue id, queue offset, tag code, sys flag


cdef class Entries:
    cdef int64_t* cells     # ENTRY_FIELDS a record, in batch order
    cdef Py_ssize_t count   # records

    cdef tuple _entry(self, Py_ssize_t index)
