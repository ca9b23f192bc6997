"""The key table checkpoint of a compaction log (layout: mqstore.format.key_table): what lets a start read only
the records written since, instead of every segment, the tiered ones through object storage (issue 36).

**Written** (:func:`save`) after a round installed (CompactionStore.compact) and after a tier pass uploaded or
deleted a queue's segments (mqstore.compaction.tier), under the queue's round lock (so one writer at a time and
no round between the snapshot and the file): the key table and the index as they are under the log's lock
(every record appended so far, the active segment's included), replaced atomically (mqstore.fs.replace_file:
temp file, fsync, rename, directory fsync). Never while the key table is partial (a start with the tier down).

**Read at a start** (:func:`load`, CompactionStore): used only when it checks out against the index just read
from the ``.cq`` files: its ``covered end`` within the log, exactly ``entry count`` entries below it, and
their digest equal. Otherwise it is ignored (logged) and every segment is read, as without one:

  found                                     why                                    then
  ----------------------------------------- -------------------------------------- -----------------------
  no file                                   none written yet, or an older version  full read
  torn or damaged bytes (CRC, length)       a crash or a bad disk                  full read (logged)
  entries below ``covered end`` differ      a round installed after it was         full read (logged)
                                            written, or a crash cut the index
  it checks out                             -                                      the table, then only
                                                                                   the records at or above
                                                                                   ``covered end`` are read

A key without a record below ``covered end`` is absent from it, a key in it has its latest offset there: the
records read after it only raise offsets or add keys, as a full read in log order does. The key of a record
without one ("") is not kept, as a full read does not keep it.

Thread-safety: :func:`save` is called under the queue's round lock and takes the log's lock to snapshot;
:func:`load` at open, before the queue is shared.
"""

from __future__ import annotations

import pathlib

import structlog

from mqstore import fs
from mqstore.errors import DataLoss
from mqstore.format import key_table
from mqstore.format.key_table import FILE_NAME, KeyTable

from .qlog import QueueLog

log = structlog.get_logger("mqstore.compaction")


def path_of(qlog: QueueLog) -> pathlib.Path:
    return qlog.directory / FILE_NAME


def save(qlog: QueueLog, now_ms: int) -> KeyTable:
    """Write the queue's key table as it is now (the module docstring); the table written."""
    with qlog._lock:
        e = qlog.entries
        count, end = len(e), qlog.end_position
        positions, sizes, offsets = e.positions, e.sizes, e.offsets  # (only appended to: [0, count) stays)
        latest = {key: offset for key, offset in qlog.latest.items() if key}
    table = KeyTable(end, count, key_table.entries_digest(positions, sizes, offsets, count), now_ms, latest)
    fs.replace_file(path_of(qlog), key_table.encode(table))
    return table


def load(qlog: QueueLog) -> KeyTable | None:
    """The queue's checkpoint if it checks out against its index (the module docstring), else None."""
    path = path_of(qlog)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        table = key_table.decode(data, str(path))
    except DataLoss as exc:
        log.warning("compaction.key_checkpoint_unusable", file=str(path), error=str(exc),
                    why="every segment is read to rebuild the key table")
        return None
    e = qlog.entries
    if (table.covered_end > qlog.end_position or table.entry_count > len(e)
            or e.first_at_position(table.covered_end) != table.entry_count
            or key_table.entries_digest(e.positions, e.sizes, e.offsets, table.entry_count) != table.entries_digest):
        log.info("compaction.key_checkpoint_stale", file=str(path), covered_end=table.covered_end,
                 why="the log's index below it changed since it was written (a round, or a crash cut the index): "
                     "every segment is read to rebuild the key table")
        return None
    return table
