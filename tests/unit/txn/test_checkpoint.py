"""The Transaction service's checkpoint (journal.py, snapshot.py, persist.py): golden bytes of the journal,
a save writes only what changed (nothing when nothing did), the file is rebased to one full record once
it grows, a torn tail is left out (the state of the records before it), and a load gives back the
transactions and the Stats counters."""

from __future__ import annotations

import json

import pytest

from mqstore import fs
from mqstore.clock import FakeClock
from mqstore.errors import DataLoss
from mqstore.txn import journal, persist, snapshot
from mqstore.txn.table import COMMITTED, OPEN, Half, TxnTable
from tests.conftest import golden_bytes
from tests.support import powercut

T0 = 1_700_000_000_000


def table_with(count: int) -> TxnTable:
    table = TxnTable(resolved_keep=1000)
    for i in range(count):
        table.learn_half(f"t{i}", "pg", "orders", "d" * 32, Half(100 * i, i, T0, f"u{i}", 1, "a" * 16, 5000))
    table.set_applied(100 * count, 100 * count)
    return table


def test_journal_golden_bytes(request):
    data = journal.encode_header() + journal.encode_record(b'{"kind":"full"}') + journal.encode_record(b"{}")
    assert data == golden_bytes("txn_journal.bin", data, request)
    assert data[:8] == b"MQTJ\x00\x00\x00\x01" and journal.RECORD.unpack_from(data, 8)[0] == 15
    assert journal.decode(data, "x") == [b'{"kind":"full"}', b"{}"]


def test_a_save_writes_what_changed_and_nothing_when_nothing_did(tmp_path):
    table, clock = table_with(200), FakeClock(T0)
    cp = persist.Checkpointer(tmp_path / "state.journal", table, clock, 1000)
    cp.counters = lambda: {"halves_written": 200}
    cp.save_now()  # the first save after a start: one full record
    full_size = (tmp_path / "state.journal").stat().st_size
    assert (cp.fulls, cp.deltas) == (1, 0)
    cp.save_now()
    assert (cp.fulls, cp.deltas) == (1, 0) and (tmp_path / "state.journal").stat().st_size == full_size  # nothing
    txn = table.get("t7")
    table.resolve(txn, COMMITTED, "producer")
    cp.save_now()
    records = journal.decode((tmp_path / "state.journal").read_bytes(), tmp_path)
    delta = json.loads(records[-1])
    assert (cp.fulls, cp.deltas) == (1, 1) and delta["kind"] == "delta"
    assert [t["id"] for t in delta["transactions"]] == ["t7"]  # only the one that changed, not all 200
    assert len(records[-1]) * 50 < full_size
    cp.close()
    loaded = TxnTable(resolved_keep=1000)
    assert snapshot.load(tmp_path / "state.journal", loaded) == {"halves_written": 200}
    assert loaded.get("t7").state == COMMITTED and loaded.get("t8").state == OPEN and len(loaded.by_id) == 200
    half = loaded.get("t3").halves[0]
    assert (half.uniq_key, half.attempt, half.immunity_ms, loaded.get("t3").digest) == ("u3", "a" * 16, 5000, "d" * 32)
    assert loaded.applied == 20_000


def test_the_journal_is_rebased_once_it_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(persist, "REBASE_MIN_BYTES", 2000)
    table, clock = table_with(3), FakeClock(T0)
    cp = persist.Checkpointer(tmp_path / "state.journal", table, clock, 1000)
    for i in range(40):
        table.note_answer(table.get(f"t{i % 3}"), "UNKNOWN", deciding=False)
        cp.save_now()
    assert cp.fulls >= 2 and (tmp_path / "state.journal").stat().st_size <= 2000 + 1000
    cp.close()
    loaded = TxnTable(resolved_keep=1000)
    snapshot.load(tmp_path / "state.journal", loaded)
    assert sorted(loaded.by_id) == ["t0", "t1", "t2"] and loaded.get("t0").last_answer == "UNKNOWN"


def test_a_torn_tail_is_left_out_and_the_next_save_rewrites_the_file(tmp_path):
    table, clock = table_with(2), FakeClock(T0)
    path = tmp_path / "state.journal"
    cp = persist.Checkpointer(path, table, clock, 1000)
    cp.save_now()
    table.resolve(table.get("t0"), COMMITTED, "producer")
    table.set_applied(500, 500)
    cp.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # the last append cut short by a crash
    loaded = TxnTable(resolved_keep=1000)
    again = persist.Checkpointer(path, loaded, clock, 1000)
    again.load()
    assert loaded.get("t0").state == OPEN and loaded.applied == 200  # the state of the full record: consistent
    again.save_now()
    assert journal.decode(path.read_bytes(), path) and again.fulls == 1  # rewritten whole, no torn bytes kept
    again.close()


def test_a_foreign_file_refuses_the_start(tmp_path):
    path = tmp_path / "state.journal"
    path.write_bytes(b"{not a journal}")
    with pytest.raises(DataLoss, match="delete it to rebuild"):
        snapshot.load(path, TxnTable(resolved_keep=10))


@pytest.mark.parametrize("mode", [powercut.ENTRIES, powercut.SIZES])
def test_what_a_save_wrote_survives_a_power_cut(tmp_path, mode):
    table, clock = table_with(3), FakeClock(T0)
    path = tmp_path / "txn" / "state.journal"
    with powercut.PowerCut(mode, tmp_path) as power:
        fs.make_dirs(path.parent)  # as the service creates its data directory
        cp = persist.Checkpointer(path, table, clock, 1000)
        cp.save_now()  # a full record: a new file (replace_file)
        table.resolve(table.get("t1"), COMMITTED, "producer")
        cp.save_now()  # a delta appended (fsynced)
        cp.close()
        power.cut()
    loaded = TxnTable(resolved_keep=1000)
    snapshot.load(path, loaded)
    assert loaded.get("t1").state == COMMITTED and len(loaded.by_id) == 3
