# cython: language_level=3
"""What _request.pyx parses an AppendRequest into, for _records.pyx to encode: pointers into the
request's bytes, which WireMessages keeps alive."""

from libc.stdint cimport int32_t, int64_t, uint8_t


cdef struct Span:
    const uint8_t* ptr
    Py_ssize_t length


cdef struct Prop:
    Span name
    Span value
    Py_ssize_t order  # position among the message's entries: the last of a name wins


cdef struct Msg:
    Span body
    Span tags
    Span shard
    int32_t flag
    int64_t born_ts
    bint has_qid
    int32_t qid
    Py_ssize_t keys_from, keys_to    # WireMessages.keys[keys_from:keys_to], in request order
    Py_ssize_t props_from, props_to  # WireMessages.props[props_from:props_to], by name, one per name
    int64_t deliver_at_ms            # MessageInput.deliver_at_ms (0: none; negative as sent)
    int64_t delay_ms                 # MessageInput.delay_ms (0: none; negative as sent)
    bint timer_marked                # a delivery field, or a property named TIMER_* or REAL_TOPIC/REAL_QID
    bint own_born                    # born_host/born_port are this message's (InternalMessage.born_host),
    uint8_t born_host[4]             # not the request's peer (WireMessages.born_host)
    int32_t born_port


cdef class WireMessages:
    cdef bytes raw
    cdef Msg* msgs
    cdef Py_ssize_t count, msgs_capacity
    cdef Span* keys
    cdef Py_ssize_t keys_count, keys_capacity
    cdef Prop* props
    cdef Py_ssize_t props_count, props_capacity
    cdef readonly str topic
    cdef readonly int32_t replication  # AppendRequest.replication (the ReplicationMode number; 0 unset)
    cdef readonly Py_ssize_t timer_marks  # messages with timer_marked: the timer's (mqstore.timer.scheduling)
    cdef object extra  # bytes the spans of a timer batch point into besides raw (_records.timer_batch)
    cdef uint8_t born_host[4]
    cdef int32_t born_port

    cdef Msg* new_message(self) except NULL
    cdef int add_key(self, Span key) except -1
    cdef int add_prop(self, Span name, Span value, Py_ssize_t order) except -1


cdef object text_of(Span s)
cdef Py_ssize_t one_per_name(WireMessages wire, Py_ssize_t first) noexcept
