"""Messages built in place on the Transaction service's hot path, the same bytes as those built apart and
copied in that they replace: its appends to the commit log (convert.add_internal_messages and
internal_append_batches_request against convert.internal_message, for every field set and unset) and a
Transact frame's answer (servicer._frame_response)."""

from __future__ import annotations

from mqstore.format.record import SYSFLAG_TX_COMMIT, SYSFLAG_TX_PREPARED
from mqstore.model import AppendResult, MessageIn
from mqstore.txn.coordinator import Ended, Prepared, PreparedHalf
from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, txn_pb2
from txn_service import servicer

MESSAGES = [
    MessageIn(b""),  # every field the default: the message is still present
    MessageIn(b"body", "tag", ("k1", "k2"), {"a": "b", "TRANSACTION_ID": "t1"}, -7, 1_733_000_000_000, 0, "shard",
              b"\x7f\x00\x00\x01", 5555, SYSFLAG_TX_PREPARED),
    MessageIn(b"x" * 1024, "", (), {}, 0, 0, 3, "", b"\x0a\x00\x00\x02", 0, SYSFLAG_TX_COMMIT, 123_456, 2),
    MessageIn(b"v6", born_host=b"\x00" * 15 + b"\x01", born_port=80),
]


def _as_before(writer: str, batches) -> commitlog_pb2.InternalAppendBatchesRequest:
    return commitlog_pb2.InternalAppendBatchesRequest(writer=writer, batches=[
        commitlog_pb2.InternalAppendBatch(topic=topic, messages=[convert.internal_message(m) for m in messages])
        for topic, messages in batches])


def test_a_batches_request_is_the_same_bytes_as_one_built_message_by_message():
    batches = [("RMQ_SYS_TRANS_HALF_TOPIC", MESSAGES[:2]), ("orders", MESSAGES[2:]), ("empty", [])]
    built = convert.internal_append_batches_request("txn", batches)
    assert built.SerializeToString(deterministic=True) == _as_before("txn", batches).SerializeToString(
        deterministic=True)
    assert built == _as_before("txn", batches)
    assert built.batches[0].messages[0].HasField("message")


def test_queue_id_none_stays_absent_and_zero_stays_present():
    request = commitlog_pb2.InternalAppendRequest(topic="t", writer="w")
    convert.add_internal_messages(request.messages, [MessageIn(b"a", queue_id=None), MessageIn(b"b", queue_id=0)])
    assert [m.message.HasField("queue_id") for m in request.messages] == [
        convert.internal_message(MessageIn(b"a", queue_id=None)).message.HasField("queue_id"),
        convert.internal_message(MessageIn(b"b", queue_id=0)).message.HasField("queue_id")]
    assert list(request.messages) == [convert.internal_message(MessageIn(b"a", queue_id=None)),
                                      convert.internal_message(MessageIn(b"b", queue_id=0))]


def test_a_frames_answer_is_the_same_as_one_built_apart():
    """servicer._frame_response fills the TransactResponse's prepared or ended in place: the same message as
    a PrepareResponse or EndResponse built on its own and copied in, an empty end's oneof still set."""
    prepared = Prepared("t" * 32, [PreparedHalf("u1", 100, 7, 2), PreparedHalf("u2", 300, 8, 2)], "WRITTEN")
    result = AppendResult("m1", "u1", 2, 40, 5000, 1200, 1_733_000_000_000, "FLUSHED")
    for outcome, kind in ((prepared, "prepared"), (Ended("COMMITTED", False, [result]), "ended"),
                          (Ended("ROLLED_BACK", True, []), "ended")):
        apart = servicer._prepared(outcome) if kind == "prepared" else servicer._ended(outcome)
        expected = txn_pb2.TransactResponse(request_id=9, **{kind: apart})
        got = servicer._frame_response(9, outcome)
        assert got.WhichOneof("kind") == kind
        assert got == expected
        assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
