"""The recovery group: restart time after kill -9 against reading the same log twice.

1. An ASYNC server with ``segment_bytes`` segments is filled with ``log_bytes`` of 1 KiB messages
   (16 producers, 100-message Appends) and killed with SIGKILL (nothing deleted, page cache intact).
2. Restart A, checkpoint kept: the ordinary crash. The store re-checks (CRC included) the records of
   the last ``recheck_segments`` (3) segments up to the checkpoint's flushed offset, and those after
   it (ASYNC flushes every 500 ms, so few are after it): with 256 MiB segments, about 768 MiB.
3. SIGKILL again, remove the ``checkpoint`` file, restart B: without a checkpoint the store re-checks
   every record of the log (length, magic, CRC) and re-dispatches every record into the consume
   queues. This is "recovery of the whole log as unflushed", the figure the target names.
   Time is measured from spawning the process until gRPC health answers SERVING (polled every 5 ms on
   a fresh channel), so it includes the interpreter start and imports; the same for an empty data
   directory is reported as the process floor.
4. The comparison point: reading the log's bytes [min, end) from the segment files twice in a row,
   1 MiB ``preadv`` calls in this process. The page cache is warm for both: nothing is dropped
   before the restarts or before the reads (the log was just written). For scale, the same two
   reads with O_DIRECT (from the disk, page cache bypassed) are reported too, without a target.
After each restart the log must end where it ended before the kill.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import time

from append import create_topic
from procs import CODEC_COMPILED, CODEC_PYTHON, BenchError, GrpcServer, kill9
from reads import fill, store_info

TOPIC = "bench-recovery"
CHUNK = 1 << 20
PAGE = 4096


def read_log(commitlog_dir: pathlib.Path, start: int, end: int, direct: bool = False) -> float:
    """Seconds to read bytes [start, end) of the log through its segment files (names = base offsets).

    ``direct`` reads with O_DIRECT (the page cache is bypassed: the disk's speed, without dropping
    anyone's cache on a shared machine); segment bases and sizes are page multiples, so offsets align.
    """
    files = sorted((int(p.name), p) for p in commitlog_dir.iterdir() if p.name.isdigit())
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    began = time.perf_counter()
    total = 0
    for index, (base, path) in enumerate(files):
        following = files[index + 1][0] if index + 1 < len(files) else None
        if (following is not None and following <= start) or base >= end:
            continue
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            position = max(start - base, 0) // PAGE * PAGE
            stop = min(end - base, os.fstat(fd).st_size)
            while position < stop:
                n = os.preadv(fd, [buffer], position)
                if not n:
                    break
                total += min(n, stop - position) - max(start - base - position, 0)
                position += n
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - began
    buffer.close()
    if total != end - start:
        raise BenchError(f"read {total} bytes of the log, expected {end - start}")
    return elapsed


def _restart(data: pathlib.Path, port: int, segment_bytes: int, name: str, timeout_s: float,
             codec: str = CODEC_COMPILED) -> tuple[GrpcServer, dict]:
    server = GrpcServer.commitlog(data, "ASYNC", port=port, extra=("--segment-size-bytes", str(segment_bytes)),
                                  log_name=f"{name}.log", codec=codec)
    seconds = server.start_timed(port, timeout_s)
    started = server.events("store.started")
    detail = {"seconds": seconds, **({k: started[0].get(k) for k in (
        "unclean", "end_offset", "checked_from", "checked_bytes", "checked_records", "check_s", "torn_bytes_cut",
        "replayed_records")} if started else {})}
    return server, detail


def run(work: pathlib.Path, sizes: dict, log) -> dict:
    data = work / "recovery"
    segment = sizes["segment_bytes"]
    first = GrpcServer.commitlog(data, "ASYNC", extra=("--segment-size-bytes", str(segment)))
    servers = [first.start()]
    try:
        port = first.port
        create_topic(first.target, TOPIC, 8)
        filled = fill(first, TOPIC, sizes["log_bytes"], timeout_s=sizes["fill_timeout_s"])
        before = store_info(first.target)
        log("recovery", "fill", filled)
        kill9(first.proc)
        out = {"fill": filled, "segment_bytes": segment,
               "log_bytes": before.max_physical_offset - before.min_physical_offset,
               "flushed_at_kill": before.flushed_physical_offset, "end_offset": before.max_physical_offset}
        # The last variant is the checkpoint-less restart on the pure-Python codec (its record walk).
        for variant, remove_checkpoint, codec in (("checkpoint_kept", False, CODEC_COMPILED),
                                                  ("checkpoint_removed", True, CODEC_COMPILED),
                                                  ("checkpoint_removed_py", True, CODEC_PYTHON)):
            if remove_checkpoint:
                (data / "checkpoint").unlink()
            server, detail = _restart(data, port, segment, f"recovery-{variant}", sizes["recovery_timeout_s"], codec)
            servers.append(server)
            server.check_codec()
            after = store_info(server.target)
            if after.max_physical_offset != before.max_physical_offset:
                raise BenchError(f"after restart ({variant}) the log ends at {after.max_physical_offset}, "
                                 f"before the kill it ended at {before.max_physical_offset}")
            out[variant] = detail
            log("recovery", variant, detail)
            kill9(server.proc)
        span = (data / "commitlog", before.min_physical_offset, before.max_physical_offset)
        out["read_twice_s"] = [read_log(*span) for _ in range(2)]
        out["read_twice_total_s"] = sum(out["read_twice_s"])
        out["read_twice_direct_s"] = [read_log(*span, direct=True) for _ in range(2)]
        out["read_twice_direct_total_s"] = sum(out["read_twice_direct_s"])
        out["segment_files_bytes"] = sum(p.stat().st_size for p in (data / "commitlog").iterdir())
        floor, floor_detail = _restart(work / "empty", port, segment, "recovery-empty", sizes["recovery_timeout_s"])
        servers.append(floor)
        out["process_floor"] = floor_detail
        log("recovery", "read twice / floor", {"read_s": out["read_twice_total_s"],
                                               "direct_s": out["read_twice_direct_total_s"],
                                               "floor_s": floor_detail["seconds"]})
        return out
    finally:
        for server in servers:
            server.stop()
