"""What replication does to the commit log's files, beside appends: read whole records for a replica,
cut a diverged tail, start a new log at a leader's first segment. The same steps as
mqstore.log.recovery.repair: durable ``.broken`` copies first, then zero what was written past the cut in
the segment that is cut, delete the later ones and fsync the directory; consume queues follow. A copy
holds only the bytes the log loses, at their positions in the segment, the rest of the file a hole
(fs.copy_range_durably), and only they are zeroed: a failover's diverged tail is a few KiB to MiB of a
segment of up to a GiB, and copying the whole segment durably, then zeroing and flushing the rest of it,
took ~6 s on the HA compose file's 1 GiB segments while the new leader waited for this replica to join its
in-sync set (SYNC appends refused meanwhile with two nodes up: `make compose-check-chaos`), and a segment's
size of disk at every failover.

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


def _broken_copies(segments, start: int, end: int) -> list[str]:
    """Durable .broken copies of the log's bytes [start, end), one a segment holding some (fs.copy_range_durably:
    each at its positions in a file of the segment's size)."""
    return [str(fs.copy_range_durably(seg.path, fs.free_name(seg.path, ".broken"), max(seg.start, start) - seg.start,
                                      min(seg.end, end) - seg.start, seg.size))
            for seg in segments.segments if max(seg.start, start) < min(seg.end, end)]


def truncate(commitlog, offset: int, dispatcher, queues) -> list[str]:
    """Cut the log to ``offset`` (a record start below the written offset); .broken copies of the bytes cut, in
    each segment that loses some. Returns the copies' paths."""
    segments = commitlog.segments
    cut_from = commitlog.written_offset
    invariant(commitlog.min_offset <= offset < cut_from, f"truncate to {offset} inside [{commitlog.min_offset}, "
                                                           f"{cut_from})")
    copies = _broken_copies(segments, offset, cut_from)
    failpoints.hit("replication.truncate.after_copy")
    with commitlog.reshaping, commitlog.lock, dispatcher.lock:
        seg = segments.find(offset)
        # the bytes written past the cut, not the rest of the segment: past the written offset it holds nothing
        seg.zero_range(offset - seg.start, min(seg.size, cut_from - seg.start))
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
    .broken copies of what the log held at or above ``keep_from`` (below it: bytes the leader's log holds too, the
    prefix both share), every segment and consume queue removed."""
    segments = commitlog.segments
    invariant(offset % segments.segment_size == 0, f"a log starts at a segment start, not {offset}")
    copies = _broken_copies(segments, keep_from, commitlog.written_offset)
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
