"""What replication does to the commit log's files, beside appends: read whole records for a replica,
cut a diverged tail, start a new log at a leader's first segment. The same steps as
mqstore.log.recovery.repair: durable ``.broken`` copies first (fs.copy_durably), then zero the tail of
the segment that is cut, delete the later ones and fsync the directory; consume queues follow.

Thread-safety: ``chunk`` reads below the written offset without a lock (as every reader does);
``truncate`` and ``restart_at`` run on a replica's follower thread, the only writer of a replica's log,
and take the commit log's ``reshaping`` lock (the segment warmer creates no segment from a written offset that is
being replaced: restart_at's first segment would otherwise meet one at the old offset), then its and the
dispatcher's locks.
"""

from __future__ import annotations

import structlog

from mqstore import failpoints, fs
from mqstore.errors import DataLoss, invariant
from mqstore.format import record, record_scan

log = structlog.get_logger()


def chunk(commitlog, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """(bytes, next offset) of the whole records from ``offset`` (a record start) up to ``max_bytes``
    (a larger record alone), within one segment and below the written offset. A blank record at
    ``offset`` comes alone, 8 bytes, and next offset is the next segment's start; nothing to send
    gives (b"", offset). A record that fails its header checks raises DataLoss (the leader's log needs
    `mqstore check`; replicating it would copy the damage)."""
    end = commitlog.written_offset
    if offset >= end:
        return b"", offset
    seg = commitlog.segments.find(offset)
    buf, pos = seg.buffer, offset - seg.start
    limit = min(seg.size, end - seg.start)
    size, magic = record.PREFIX.unpack_from(buf, pos)
    if magic == record.MAGIC_BLANK:
        return seg.read(pos, record.BLANK_SIZE), seg.end
    walked = record_scan.walk(buf, pos, min(limit, pos + max_bytes), verify_crc=False, base=seg.start)
    if walked.stop > pos:
        return seg.read(pos, walked.stop - pos), seg.start + walked.stop
    if magic == record.MAGIC_V1 and pos + size <= limit and \
            record_scan.walk(buf, pos, pos + size, verify_crc=False, base=seg.start).stop == pos + size:
        return seg.read(pos, size), offset + size  # one record larger than max_bytes
    raise DataLoss(f"the leader's record at physical offset {offset} ({seg.path.name} position {pos}) fails its "
                   f"header checks ({walked.error}); replication stops there: run `mqstore check` on the leader",
                   physical_offset=offset)


def truncate(commitlog, offset: int, dispatcher, queues) -> list[str]:
    """Cut the log to ``offset`` (a record start below the written offset); .broken copies of the segments
    that lose bytes. Returns the copies' paths."""
    segments = commitlog.segments
    cut_from = commitlog.written_offset
    invariant(commitlog.min_offset <= offset < cut_from, f"truncate to {offset} inside [{commitlog.min_offset}, "
                                                           f"{cut_from})")
    copies = [str(fs.copy_durably(seg.path, fs.free_name(seg.path, ".broken")))
              for seg in segments.segments if seg.end > offset and seg.start < cut_from]
    failpoints.hit("replication.truncate.after_copy")
    with commitlog.reshaping, commitlog.lock, dispatcher.lock:
        seg = segments.find(offset)
        seg.zero_from(offset - seg.start)
        segments.delete_from(seg.end)
        fs.fsync_dir(segments.directory)
        for cq in list(queues.queues.values()):
            cq.truncate_to_log_end(offset)
        dispatcher.dispatched_offset = min(dispatcher.dispatched_offset, offset)
        commitlog.pending.clear()
        commitlog.written_offset = offset
    log.warning("replication.truncated", physical_offset=offset, bytes_cut=cut_from - offset, broken_copies=copies,
                why="this log's tail diverged from the leader's (it was written in an epoch the leader does not "
                    "continue); none of it was acknowledged under SYNC replication")
    return copies


def restart_at(commitlog, offset: int, dispatcher, queues, keep_from: int = 0) -> list[str]:
    """An empty log starting at ``offset`` (a multiple of the segment size), its first segment file created:
    .broken copies of every segment that held data at or above ``keep_from`` (below it: bytes the leader's log
    holds too, the prefix both share), all other segments and consume queues removed."""
    segments = commitlog.segments
    invariant(offset % segments.segment_size == 0, f"a log starts at a segment start, not {offset}")
    written = commitlog.written_offset
    copies = [str(fs.copy_durably(seg.path, fs.free_name(seg.path, ".broken")))
              for seg in segments.segments if max(seg.start, keep_from) < min(seg.end, written)]
    with commitlog.reshaping, commitlog.lock, dispatcher.lock:
        segments.delete_from(0)
        # The new log's first segment, empty: a start before the first byte is copied finds the log the checkpoint
        # says is flushed to ``offset`` (with no segment file it refuses to start: files missing)
        segments.ensure(offset + 1, offset)
        fs.fsync_dir(segments.directory)
        for key in list(queues.queues):
            queues.queues.pop(key).destroy()
        dispatcher.dispatched_offset = offset
        commitlog.pending.clear()
        commitlog.written_offset = offset
        commitlog.next_queue_offsets = {}
    log.warning("replication.log_restarted", physical_offset=offset, broken_copies=copies)
    return copies
