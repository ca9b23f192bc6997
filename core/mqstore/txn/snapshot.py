"""The Transaction service's checkpoint: where its follower resumes and the transactions it knows.

One JSON file ``<data-dir>/txn/state.json`` (derived data: the log holds every fact it records except
the check counts and last answers), replaced atomically (mqstore.fs.replace_file: temp file, fsync,
rename, fsync of the directory), written every ``checkpoint_interval_ms`` and at a clean stop:

  {"version": 1, "applied": <physical offset: every record below it is applied>,
   "written_at_ms": <clock>,
   "transactions": [{"id", "group", "topic", "state", "checks", "last_answer", "last_check_ms",
                     "resolved_by", "halves": [[physical_offset, half_queue_offset, store_ms, op_written]]}]}

It holds every transaction not fully done and the newest 1000 done ones (a Commit repeated after a
restart for an older one gets NOT_FOUND, never a second append). It is taken under the table's lock, so
the offset and the states agree; states may be ahead of
``applied`` (the service's own writes): re-applying those records changes nothing. No file: start
from the earliest record of the log. A file that does not parse: refuse to start (DataLoss naming it;
delete it to rebuild from the log, losing only check counts).
"""

from __future__ import annotations

import json
import pathlib

from mqstore import failpoints, fs
from mqstore.errors import DataLoss

from .table import COMMITTED, ROLLED_BACK, STATES, Half, Txn, TxnTable

VERSION = 1


KEEP_RESOLVED = 1000  # resolved transactions (OP written) kept in the file, newest: idempotent answers after a restart


def encode(table: TxnTable, now_ms: int) -> bytes:
    with table.lock:
        txns = [{"id": t.txn_id, "group": t.group, "topic": t.topic, "state": t.state, "checks": t.checks_sent,
                 "last_answer": t.last_answer, "last_check_ms": t.last_check_ms, "resolved_by": t.resolved_by,
                 "halves": [[h.physical_offset, h.queue_offset, h.store_timestamp_ms, h.op_written]
                            for h in t.halves]}
                for t in _kept(table)]
        doc = {"version": VERSION, "applied": table.applied, "written_at_ms": now_ms, "transactions": txns}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def _kept(table: TxnTable) -> list:
    """Every transaction not fully done (open, parked, or an OP record still to write), and the newest
    KEEP_RESOLVED done ones: the file stays small however many the memory holds (resolved_keep)."""
    done = [t for t in table.by_id.values() if t.state in (COMMITTED, ROLLED_BACK) and t.op_written]
    recent = set(map(id, done[-KEEP_RESOLVED:]))  # by_id keeps insertion (prepare) order
    return [t for t in table.by_id.values() if not (t.state in (COMMITTED, ROLLED_BACK) and t.op_written)
            or id(t) in recent]


def save(path: pathlib.Path, table: TxnTable, now_ms: int) -> None:
    fs.replace_file(path, encode(table, now_ms), before_rename=lambda: failpoints.hit("txn.checkpoint.before_rename"))


def load(path: pathlib.Path, table: TxnTable) -> bool:
    """Fill an empty table from the file; False when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    try:
        doc = json.loads(data)
        if doc["version"] != VERSION:
            raise ValueError(f"version {doc['version']}, this service reads {VERSION}")
        for item in doc["transactions"]:
            if item["state"] not in STATES:
                raise ValueError(f"unknown state {item['state']!r}")
            txn = table.add_halves(item["id"], item["group"], item["topic"],
                                   [Half(int(p), int(q), int(ts), bool(w)) for p, q, ts, w in item["halves"]])
            _restore(table, txn, item)
        table.applied = doc["applied"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataLoss(f"{path}: the transaction checkpoint does not parse ({exc}); delete it to rebuild the "
                       f"state from the log (check counts are lost)") from None
    return True


def _restore(table: TxnTable, txn: Txn, item: dict) -> None:
    txn.checks_sent, txn.last_answer, txn.last_check_ms = int(item["checks"]), item["last_answer"], \
        int(item["last_check_ms"])
    if item["state"] != txn.state:
        table.resolve(txn, item["state"], item["resolved_by"])
