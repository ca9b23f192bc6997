"""The transaction table and its projection of the log, on the domain objects (no sockets): the id is
reserved atomically, the cap on live transactions, what an unknown outcome settles to, a Prepare written
twice (one attempt committed, every half rolled back or committed, none stranded), an operator's
decision on a parked transaction surviving a rebuild from the log, and memory bounded by resolved_keep."""

from __future__ import annotations

import threading

import pytest

from mqstore.txn import records as tx
from mqstore.errors import ResourceExhausted
from mqstore.format import record
from mqstore.model import TailFrame
from mqstore.txn.projection import TxnProjection
from mqstore.txn.table import (COMMIT, COMMITTED, OPEN, PARK, PARKED, PREPARE, PREPARING, ROLLED_BACK, Half,
                               TxnTable)
from tests.support.records import encode

T0 = 1_700_000_000_000


class Log:
    """Records appended at increasing physical offsets; ``frame()`` gives the new ones to the projection."""

    def __init__(self):
        self.data = b""
        self.sent = 0
        self.half_queue_offset = 0

    def add(self, topic: str, body: bytes, properties: dict, *, sys_flag: int = 0, prepared: int = 0,
            queue_offset: int = 0) -> int:
        physical = len(self.data)
        self.data += encode(topic=topic.encode(), body=body, properties=record.encode_properties(properties),
                            sys_flag=sys_flag, prepared_transaction_offset=prepared, queue_offset=queue_offset,
                            physical_offset=physical, store_timestamp_ms=T0)
        return physical

    def half(self, txn_id: str, attempt: str, body: bytes = b"m") -> tuple[int, int]:
        queue_offset = self.half_queue_offset
        self.half_queue_offset += 1
        physical = self.add(tx.HALF_TOPIC, body, {tx.PROPERTY_TRANSACTION_ID: txn_id, tx.PROPERTY_ATTEMPT: attempt,
                                                  tx.PROPERTY_PRODUCER_GROUP: "pg", "REAL_TOPIC": "orders",
                                                  "REAL_QID": "0"}, queue_offset=queue_offset)
        return physical, queue_offset

    def commit(self, half_physical: int) -> None:
        self.add("orders", b"m", {}, sys_flag=record.SYSFLAG_TX_COMMIT, prepared=half_physical)

    def op(self, *half_queue_offsets: int) -> None:
        self.add(tx.OP_TOPIC, "".join(f"{o}," for o in half_queue_offsets).encode(), {"TAGS": tx.OP_TAG})

    def parked(self, txn_id: str) -> None:
        self.add(tx.CHECK_MAX_TOPIC, b"m", {tx.PROPERTY_TRANSACTION_ID: txn_id})

    def frame(self) -> TailFrame:
        frame = TailFrame(self.data[self.sent:], 1, len(self.data), len(self.data))
        self.sent = len(self.data)
        return frame


def projection(log: Log) -> tuple[TxnTable, TxnProjection, list]:
    queued: list[int] = []
    table = TxnTable(resolved_keep=1000, on_needs_op=lambda txn, halves: queued.extend(h.queue_offset for h in halves))
    p = TxnProjection(table)
    p.apply(log.frame())
    assert table.ready
    return table, p, queued


def test_concurrent_reservations_of_one_id_give_it_to_one_caller():
    table = TxnTable(resolved_keep=10)
    barrier, won = threading.Barrier(8), []

    def reserve(i: int) -> None:
        barrier.wait()
        txn, created = table.reserve("same", "pg", "orders", f"digest-{i}")
        if created:
            won.append(i)

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(won) == 1 and table.get("same").state == PREPARING and table.get("same").digest == f"digest-{won[0]}"


def test_the_cap_counts_preparing_open_and_parked_not_resolved():
    table = TxnTable(resolved_keep=10, max_live=2)
    a, _ = table.reserve("a", "pg", "orders", "")
    table.reserve("b", "pg", "orders", "")
    with pytest.raises(ResourceExhausted, match="max_open_transactions is 2"):
        table.reserve("c", "pg", "orders", "")
    table.prepared(a, [Half(0, 0, T0)], "WRITTEN")
    table.resolve(a, PARKED, "test")
    with pytest.raises(ResourceExhausted):
        table.reserve("c", "pg", "orders", "")  # parked still counts
    table.resolve(a, COMMITTED, "operator")
    assert table.reserve("c", "pg", "orders", "")[1]


def test_an_unknown_prepare_settles_to_open_or_frees_the_id():
    log = Log()
    table, p, _ = projection(log)
    landed, _ = table.reserve("landed", "pg", "orders", "")
    lost, _ = table.reserve("lost", "pg", "orders", "")
    table.mark_unknown(landed, PREPARE)
    table.mark_unknown(lost, PREPARE)
    log.half("landed", "a1")
    p.apply(log.frame())
    assert landed.state == OPEN and not landed.unknown  # the follower found its halves
    table.settle_unknown(landed, PREPARE)
    table.settle_unknown(lost, PREPARE)  # read past the failure: nothing there
    assert table.get("lost") is None and table.get("landed") is landed and landed.state == OPEN


def test_an_unknown_commit_or_park_settles_from_the_records_found():
    log = Log()
    h1, _ = log.half("c", "a")
    log.half("p", "a")
    log.half("n", "a")
    table, p, _ = projection(log)
    for txn_id, action in (("c", COMMIT), ("p", PARK), ("n", COMMIT)):
        table.mark_unknown(table.get(txn_id), action)
    log.commit(h1)
    log.parked("p")
    p.apply(log.frame())
    assert (table.get("c").view_state, table.get("p").view_state) == (COMMITTED, PARKED)
    assert table.get("n").view_state == "OUTCOME_UNKNOWN"
    table.settle_unknown(table.get("n"), COMMIT)
    assert table.get("n").view_state == OPEN  # its commit never landed: open, a retry may commit


def test_a_prepare_written_twice_is_one_transaction_whose_duplicate_is_rolled_back():
    log = Log()
    first = [log.half("t", "first", b"x"), log.half("t", "first", b"y")]
    table, p, queued = projection(log)
    txn = table.get("t")
    assert [h.physical_offset for h in txn.primary()] == [first[0][0], first[1][0]]
    second = [log.half("t", "second", b"x"), log.half("t", "second", b"y")]
    p.apply(log.frame())
    assert len(txn.halves) == 4 and [h.attempt for h in txn.primary()] == ["first", "first"]
    table.committed(txn, txn.primary(), "producer")
    table.need_op(txn)
    assert sorted(queued) == sorted(q for _, q in first + second)  # every half, the duplicates too
    third = log.half("t", "third")  # a late duplicate of a decided transaction: rolled back by its OP
    p.apply(log.frame())
    assert queued[-1] == third[1] and txn.state == COMMITTED
    log.commit(second[0][0])  # (a log where the other attempt was committed: that one is primary)
    rebuilt, _, _ = projection(log_copy(log))
    assert rebuilt.get("t").state == COMMITTED and rebuilt.get("t").primary()[0].attempt == "second"


def log_copy(log: Log) -> Log:
    copy = Log()
    copy.data = log.data
    return copy


def test_an_operators_rollback_of_a_parked_transaction_survives_a_rebuild():
    log = Log()
    _, q = log.half("parked-then-rolled-back", "a")
    h2, _ = log.half("parked-then-committed", "a")
    log.parked("parked-then-rolled-back")
    log.parked("parked-then-committed")
    log.op(q)  # ForceResolve ROLLBACK: only an OP record
    log.commit(h2)  # ForceResolve COMMIT: the real message
    table, _, _ = projection(log)
    assert table.get("parked-then-rolled-back").state == ROLLED_BACK  # PARKED before: the operator undone
    assert table.get("parked-then-committed").state == COMMITTED


def test_resolved_transactions_beyond_resolved_keep_are_forgotten():
    log = Log()
    table = TxnTable(resolved_keep=5)
    p = TxnProjection(table)
    for i in range(50):
        physical, q = log.half(f"t{i}", "a")
        log.commit(physical)
        log.op(q)
    p.apply(log.frame())
    p.apply(log.frame())  # the follower has passed them all: they may go
    assert len(table.by_id) <= 6 and len(table.by_phys) <= 6 and len(table.by_queue_offset) <= 6
    assert table.get("t49").state == COMMITTED


@pytest.mark.parametrize("seed", range(6))
def test_a_full_checkpoint_keeps_every_undone_transaction_and_the_newest_done_ones(seed, monkeypatch):
    """snapshot.kept (TxnTable.undone + newest_done, kept without walking the table) against a model that
    walks it, after each of a random run of steps: halves, commits, rollbacks, parking, OP records written
    in any order, duplicate halves of decided transactions, old ones forgotten past resolved_keep."""
    import random

    from mqstore.txn import snapshot

    monkeypatch.setattr(snapshot, "KEEP_RESOLVED", 4)
    rng = random.Random(seed)
    log = Log()
    queued: list[int] = []
    table = TxnTable(resolved_keep=12, on_needs_op=lambda txn, halves: queued.extend(h.queue_offset for h in halves))
    p = TxnProjection(table)
    p.apply(log.frame())
    halves: dict[str, list[int]] = {}

    def done(t) -> bool:
        return t.state in (COMMITTED, ROLLED_BACK) and t.op_written

    for step in range(300):
        live = [i for i in halves if (t := table.get(i)) is not None and t.state in (OPEN, PARKED)]
        decided = [i for i in halves if (t := table.get(i)) is not None and t.state in (COMMITTED, ROLLED_BACK)]
        action = rng.choice(["new", "new", "commit", "rollback", "park", "op", "op", "duplicate"])
        if action == "new" or not live and action in ("commit", "rollback", "park"):
            txn_id = f"t{step}"
            halves[txn_id] = [log.half(txn_id, "a")[0] for _ in range(rng.randint(1, 2))]
        elif action == "commit":
            log.commit(halves[rng.choice(live)][0])
        elif action == "rollback":
            txn = table.get(rng.choice(live))
            table.resolve(txn, ROLLED_BACK, "producer")
            table.need_op(txn)
        elif action == "park":
            log.parked(rng.choice(live))
        elif action == "op" and queued:
            rng.shuffle(queued)
            take = rng.randint(1, len(queued))
            log.op(*queued[:take])
            del queued[:take]
        elif action == "duplicate" and decided:
            txn_id = rng.choice(decided)
            halves[txn_id].append(log.half(txn_id, f"dup{step}")[0])
        p.apply(log.frame())
        with table.lock:
            got = [t.txn_id for t in snapshot.kept(table)]
            undone = {t.txn_id for t in table.by_id.values() if not done(t)}
            newest = [i for i in table._resolved if i in table.by_id and done(table.by_id[i])][-4:]
        assert len(got) == len(set(got)), got
        assert set(got) == undone | set(newest), (step, action, sorted(set(got) ^ (undone | set(newest))))


def test_a_restored_transaction_with_an_op_record_to_write_is_undone():
    from mqstore.txn import snapshot

    log = Log()
    physical, q = log.half("rolled", "a")
    log.half("done", "a")
    table, p, _ = projection(log)
    table.resolve(table.get("rolled"), ROLLED_BACK, "producer")  # its OP record not written yet
    log.commit(table.get("done").halves[0].physical_offset)
    log.op(table.get("done").halves[0].queue_offset)
    p.apply(log.frame())
    restored = TxnTable(resolved_keep=1000)
    for txn in snapshot.kept(table):
        restored.restore(snapshot._txn(snapshot.entry(txn)))
    assert [t.txn_id for t in restored.undone()] == ["rolled"]
    assert [t.txn_id for t in restored.newest_done(10)] == ["done"]


def test_a_half_record_is_learned_from_its_properties_decoded_once(monkeypatch):
    """Every field the table takes from a half record, as the record's decoded properties give it (the last
    entry of a name wins, an empty value counts as absent, the producer's own properties beside them); the
    properties' bytes are sliced and decoded once per half (a find per property cost ~20 us a half more)."""
    from mqstore.format import record_reader

    slices = []
    real = record_reader.RecordView.properties_raw
    monkeypatch.setattr(record_reader.RecordView, "properties_raw",
                        property(lambda view: slices.append(view.physical_offset) or real.fget(view)))
    log = Log()
    props = {"color": "blue", tx.PROPERTY_TRANSACTION_ID: "t1", tx.PROPERTY_PRODUCER_GROUP: "pg",
             record.PROPERTY_REAL_TOPIC: "orders", record.PROPERTY_REAL_QUEUE_ID: "3", tx.PROPERTY_DIGEST: "d" * 32,
             record.PROPERTY_UNIQ_KEY: "K1", tx.PROPERTY_ATTEMPT: "a1", tx.PROPERTY_CHECK_IMMUNITY: "7"}
    later = f"{tx.PROPERTY_ATTEMPT}\x01a2\x02{record.PROPERTY_UNIQ_KEY}\x01\x02"  # the last wins; empty: absent
    raw = record.encode_properties(props) + later.encode()
    physical = len(log.data)
    log.data += encode(topic=tx.HALF_TOPIC.encode(), body=b"m", properties=raw, queue_offset=5,
                       physical_offset=physical, store_timestamp_ms=T0)
    table, _, _ = projection(log)
    txn = table.get("t1")
    assert (txn.group, txn.topic, txn.digest, txn.state) == ("pg", "orders", "d" * 32, OPEN)
    (half,) = txn.halves
    assert (half.physical_offset, half.queue_offset, half.uniq_key, half.real_queue_id, half.attempt,
            half.immunity_ms) == (physical, 5, "K1", 3, "a2", tx.immunity_ms("7"))
    assert slices == [physical]  # one slice of the properties for the half, not one per property
