"""Protobuf wire bytes written by hand, valid or not, and Hypothesis strategies for AppendRequests.

protobuf's own serializer cannot write what a broken or hostile client sends (invalid UTF-8 in a string
field, overlong varints, unknown fields and groups, wrong wire types, truncated bytes), so the codec
tests build their requests here: a request is a list of fields, a field is (number, wire type,
payload), and strategies draw them from small alphabets so that the interesting cases (reserved
characters, bad keys, field/property conflicts, limits) come up often.
"""

from __future__ import annotations

from hypothesis import strategies as st

VARINT, FIXED64, LEN, SGROUP, EGROUP, FIXED32 = 0, 1, 2, 3, 4, 5
TOPICS = ("t", "c", "x")  # tests create "t" (NORMAL) and "c" (COMPACTION); "x" does not exist


def varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a varint (negative: two's complement, 10 bytes); ``pad`` extra continuation bytes
    make it overlong (still the same value for a parser that accepts them)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte | 0x80 if pad else byte)
            break
    for i in range(pad):
        out.append(0x80 if i < pad - 1 else 0x00)
    return bytes(out)


def tag(number: int, wire_type: int, pad: int = 0) -> bytes:
    return varint((number << 3) | wire_type, pad)


def field(number: int, wire_type: int, payload) -> bytes:
    """One field: a LEN payload is bytes (its length is prefixed), a VARINT payload an int, FIXED32/64
    bytes as they are, SGROUP a list of inner fields (bytes) closed by the matching EGROUP."""
    if wire_type == LEN:
        return tag(number, LEN) + varint(len(payload)) + payload
    if wire_type == VARINT:
        return tag(number, VARINT) + varint(payload)
    if wire_type == SGROUP:
        return tag(number, SGROUP) + b"".join(payload) + tag(number, EGROUP)
    return tag(number, wire_type) + payload


# ---- strategies ------------------------------------------------------------------------------------

_CHARS = st.sampled_from(["a", "b", "k", " ", "\t", "\n", "\x0b", "\x01", "\x02", "\x1c", "é", "中", "😀", "\x00"])
text = st.text(_CHARS, max_size=4)
names = st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "b", "", "TAG", "tags", "TIMER_DELAY_MS",
                                   "REAL_TOPIC"]), text)
keys_text = st.lists(st.sampled_from(["a", "b", "k", "", "a b", "é", "😀"]), max_size=3).map(" ".join)
# Mostly valid UTF-8; sometimes any bytes (invalid UTF-8 among them).
text_bytes = st.one_of(text.map(str.encode), text.map(str.encode), st.binary(max_size=4))
value_bytes = st.one_of(text_bytes, keys_text.map(str.encode),
                        st.sampled_from([b"a", b"b", b"a b", b"7F000001ABCD"]))
small_ints = st.one_of(st.integers(-3, 8), st.sampled_from([0, 1 << 31, (1 << 32) + 1, -(1 << 31), 1 << 40]),
                       st.integers(-(1 << 63), (1 << 64) - 1))


def unknown_fields(depth: int = 2) -> st.SearchStrategy[bytes]:
    numbers = st.sampled_from([9, 15, 16, 100, (1 << 29) - 1])
    plain = st.one_of(
        st.builds(field, numbers, st.just(VARINT), small_ints),
        st.builds(field, numbers, st.just(FIXED64), st.binary(min_size=8, max_size=8)),
        st.builds(field, numbers, st.just(FIXED32), st.binary(min_size=4, max_size=4)),
        st.builds(field, numbers, st.just(LEN), st.binary(max_size=6)),
    )
    if depth == 0:
        return plain
    return st.one_of(plain, st.builds(field, numbers, st.just(SGROUP), st.lists(unknown_fields(depth - 1), max_size=2)))


def known_field_wrong_type(numbers: list[int]) -> st.SearchStrategy[bytes]:
    """A known field number with a wire type it does not have: protobuf keeps it as an unknown field."""
    return st.builds(lambda n, wt, data: tag(n, wt) + data, st.sampled_from(numbers),
                     st.sampled_from([VARINT, FIXED32, FIXED64, LEN]), st.sampled_from(
                         [b"\x01", b"\x00\x00\x00\x00", b"\x00" * 8, b"\x00", b"\x02ab"]))


@st.composite
def property_entry(draw) -> bytes:
    parts = []
    if draw(st.booleans()) or draw(st.booleans()):
        parts.append(field(1, LEN, draw(names).encode("utf-8") if draw(st.booleans()) else draw(text_bytes)))
    if draw(st.booleans()) or draw(st.booleans()):
        parts.append(field(2, LEN, draw(value_bytes)))
    if draw(st.integers(0, 9)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), draw(_ENTRY_ODDITY))
    if draw(st.integers(0, 9)) == 0:
        parts.append(field(1, LEN, draw(text_bytes)))  # a second key: the last wins
    return b"".join(parts)


# Built once: a strategy built inside a composite is validated again at every draw (that was most of
# the generation time).
_ENTRY_ODDITY = st.one_of(unknown_fields(1), known_field_wrong_type([1, 2]))
_MESSAGE_FIELD = st.one_of(
    st.builds(field, st.just(2), st.just(LEN), st.one_of(value_bytes, text_bytes)),     # tags
    st.builds(field, st.just(3), st.just(LEN), st.one_of(value_bytes, text_bytes)),     # keys
    st.builds(field, st.just(4), st.just(LEN), property_entry()),                       # properties
    st.builds(field, st.just(5), st.just(VARINT), small_ints),                          # flag
    st.builds(field, st.just(6), st.just(VARINT), st.one_of(st.just(0), small_ints)),   # born_timestamp_ms
    st.builds(field, st.just(7), st.just(VARINT), small_ints),                          # queue_id
    st.builds(field, st.just(8), st.just(LEN), st.one_of(value_bytes, text_bytes)),     # sharding_key
    st.builds(field, st.just(1), st.just(LEN), st.binary(max_size=8)),                  # a second body
    st.builds(field, st.sampled_from([9, 10]), st.just(VARINT), small_ints),            # deliver_at_ms, delay_ms
    unknown_fields(),
    known_field_wrong_type([1, 2, 3, 4, 5, 6, 7, 8]),
)
_MESSAGE_FIELDS = st.lists(_MESSAGE_FIELD, max_size=7)
_TOPIC = st.one_of(st.sampled_from(TOPICS).map(str.encode), text_bytes)
_REQUEST_ODDITY = st.one_of(unknown_fields(), known_field_wrong_type([1, 2]))


@st.composite
def message_input(draw, big_properties: bool = False) -> bytes:
    """A MessageInput: usually a body, then any of the other fields, in any order, some repeated."""
    parts = []
    if draw(st.integers(0, 9)):
        size = draw(st.sampled_from([0, 1, 5, 40, 70, 200]))
        parts.append(field(1, LEN, bytes(i & 0xFF for i in range(size))))
    parts += draw(_MESSAGE_FIELDS)
    if big_properties:
        size = draw(st.sampled_from([3000, 5000, 16000, 33000]))
        parts.append(field(4, LEN, field(1, LEN, b"big") + field(2, LEN, b"v" * size)))
    return b"".join(draw(st.permutations(parts)))


_MESSAGE, _BIG_MESSAGE = message_input(), message_input(big_properties=True)


@st.composite
def append_request(draw, max_messages: int = 8) -> bytes:
    """AppendRequest bytes: a topic, messages, maybe unknown fields; then maybe damaged."""
    parts = []
    if draw(st.integers(0, 19)):
        parts.append(field(1, LEN, draw(_TOPIC)))
    message = _BIG_MESSAGE if draw(st.integers(0, 9)) == 0 else _MESSAGE
    parts += [field(2, LEN, draw(message)) for _ in range(draw(st.integers(0, max_messages)))]
    if draw(st.integers(0, 4)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), draw(_REQUEST_ODDITY))
    raw = b"".join(parts)
    return draw(damaged(raw)) if draw(st.integers(0, 5)) == 0 else raw


@st.composite
def damaged(draw, raw: bytes) -> bytes:
    """The bytes cut short, with one byte changed, with bytes inserted, or with a field appended that
    does not parse (an unclosed group, an end-group, wire type 6 or 7, field number 0, a long varint)."""
    at = draw(st.integers(0, len(raw)))
    how = draw(st.sampled_from(["cut", "flip", "insert", "append"]))
    if how == "cut":
        return raw[:at]
    if how == "flip" and raw:
        at = min(at, len(raw) - 1)
        return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
    if how == "insert":
        return raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    return raw + draw(st.sampled_from([
        tag(9, SGROUP), tag(9, EGROUP), tag(9, 6), tag(9, 7), b"\x00\x01", b"\x08" + b"\xff" * 10 + b"\x01",
        b"\x08" + b"\xff" * 9 + b"\x7f", tag(1, LEN, pad=4) + b"\x01a", tag(1, LEN, pad=5) + b"\x01a",
        b"\x0a\x85\x80\x80\x80\x00hello", b"\x0a\x85\x80\x80\x80\x80\x00hello", b"\xf8\xff\xff\xff\x0f\x00",
        b"\xf8\xff\xff\xff\x1f\x00"]))


# ---- InternalAppendBatchesRequest (CommitLogInternal.AppendBatches) ------------------------------------

_PLAIN_HOST = st.builds(lambda a, b, port: f"10.{a}.{b}.1:{port}".encode(), st.integers(0, 255), st.integers(0, 255),
                        st.integers(0, 65535))
_ODD_HOST = st.one_of(
    st.sampled_from(["1.2.3.4:5", "10.0.0.1:65535", "0.0.0.0:0", "255.255.255.255:1", "127.0.0.1:80",
                     # not the plain form: the reference reads them (or refuses them) its own way
                     "01.2.3.4:5", "1.2.3:4", "1.2.3.4.5:6", "[::1]:5", "1.2.3.4:65536", "1.2.3.4:-1", "a:b",
                     "1.2.3.4:+5", "256.1.1.1:1", "1.2.3.4: 5", "1.2.3.4:05", "1.2.3.4:", ":5", "1.2.3.4",
                     "0x7f.0.0.1:3", "1.2.3.4:1_0", "1.2.3.4:٣", "", "1.2.3.4:999999"]).map(str.encode),
    text_bytes)
_BORN_HOSTS = st.integers(0, 9).flatmap(lambda n: _ODD_HOST if n == 0 else _PLAIN_HOST)
# A valid MessageInput most of the time (a body, maybe tags, a key, a property): the batches get stored.
_SIMPLE_MESSAGE = st.builds(
    lambda body, extra: field(1, LEN, body) + b"".join(extra), st.binary(min_size=1, max_size=30),
    st.lists(st.sampled_from([field(2, LEN, b"A"), field(3, LEN, b"k"), field(4, LEN, field(1, LEN, b"a")
                                                                              + field(2, LEN, b"v")),
                              field(7, VARINT, 1), field(8, LEN, b"s")]), max_size=3))
_INTERNAL_FIELD = st.one_of(
    st.builds(field, st.just(2), st.just(VARINT), st.one_of(st.just(0), small_ints)),  # transaction_type
    st.builds(field, st.just(3), st.just(VARINT), st.one_of(st.just(0), small_ints)),  # prepared_transaction_offset
    st.builds(field, st.just(5), st.just(VARINT), st.one_of(st.just(0), small_ints)),  # reconsume_times
    st.builds(field, st.just(4), st.just(LEN), _BORN_HOSTS),                           # born_host
    st.builds(field, st.just(1), st.just(LEN), _MESSAGE),                              # a second message (merged)
    unknown_fields(),
    known_field_wrong_type([1, 2, 3, 4, 5]),
)


@st.composite
def internal_message(draw) -> bytes:
    """An InternalMessage: usually a MessageInput and a plain born host, sometimes other fields."""
    parts = []
    if draw(st.integers(0, 9)):
        parts.append(field(1, LEN, draw(_MESSAGE if draw(st.integers(0, 3)) == 0 else _SIMPLE_MESSAGE)))
    if draw(st.integers(0, 2)):
        parts.append(field(4, LEN, draw(_BORN_HOSTS)))
    if draw(st.integers(0, 5)) == 0:
        parts += draw(st.lists(_INTERNAL_FIELD, max_size=3))
    return b"".join(draw(st.permutations(parts)))


_INTERNAL_MESSAGE = internal_message()
_INTERNAL_TOPIC = st.integers(0, 3).flatmap(lambda n: st.sampled_from([b"t", b"c"]) if n else _TOPIC)
_WRITER = st.integers(0, 3).flatmap(lambda n: st.just(b"gateway") if n else st.one_of(
    st.sampled_from(["txn", "pop", "schedule", "", "nobody"]).map(str.encode), text_bytes))


@st.composite
def internal_batches_request(draw, max_batches: int = 4, max_messages: int = 4) -> bytes:
    """InternalAppendBatchesRequest bytes: a writer, batches of a topic and InternalMessages, maybe unknown
    fields anywhere; then maybe damaged."""
    parts = []
    if draw(st.integers(0, 9)):
        parts.append(field(1, LEN, draw(_WRITER)))
    for _ in range(draw(st.integers(0, max_batches))):
        batch = []
        if draw(st.integers(0, 19)):
            batch.append(field(1, LEN, draw(_INTERNAL_TOPIC)))
        batch += [field(2, LEN, draw(_INTERNAL_MESSAGE)) for _ in range(draw(st.integers(0, max_messages)))]
        if draw(st.integers(0, 6)) == 0:
            batch.insert(draw(st.integers(0, len(batch))), draw(_REQUEST_ODDITY))
        parts.append(field(2, LEN, b"".join(batch)))
    if draw(st.integers(0, 6)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), draw(_REQUEST_ODDITY))
    raw = b"".join(parts)
    return draw(damaged(raw)) if draw(st.integers(0, 5)) == 0 else raw
