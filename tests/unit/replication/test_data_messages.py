"""A leader builds and serializes each data message once for all its replicas' streams
(commitlog_service.replication.DataMessages, issue 34): keyed by epoch and range, heartbeats always fresh,
a bounded number of ranges kept, and Replicate's serializer sending the bytes as they are."""

from __future__ import annotations

import random

import pytest

from commitlog_service.replication import DataMessages, _data, _leader_message_bytes, data_message_bytes
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
