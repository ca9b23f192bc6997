"""Placing and stamping a batch inside the append lock: the pure-Python reference.

The encoder leaves every record's QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP zero; under the
commit log's lock the batch is placed in the log (:func:`place`) and stamped (:func:`stamp`). The
compiled codec does the same per batch in C (mqstore.codec ``_stamp``); CommitLog uses it when it is
active, and tests/property/test_codec_stamp.py requires both to give the same bytes and results.

- :func:`place`: the chunks of the batch per segment. A record that does not fit the rest of a segment
  with BLANK_SIZE bytes to spare moves whole into the next segment (the rest becomes a blank record,
  written by the copy).
- :func:`queue_ranges`: the queue offsets [first, end) each queue of the batch will take (what stamp
  assigns), from the commit log's table of next queue offsets; the consume queue files are reserved
  for them before anything is copied.
- :func:`stamp`: queue offsets from the queues' next offsets, in batch order; physical offsets from the
  chunks; one store time. Records of prepared and rolled-back transactions take no queue offset (0)
  and get no consume queue entry (RocketMQ's rule). Returns the entries (per record: physical
  offset, size, queue id, queue offset, tag code, sys flag) and the consume queue runs: per queue id,
  (first queue offset, the entries' bytes in the consume queue unit format, physical end of the last),
  which the dispatcher writes with one copy per queue.

Thread-safety: pure functions over the caller's buffer, called under the commit log's lock.
"""

from __future__ import annotations

import collections

from mqstore.format import cq_unit, record

# (buf_from, physical_from, buf_to, length): bytes [buf_from, buf_to) of the batch go to physical_from.
Chunk = tuple[int, int, int, int]


def place(sizes: list[int], written_offset: int, segment_size: int) -> tuple[list[Chunk], int]:
    """The chunks of a batch of records of ``sizes`` appended at ``written_offset``, and the log end
    after it."""
    pos = written_offset
    chunks = []
    buf_from = buf_at = 0
    phys_from = pos
    for size in sizes:
        room = segment_size - pos % segment_size
        if size + record.BLANK_SIZE > room:
            if buf_at > buf_from:
                chunks.append((buf_from, phys_from, buf_at, buf_at - buf_from))
            pos += room
            buf_from, phys_from = buf_at, pos
        buf_at += size
        pos += size
    if buf_at > buf_from:
        chunks.append((buf_from, phys_from, buf_at, buf_at - buf_from))
    return chunks, pos


def queue_ranges(queue_ids: list[int], sys_flags: list[int], next_offsets: dict[tuple[str, int], int],
                 topic: str) -> dict[int, tuple[int, int]]:
    """{queue id: (first queue offset, end)} of the records that take a queue offset, in the order the queue ids
    first appear; ``next_offsets``: (topic, queue id) -> the queue's next offset (absent: 0)."""
    if any(sys_flags):
        counts = collections.Counter(q for q, f in zip(queue_ids, sys_flags, strict=True)
                                     if record.takes_queue_offset(f))
    else:
        counts = collections.Counter(queue_ids)
    ranges = {}
    for qid, count in counts.items():
        first = next_offsets.get((topic, qid), 0)
        ranges[qid] = (first, first + count)
    return ranges


def stamp(buf: bytearray, chunks: list[Chunk], sizes: list[int], queue_ids: list[int], tag_codes: list[int],
          sys_flags: list[int], first_offsets: dict[int, int], now_ms: int) -> tuple[list[tuple], dict]:
    """Stamp the records of ``buf`` placed by ``chunks``; ``first_offsets``: the next queue offset of
    each queue id the batch uses. Returns (entries, runs) as the module docstring says."""
    entries = []
    runs: dict[int, tuple[int, list]] = {}
    next_offsets = dict(first_offsets)
    write = record.stamp
    index = 0
    for buf_from, phys_from, buf_to, _ in chunks:
        at = buf_from
        while at < buf_to:
            size, qid, tag, flag = sizes[index], queue_ids[index], tag_codes[index], sys_flags[index]
            phys = phys_from + (at - buf_from)
            if record.takes_queue_offset(flag):
                qoff = next_offsets[qid]
                next_offsets[qid] = qoff + 1
                run = runs.get(qid)
                if run is None:
                    runs[qid] = run = (qoff, [])
                run[1].append((phys, size, tag))
            else:
                qoff = 0
            write(buf, at, qoff, phys, now_ms)
            entries.append((phys, size, qid, qoff, tag, flag))
            at += size
            index += 1
    if index != len(sizes):
        raise ValueError(f"the chunks place {index} records, the batch has {len(sizes)}")
    pack = cq_unit.ENTRY.pack
    packed = {qid: (first, b"".join([pack(*e) for e in run]), run[-1][0] + run[-1][1])
              for qid, (first, run) in runs.items()}
    return entries, packed
