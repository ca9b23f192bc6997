"""What the Transaction service's checkpoint records hold (the file's layout: journal.py).

Each record is one JSON document:

  {"version": 2, "kind": "full" | "delta", "applied": <physical offset: every record below it is applied>,
   "written_at_ms": <clock>, "counters": {<Stats counter>: <total since the service was first started>},
   "transactions": [{"id", "group", "topic", "state", "digest", "checks", "last_answer", "last_check_ms",
                     "resolved_by", "durability",
                     "halves": [[physical_offset, half_queue_offset, store_ms, op_written, committed,
                                 uniq_key, real_queue_id, attempt, immunity_ms]]}]}

A full record holds every transaction not fully done (open, parked, or an OP record still to write) and
the KEEP_RESOLVED most recently resolved done ones (a Commit repeated after a restart for an older one gets NOT_FOUND,
never a second append). A delta holds the transactions that changed since the record before it, as
they are now: loading applies the records in order, the last word on a transaction wins. Records are
taken under the table's lock, so the offset and the states agree; states may be ahead of ``applied``
(the service's own writes): re-applying those records changes nothing.

What is not kept: a reservation with no half yet (if its halves landed they lie past ``applied``, and the
follower finds them), and whether an append's outcome is unknown (after a restart the service is ready
only once it has read the log up to the end it saw at start, which settles every such question).
"""

from __future__ import annotations

import json
import pathlib

from mqstore.errors import DataLoss

from . import journal
from .table import OPEN, PREPARING, STATES, Half, Txn, TxnTable

VERSION = 2
KEEP_RESOLVED = 1000  # resolved transactions (OP written) kept in a full record, newest


def entry(txn: Txn) -> dict | None:
    """A transaction as a record holds it (under the table's lock); None for one not kept."""
    if txn.state == PREPARING and not txn.halves:
        return None
    return {"id": txn.txn_id, "group": txn.group, "topic": txn.topic,
            "state": OPEN if txn.state == PREPARING else txn.state, "digest": txn.digest,
            "checks": txn.checks_sent, "last_answer": txn.last_answer, "last_check_ms": txn.last_check_ms,
            "resolved_by": txn.resolved_by, "durability": txn.durability,
            "halves": [[h.physical_offset, h.queue_offset, h.store_timestamp_ms, h.op_written, h.committed,
                        h.uniq_key, h.real_queue_id, h.attempt, h.immunity_ms] for h in txn.halves]}


def encode(kind: str, entries: list[dict], applied: int, counters: dict, now_ms: int) -> bytes:
    doc = {"version": VERSION, "kind": kind, "applied": applied, "written_at_ms": now_ms, "counters": counters,
           "transactions": entries}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def kept(table: TxnTable) -> list[Txn]:
    """For a full record (under the table's lock): every transaction not fully done, and the KEEP_RESOLVED
    most recently resolved done ones, so the record stays small however many the memory holds
    (resolved_keep); found without walking those (TxnTable.undone, newest_done)."""
    return table.undone() + table.newest_done(KEEP_RESOLVED)


def load(path: pathlib.Path, table: TxnTable) -> dict | None:
    """Fill an empty table from the checkpoint; the counters it recorded, or None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    counters: dict = {}
    for position, payload in enumerate(journal.decode(data, path)):
        try:
            doc = json.loads(payload)
            if doc["version"] != VERSION or doc["kind"] != ("full" if position == 0 else "delta"):
                raise ValueError(f"version {doc['version']} kind {doc['kind']!r}, this service reads version "
                                 f"{VERSION}, a full record then deltas")
            for item in doc["transactions"]:
                table.restore(_txn(item))
            table.applied, counters = int(doc["applied"]), dict(doc["counters"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DataLoss(f"{path}: checkpoint record {position} does not parse ({exc}); delete the file to "
                           f"rebuild the state from the log (check counts and counters are lost)") from None
    return counters


def _txn(item: dict) -> Txn:
    if item["state"] not in STATES:
        raise ValueError(f"unknown state {item['state']!r}")
    halves = [Half(int(p), int(q), int(ts), str(uk), int(qid), str(attempt), int(immunity), bool(w), bool(c))
              for p, q, ts, w, c, uk, qid, attempt, immunity in item["halves"]]
    return Txn(item["id"], item["group"], item["topic"], halves, item["state"], item["digest"],
               checks_sent=int(item["checks"]), last_answer=item["last_answer"],
               last_check_ms=int(item["last_check_ms"]), resolved_by=item["resolved_by"],
               durability=item["durability"])
