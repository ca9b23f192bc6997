# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""AppendRequest wire bytes to WireMessages: the messages as pointers into the bytes, with no Python
object per field (the first step of Append's compiled codec; see mqstore.codec).

:func:`parse_request` walks the bytes once and checks them as protobuf does (upb, the parser of the
Python protobuf package): varints, tags, lengths, groups, nesting depth, the UTF-8 of every string
field; unknown fields are skipped, the last of a repeated scalar wins, a map entry that holds a field
other than key and value is dropped (upb keeps it among the unknown fields). It returns None where
protobuf could refuse the bytes: the caller then parses them with protobuf, which either accepts them
or says why in its own words, so a malformed request gets protobuf's own error either way. A message
with a delivery time (MessageInput.deliver_at_ms or delay_ms not 0) or a property the timer reads or
sets (a name starting TIMER_, REAL_TOPIC, REAL_QID) is *timer-marked* (``timer_marks`` counts them):
the Scheduler (mqstore.timer.scheduling) then makes the timer topic's records of the batch
(_records.timer_batch) or, where that declines, converts it (:meth:`WireMessages.delivery_fields`).

User properties are kept in order of name (a protobuf map has no order; mqstore_rpc.convert's
messages_in sorts them the same way), the last entry of a name winning as in protobuf.

Thread-safety: a WireMessages belongs to one request and is not shared.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, qsort, realloc
from libc.string cimport memcmp, memcpy, memset

from mqstore.codec._wire cimport (WT_LEN, WT_VARINT, read_length, read_varint, read_varint32, skip_field,
                                  valid_utf8)

cdef enum:
    MAX_DEPTH = 100  # upb's limit on nested messages and groups


cdef int grow(void** array, Py_ssize_t* capacity, Py_ssize_t needed, size_t item) except -1:
    cdef void* moved
    if needed <= capacity[0]:
        return 0
    capacity_new = max(needed, 2 * capacity[0], 8)
    moved = realloc(array[0], capacity_new * item)
    if moved == NULL:
        raise MemoryError()
    array[0] = moved
    capacity[0] = capacity_new
    return 0


cdef class WireMessages:
    """The messages of one AppendRequest as pointers into its bytes (kept alive here). ``topic`` is
    the request's topic; ``len()`` the number of messages; ``messages`` is the object itself, so a
    caller reads it like the protobuf request. Its fields are declared in _request.pxd."""

    def __cinit__(self):
        self.born_host[0] = 127
        self.born_host[3] = 1

    def __dealloc__(self):
        free(self.msgs)
        free(self.keys)
        free(self.props)

    def __len__(self):
        return self.count

    @property
    def messages(self):
        return self

    def set_peer(self, bytes host, int port):
        """BORNHOST of every message: the producer's IPv4 address (4 bytes) and port."""
        if len(host) != 4:
            raise ValueError(f"born host must be 4 bytes (IPv4), not {len(host)}")
        memcpy(self.born_host, PyBytes_AS_STRING(host), 4)
        self.born_port = port

    def to_messages(self, message):
        """The messages as ``message`` (mqstore.model.MessageIn, given: the codec imports no module above
        it, and the model imports mqstore.format), exactly as mqstore_rpc.convert.messages_in builds them
        from the protobuf request (convert.internal_messages_in from an InternalAppendBatchesRequest's
        batch): for the reference encoder, when the compiled one refuses a message."""
        cdef Msg* m
        cdef Py_ssize_t i, k
        peer_host, peer_port = PyBytes_FromStringAndSize(<const char*>self.born_host, 4), self.born_port
        out = []
        for i in range(self.count):
            m = &self.msgs[i]
            host, port = ((PyBytes_FromStringAndSize(<const char*>m.born_host, 4), m.born_port) if m.own_born
                          else (peer_host, peer_port))
            keys = tuple(text_of(self.keys[k]) for k in range(m.keys_from, m.keys_to))
            props = {text_of(self.props[k].name): text_of(self.props[k].value)
                     for k in range(m.props_from, m.props_to)}
            out.append(message(_bytes(m.body), text_of(m.tags), keys, props, m.flag, m.born_ts,
                               m.qid if m.has_qid else None, text_of(m.shard), host, port))
        return out

    def delivery_fields(self):
        """(deliver_at_ms, delay_ms) of each message, as sent (0: none)."""
        return [(self.msgs[i].deliver_at_ms, self.msgs[i].delay_ms) for i in range(self.count)]

    cdef Msg* new_message(self) except NULL:
        grow(<void**>&self.msgs, &self.msgs_capacity, self.count + 1, sizeof(Msg))
        cdef Msg* m = &self.msgs[self.count]
        memset(m, 0, sizeof(Msg))
        m.keys_from = m.keys_to = self.keys_count
        m.props_from = m.props_to = self.props_count
        return m

    cdef int add_key(self, Span key) except -1:
        grow(<void**>&self.keys, &self.keys_capacity, self.keys_count + 1, sizeof(Span))
        self.keys[self.keys_count] = key
        self.keys_count += 1
        return 0

    cdef int add_prop(self, Span name, Span value, Py_ssize_t order) except -1:
        grow(<void**>&self.props, &self.props_capacity, self.props_count + 1, sizeof(Prop))
        self.props[self.props_count].name = name
        self.props[self.props_count].value = value
        self.props[self.props_count].order = order
        self.props_count += 1
        return 0


cdef object text_of(Span s):
    return PyUnicode_DecodeUTF8(<const char*>s.ptr, s.length, NULL)


cdef object _bytes(Span s):
    return PyBytes_FromStringAndSize(<const char*>s.ptr, s.length)


# ---- parsing ---------------------------------------------------------------------------------------

def parse_request(bytes raw):
    """WireMessages of AppendRequest bytes, or None if protobuf might refuse them (see the module doc)."""
    cdef WireMessages wire = WireMessages.__new__(WireMessages)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(raw)
    cdef Py_ssize_t at = 0, length
    cdef uint32_t tag
    cdef uint64_t replication
    cdef Span topic
    topic.ptr = p
    topic.length = 0
    wire.raw = raw
    while at < end:
        at = read_varint32(p, at, end, &tag)
        if at < 0 or tag >> 3 == 0:
            return None
        if tag & 7 == WT_LEN and (tag >> 3 == 1 or tag >> 3 == 2):
            at = read_length(p, at, end, &length)
            if at < 0:
                return None
            if tag >> 3 == 1:
                if not valid_utf8(p + at, length):
                    return None
                topic.ptr, topic.length = p + at, length
            elif parse_message(wire, p, at, at + length, MAX_DEPTH - 1) < 0:
                return None
            at += length
        elif tag == (3 << 3 | WT_VARINT):  # AppendRequest.replication (an enum: the last one wins)
            at = read_varint(p, at, end, &replication)
            if at < 0:
                return None
            wire.replication = <int32_t>replication
        else:
            at = skip_field(p, at, end, tag, MAX_DEPTH)
            if at < 0:
                return None
    wire.topic = text_of(topic)
    return wire


cdef int parse_message(WireMessages wire, const uint8_t* p, Py_ssize_t at, Py_ssize_t end, int depth) except -2:
    """One MessageInput (p[at:end]) into wire's next Msg; -1 if the bytes are not valid. ``depth``: how many
    nested groups or messages may still open inside it (MAX_DEPTH less the messages around it)."""
    cdef Msg* m = wire.new_message()
    cdef Py_ssize_t length, entries = 0
    cdef uint32_t tag, field
    cdef uint64_t value, deliver = 0, delay = 0
    cdef Span span
    while at < end:
        at = read_varint32(p, at, end, &tag)
        field = tag >> 3
        if at < 0 or field == 0:
            return -1
        if tag & 7 == WT_LEN and (field <= 4 or field == 8):
            at = read_length(p, at, end, &length)
            if at < 0:
                return -1
            span.ptr, span.length = p + at, length
            if field == 4:
                if parse_entry(wire, p, at, at + length, entries, depth - 1) < 0:
                    return -1
                entries += 1
            elif field != 1 and not valid_utf8(span.ptr, length):
                return -1
            elif field == 1:
                m.body = span
            elif field == 2:
                m.tags = span
            elif field == 3:
                wire.add_key(span)
            else:
                m.shard = span
            at += length
        elif tag & 7 == WT_VARINT and (field == 9 or field == 10):
            # deliver_at_ms, delay_ms (0: none; the last one wins, as in protobuf): a delayed message
            # (mqstore.timer), timer-marked below.
            at = read_varint(p, at, end, &value)
            if at < 0:
                return -1
            if field == 9:
                deliver = value
            else:
                delay = value
        elif tag & 7 == WT_VARINT and 5 <= field <= 7:
            at = read_varint(p, at, end, &value)
            if at < 0:
                return -1
            if field == 5:
                m.flag = <int32_t>value
            elif field == 6:
                m.born_ts = <int64_t>value
            else:
                m.has_qid, m.qid = True, <int32_t>value
        else:
            at = skip_field(p, at, end, tag, depth)
            if at < 0:
                return -1
    m.deliver_at_ms, m.delay_ms = <int64_t>deliver, <int64_t>delay
    m.keys_to = wire.keys_count
    m.props_to = one_per_name(wire, m.props_from)
    m.timer_marked = deliver != 0 or delay != 0 or _timer_named(wire, m)
    wire.timer_marks += m.timer_marked
    wire.count += 1
    return 0


cdef bint _timer_named(WireMessages wire, const Msg* m) noexcept:
    """A property the timer reads or sets: TIMER_* (mqstore.timer.messages), REAL_TOPIC, REAL_QID."""
    cdef Py_ssize_t k
    cdef Span name
    for k in range(m.props_from, m.props_to):
        name = wire.props[k].name
        if ((name.length >= 6 and memcmp(name.ptr, b"TIMER_", 6) == 0)
                or (name.length == 10 and memcmp(name.ptr, b"REAL_TOPIC", 10) == 0)
                or (name.length == 8 and memcmp(name.ptr, b"REAL_QID", 8) == 0)):
            return True
    return False


cdef int parse_entry(WireMessages wire, const uint8_t* p, Py_ssize_t at, Py_ssize_t end,
                     Py_ssize_t order, int depth) except -2:
    """One properties map entry; kept unless it holds a field other than key and value (upb then
    keeps the whole entry among the unknown fields instead of in the map)."""
    cdef Span name, value
    cdef Py_ssize_t length
    cdef uint32_t tag
    cdef bint unknown = False
    name.ptr = value.ptr = p + at
    name.length = value.length = 0
    while at < end:
        at = read_varint32(p, at, end, &tag)
        if at < 0 or tag >> 3 == 0:
            return -1
        if tag & 7 == WT_LEN and (tag >> 3 == 1 or tag >> 3 == 2):
            at = read_length(p, at, end, &length)
            if at < 0 or not valid_utf8(p + at, length):
                return -1
            if tag >> 3 == 1:
                name.ptr, name.length = p + at, length
            else:
                value.ptr, value.length = p + at, length
            at += length
        else:
            at = skip_field(p, at, end, tag, depth)
            if at < 0:
                return -1
            unknown = True
    if not unknown:
        wire.add_prop(name, value, order)
    return 0


cdef int _compare_props(const void* a, const void* b) noexcept nogil:
    cdef const Prop* x = <const Prop*>a
    cdef const Prop* y = <const Prop*>b
    cdef int found = memcmp(x.name.ptr, y.name.ptr, min(x.name.length, y.name.length))
    if found:
        return found
    if x.name.length != y.name.length:
        return -1 if x.name.length < y.name.length else 1
    return -1 if x.order < y.order else (1 if x.order > y.order else 0)


cdef Py_ssize_t one_per_name(WireMessages wire, Py_ssize_t first) noexcept:
    """Sort the message's entries (props[first:]) by name (UTF-8 byte order is code point order, as
    Python sorts str) and keep the last entry of each name; returns the new end."""
    cdef Py_ssize_t i, out = first, end = wire.props_count
    cdef Prop* props = wire.props
    if end - first < 2:
        return end
    qsort(&props[first], end - first, sizeof(Prop), _compare_props)
    for i in range(first, end):
        if (i + 1 < end and props[i].name.length == props[i + 1].name.length
                and memcmp(props[i].name.ptr, props[i + 1].name.ptr, props[i].name.length) == 0):
            continue
        props[out] = props[i]
        out += 1
    wire.props_count = out
    return out




# ---- InternalAppendBatchesRequest (CommitLogInternal.AppendBatches and AppendBatchesStream) -------------

cdef class InternalBatches:
    """An InternalAppendBatchesRequest as parsed: ``writer`` and ``batches``, one WireMessages per batch
    (its ``topic``; ``messages`` is itself), all pointing into the request's bytes."""

    cdef readonly str writer
    cdef readonly list batches


def parse_internal_batches(bytes raw):
    """InternalBatches of InternalAppendBatchesRequest bytes, or None: where protobuf might refuse the
    bytes (as :func:`parse_request`), and where the reference (protobuf, convert.internal_messages_in)
    decides because the compiled path does not carry it: a message with a transaction type, a prepared
    offset, a reconsume count or a delivery field (MessageInput.delay_ms, deliver_at_ms: the reference
    refuses those at this door), an InternalMessage whose ``message`` comes more than once (protobuf merges
    them), a born host other than a plain ``a.b.c.d:port``. What it returns is then exactly a batch of
    NOT_TYPE messages, each with its own born host or none (the peer's: WireMessages.set_peer); a message
    with a timer property (the gateway's delayed sends: TIMER_DELIVER_MS) is timer-marked as by
    :func:`parse_request`, so the Scheduler makes its timer records (_records.timer_batch) or converts it
    (WireMessages.to_messages: the MessageIn convert.internal_messages_in makes)."""
    cdef InternalBatches parsed = InternalBatches.__new__(InternalBatches)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(raw)
    cdef Py_ssize_t at = 0, length
    cdef uint32_t tag
    cdef Span writer
    writer.ptr = p
    writer.length = 0
    batches = []
    while at < end:
        at = read_varint32(p, at, end, &tag)
        if at < 0 or tag >> 3 == 0:
            return None
        if tag == (1 << 3 | WT_LEN) or tag == (2 << 3 | WT_LEN):
            at = read_length(p, at, end, &length)
            if at < 0:
                return None
            if tag >> 3 == 1:
                if not valid_utf8(p + at, length):
                    return None
                writer.ptr, writer.length = p + at, length
            else:
                batch = _parse_batch(raw, p, at, at + length)
                if batch is None:
                    return None
                batches.append(batch)
            at += length
        else:
            at = skip_field(p, at, end, tag, MAX_DEPTH)
            if at < 0:
                return None
    parsed.writer = text_of(writer)
    parsed.batches = batches
    return parsed


cdef object _parse_batch(bytes raw, const uint8_t* p, Py_ssize_t at, Py_ssize_t end):
    """One InternalAppendBatch (p[at:end]) as a WireMessages, or None (see parse_internal_batches)."""
    cdef WireMessages wire = WireMessages.__new__(WireMessages)
    cdef Py_ssize_t length
    cdef uint32_t tag
    cdef Span topic
    topic.ptr = p
    topic.length = 0
    wire.raw = raw
    while at < end:
        at = read_varint32(p, at, end, &tag)
        if at < 0 or tag >> 3 == 0:
            return None
        if tag == (1 << 3 | WT_LEN) or tag == (2 << 3 | WT_LEN):
            at = read_length(p, at, end, &length)
            if at < 0:
                return None
            if tag >> 3 == 1:
                if not valid_utf8(p + at, length):
                    return None
                topic.ptr, topic.length = p + at, length
            elif _parse_internal_message(wire, p, at, at + length) < 0:
                return None
            at += length
        else:
            at = skip_field(p, at, end, tag, MAX_DEPTH - 1)
            if at < 0:
                return None
    wire.topic = text_of(topic)
    return wire


cdef int _parse_internal_message(WireMessages wire, const uint8_t* p, Py_ssize_t at, Py_ssize_t end) except -2:
    """One InternalMessage (p[at:end]) into wire's next Msg; -1 if not valid or not plain."""
    cdef Py_ssize_t length, message_at = at, message_end = at
    cdef int messages = 0
    cdef uint32_t tag, field
    cdef uint64_t value, others = 0
    cdef Span born
    cdef Msg* m
    born.ptr = p
    born.length = 0
    while at < end:
        at = read_varint32(p, at, end, &tag)
        field = tag >> 3
        if at < 0 or field == 0:
            return -1
        if tag & 7 == WT_LEN and (field == 1 or field == 4):
            at = read_length(p, at, end, &length)
            if at < 0:
                return -1
            if field == 1:
                messages += 1
                message_at, message_end = at, at + length
            elif not valid_utf8(p + at, length):
                return -1
            else:
                born.ptr, born.length = p + at, length
            at += length
        elif tag & 7 == WT_VARINT and (field == 2 or field == 3 or field == 5):
            # transaction_type, prepared_transaction_offset, reconsume_times: the reference's (not 0)
            at = read_varint(p, at, end, &value)
            if at < 0:
                return -1
            others |= value
        else:
            at = skip_field(p, at, end, tag, MAX_DEPTH - 2)
            if at < 0:
                return -1
    if messages > 1 or others != 0:
        return -1
    if parse_message(wire, p, message_at, message_end, MAX_DEPTH - 3) < 0:
        return -1
    m = &wire.msgs[wire.count - 1]
    if m.deliver_at_ms != 0 or m.delay_ms != 0:
        return -1  # the reference's InvalidArgument (delivery fields are CommitLog.Append's)
    if born.length and not _host_port(born, m):
        return -1
    return 0


cdef bint _host_port(Span text, Msg* m) noexcept:
    """``a.b.c.d:port`` in the plain form only (decimal, no leading zeros, octets <= 255, port <= 65535)
    into m's born host, as convert.host_bytes reads it; False for anything else (the reference decides)."""
    cdef Py_ssize_t at = 0, digits
    cdef int part = 0
    cdef uint32_t value
    cdef uint8_t c
    while part < 5:
        value, digits = 0, 0
        while at < text.length and 48 <= text.ptr[at] <= 57 and digits < 6:  # '0'..'9'
            if digits == 1 and value == 0:
                return False  # a leading zero (inet_aton reads it as octal)
            value = value * 10 + (text.ptr[at] - 48)
            digits += 1
            at += 1
        if digits == 0 or value > (255 if part < 4 else 65535):
            return False
        if part < 4:
            m.born_host[part] = <uint8_t>value
            if at >= text.length:
                return False
            c = text.ptr[at]
            if c != (46 if part < 3 else 58):  # '.', ':'
                return False
            at += 1
        else:
            m.born_port = <int32_t>value
        part += 1
    if at != text.length:
        return False
    m.own_born = True
    return True
