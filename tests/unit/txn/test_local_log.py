"""LocalTxnLog (mqstore.txn.log), the Transaction service's way into the store of its own process (Local
mode): the same answers as the CommitLog service gives the Cluster-mode service (writer "txn", the
follower's filter and retention hold), and a Tail that ends when cancelled."""

from __future__ import annotations

import threading
import types

import pytest

from mqstore.txn import records as tx
from mqstore.errors import DataLoss, InvalidArgument, NotFound, Unavailable
from mqstore.format.record import SYSFLAG_TX_COMMIT
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.txn.coordinator import Coordinator
from mqstore.txn.log import HOLD_NAME, LocalTxnLog, read_halves
from mqstore_rpc import convert


@pytest.fixture
def store(small_config):
    store = build_store(small_config())
    store.start()
    yield store
    store.stop()


def test_appends_as_the_txn_writer_and_reads_back(store):
    log = LocalTxnLog(store, linger_ms=0)
    store.topic_admin.create("orders", 1)
    results = log.append(tx.HALF_TOPIC, [MessageIn(b"half-1"), MessageIn(b"half-2")])
    assert isinstance(results, list) and [r.queue_offset for r in results] == [0, 1]  # a list: the appender slices
    offsets = [r.physical_offset for r in results]
    found = log.get_messages_batch([*offsets, offsets[1] + 1])
    assert [f.message.record.body for f in found[:2]] == [b"half-1", b"half-2"]
    assert found[2].message is None and found[2].missing
    assert log.topic("orders").queue_count == 1 and log.max_physical_offset() == store.store_info().max_physical_offset
    with pytest.raises(NotFound):
        log.topic("missing")
    # the store's rules for writer "txn": plain records into user topics are refused, as over gRPC
    with pytest.raises(InvalidArgument):
        log.append("orders", [MessageIn(b"plain")])


def test_the_tail_carries_the_transaction_topics_and_commits_and_holds_retention(store):
    log = LocalTxnLog(store, linger_ms=0)
    store.topic_admin.create("orders", 1)
    store.append("orders", [MessageIn(b"not followed")])
    half = log.append(tx.HALF_TOPIC, [MessageIn(b"half")])[0]
    log.append("orders", [MessageIn(b"real", sys_flag=SYSFLAG_TX_COMMIT,
                                    prepared_transaction_offset=half.physical_offset)])
    end = store.store_info().max_physical_offset
    stream = log.tail(None, max_frame_bytes=1 << 20, heartbeat_ms=10)
    records = 0
    for frame in stream:
        records += frame.record_count
        if frame.next_physical_offset >= end:
            break
    stream.cancel()
    assert records == 2  # the half and the COMMIT record, not the plain message
    assert HOLD_NAME in store.retention.holds.snapshot()


def test_a_cancelled_tail_ends_while_it_waits_for_records(store):
    stream = LocalTxnLog(store, linger_ms=0).tail(0, max_frame_bytes=0, heartbeat_ms=50)
    frames, ended = [], threading.Event()

    def follow():
        for frame in stream:
            frames.append(frame)
        ended.set()
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    stream.cancel()
    assert ended.wait(10), "the tail did not end after cancel"
    thread.join(10)


def test_a_half_past_the_end_the_node_serves_is_not_readable_yet_rather_than_lost(store):
    """A replica shows what its leader said is committed a moment after the leader; during a failover the node
    asked may end before a half the Prepare acknowledged (make compose-check-chaos: a Commit refused DATA_LOSS,
    "outside the log [0, 4479990)" for the half at 4479990). Past the end is beyond_end, and the readers of halves
    answer Unavailable (retry) for it; inside the log, a half that is not there stays DataLoss."""
    log = LocalTxnLog(store, linger_ms=0)
    half = log.append(tx.HALF_TOPIC, [MessageIn(b"half")])[0]
    end = store.store_info().max_physical_offset
    past, inside = log.get_messages_batch([end, half.physical_offset + 1])
    assert past.message is None and past.beyond_end
    assert inside.message is None and not inside.beyond_end
    with pytest.raises(Unavailable):
        read_halves(log, [half.physical_offset, end])
    with pytest.raises(DataLoss):
        read_halves(log, [half.physical_offset + 1])
    # the coordinator's Commit reads its halves the same way (a Read step answered with the lookups)
    fake = types.SimpleNamespace(cache=types.SimpleNamespace(take=lambda offset: None), log_reader=log)
    txn = types.SimpleNamespace(txn_id="t1")
    for lookup, error in ((past, Unavailable), (inside, DataLoss)):
        steps = Coordinator._real_messages(fake, txn, [types.SimpleNamespace(physical_offset=end)])
        next(steps)
        with pytest.raises(error):
            steps.send([lookup])


def test_the_flag_crosses_the_wire(store):
    lookups = LocalTxnLog(store, linger_ms=0).get_messages_batch([store.store_info().max_physical_offset + 8])
    assert convert.get_messages_out(convert.get_messages_response(lookups))[0].beyond_end
