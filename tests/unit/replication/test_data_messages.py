"""A leader builds and serializes each data message once for all its replicas' streams
(commitlog_service.replication.DataMessages, issue 34): keyed by epoch and range, heartbeats always fresh,
a bounded number of ranges kept, and Replicate's serializer sending the bytes as they are. The replica reads a
data message without protobuf's copies of the log's bytes (``leader_message_in``), to the same values."""

from __future__ import annotations

import random

import pytest

from commitlog_service.replication import (DataMessages, _data, _leader_message_bytes, data_message_bytes,
                                           data_message_parts, leader_message_in)
from mqstore.replication.messages import LogData
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as pb


def _parsed(message) -> pb.LogData:
    return pb.LeaderMessage.FromString(_leader_message_bytes(message)).data


def test_the_second_stream_sending_a_range_gets_the_first_ones_bytes():
    messages = DataMessages()
    first = messages.get(3, LogData(100, b"records", 107, 107, 100))
    second = messages.get(3, LogData(100, b"records", 107, 120, 107))  # sent a moment later: newer ends
    assert second is first and (messages.built, messages.reused) == (1, 1)
    d = _parsed(second)
    # the first sending's ends: no newer than the log's, so the replica shows no more than it would
    assert (d.offset, d.data, d.next_offset) == (100, b"records", 107)
    assert (d.leader_end_offset, d.committed_offset) == (107, 100)


def test_another_epoch_or_range_is_built_anew_and_heartbeats_carry_their_own_committed_end():
    messages = DataMessages()
    messages.get(3, LogData(100, b"records", 107, 107, 100))
    assert _parsed(messages.get(4, LogData(100, b"other", 105, 105, 100))).data == b"other"  # a new epoch
    assert _parsed(messages.get(3, LogData(100, b"recor", 105, 107, 100))).next_offset == 105  # a shorter range
    assert messages.built == 3 and messages.reused == 0
    beat = messages.get(3, LogData(107, b"", 107, 107, 107))
    assert _parsed(beat).committed_offset == 107
    assert _parsed(messages.get(3, LogData(107, b"", 107, 107, 90))).committed_offset == 90  # not cached
    assert messages.built == 3


def test_only_the_last_ranges_are_kept():
    messages = DataMessages()
    for i in range(DataMessages.KEEP + 3):
        messages.get(1, LogData(i * 10, b"x" * 10, i * 10 + 10, 0, 0))
    assert len(messages._built) == DataMessages.KEEP
    messages.get(1, LogData(0, b"x" * 10, 10, 0, 0))  # the oldest went: built again
    assert messages.reused == 0 and messages.built == DataMessages.KEEP + 4


def test_the_replicate_serializer_passes_bytes_and_serializes_messages():
    welcome = pb.LeaderMessage(welcome=pb.LeaderWelcome(leader_id="a", epoch=2))
    assert _leader_message_bytes(welcome) == welcome.SerializeToString()
    assert _leader_message_bytes(b"\x12\x00") == b"\x12\x00"
    assert _leader_message_bytes([b"\x12\x02", b"\x08", b"\x01"]) == b"\x12\x02\x08\x01"


@pytest.mark.parametrize("seed", range(3))
def test_a_data_message_written_directly_is_the_bytes_protobuf_serializes(seed):
    rng = random.Random(seed)
    cases = [LogData(0, b"", 0, 0, 0), LogData(0, b"r", 1, 1, 0), LogData(5, b"", 5, 0, 5),
             LogData(1 << 40, b"x" * 200_000, (1 << 40) + 200_000, (1 << 41), -1)]
    for _ in range(300):
        size = rng.choice([0, 1, 127, 128, 16_383, 16_384, rng.randrange(1 << 20)])
        offset = rng.choice([0, 1, rng.randrange(1 << 62)])
        cases.append(LogData(offset, rng.randbytes(size), offset + size, rng.choice([0, offset + size]),
                             rng.choice([0, offset, rng.randrange(1 << 63)])))
    for d in cases:
        assert data_message_bytes(d) == _data(d).SerializeToString(), d.offset
        parts = data_message_parts(d)
        assert b"".join(parts) == data_message_bytes(d)
        if d.data:
            assert parts[1] is d.data  # the log's bytes as they are: a data connection writes them without a copy


def _as_protobuf_reads_it(raw: bytes) -> LogData:
    d = pb.LeaderMessage.FromString(raw).data
    return LogData(d.offset, d.data, d.next_offset, d.leader_end_offset, d.committed_offset)


@pytest.mark.parametrize("seed", range(3))
def test_the_replica_reads_a_data_message_as_protobuf_does_without_copying_the_log(seed):
    rng = random.Random(seed)
    cases = [LogData(0, b"", 0, 0, 0), LogData(0, b"r", 1, 1, 0), LogData(5, b"", 5, 0, 5),
             LogData(1 << 40, b"x" * 200_000, (1 << 40) + 200_000, (1 << 41), -1),
             LogData(-7, b"\x12", -1, -(1 << 63), 3)]
    for _ in range(300):
        size = rng.choice([0, 1, 127, 128, 16_383, 16_384, rng.randrange(1 << 20)])
        offset = rng.choice([0, 1, rng.randrange(1 << 62)])
        cases.append(LogData(offset, rng.randbytes(size), offset + size, rng.choice([0, offset + size]),
                             rng.choice([0, offset, rng.randrange(1 << 63)])))
    for d in cases:
        for raw in (data_message_bytes(d), _data(d).SerializeToString()):
            read = leader_message_in(raw)
            assert type(read) is LogData and read == d == _as_protobuf_reads_it(raw), d.offset
            if d.data:
                assert isinstance(read.data, memoryview) and read.data.obj is raw  # a view: no copy


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = bytes([number << 3 | wire_type])
    return key + (bytes([len(payload)]) + payload if wire_type == 2 else payload)


@pytest.mark.parametrize("log_data", [
    _field(2, 2, b"ab") + _field(2, 2, b"cd"),           # data twice: the last wins
    _field(2, 2, b"ab") + _field(2, 2, b""),             # ... also when empty
    _field(1, 0, b"\x05") + _field(2, 2, b"ab") + _field(1, 0, b"\x07"),  # offset twice
    _field(1, 0, b"\x00") + _field(2, 2, b"ab"),         # a field written at its default
    _field(3, 0, b"\x09") + _field(2, 2, b"ab") + _field(9, 0, b"\x01"),  # another order, an unknown field
    _field(2, 2, b"ab") + _field(6, 2, b"zz"),           # an unknown length-delimited field
    _field(1, 0, b"\xff" * 9 + b"\x01") + _field(2, 2, b"ab"),  # a ten-byte varint
])
def test_a_data_message_in_another_shape_is_read_as_protobuf_reads_it(log_data):
    for raw in (b"\x12" + bytes([len(log_data)]) + log_data,
                (b"\x12" + bytes([len(log_data)]) + log_data) * 2):  # the data field twice: merged by protobuf
        read = leader_message_in(raw)
        got = read if type(read) is LogData else LogData(read.data.offset, read.data.data, read.data.next_offset,
                                                          read.data.leader_end_offset, read.data.committed_offset)
        assert got == _as_protobuf_reads_it(raw)


def test_the_welcome_and_a_damaged_message_go_to_protobuf():
    welcome = pb.LeaderMessage(welcome=pb.LeaderWelcome(leader_id="a", epoch=2, truncate_to=7))
    read = leader_message_in(welcome.SerializeToString())
    assert read.WhichOneof("kind") == "welcome" and read.welcome.truncate_to == 7
    raw = data_message_bytes(LogData(1, b"records", 8, 8, 1))
    for damaged in (raw[:-1], raw[:5], raw + b"\x08"):  # cut short, or a field after the data field's end
        with pytest.raises(Exception) as mine:
            leader_message_in(damaged)
        with pytest.raises(Exception) as theirs:
            pb.LeaderMessage.FromString(damaged)
        assert type(mine.value) is type(theirs.value)
