"""Opening one queue's compaction log directory after a clean stop or a crash (RocketMQ's rule, reference
§6.7: the sparse index is the source of truth for where a segment's valid data ends).

  found on open                                       action
  --------------------------------------------------- ----------------------------------------------
  no directory (a new queue)                          created with its parents, each made durable in the
                                                      directory holding it (the creation rule, fs.make_dirs)
  the leftovers of an install cut short               mqstore.fs.recover_install: the old or new set
  ``*.tmp`` files, the ``staging/`` folder             removed (garbage of a round or a state write)
  the newest segment has a .log without .cq or back   the other is created empty (a crash in a roll)
  a sealed segment's .cq without its .log, whose      kept: the segment is in the object storage tier
  FINISHED upload the tier names (``tiered``)         (mqstore.compaction.tier), read from there
  any other .log without its .cq (or the reverse)     FailedPrecondition naming the file: refuse to start
  a torn last index entry (length not a multiple       cut (logged)
  of 46)
  index entries whose record is not (whole, valid)    cut from there (logged); the log is cut to the
  in the active segment                               end of the last valid entry
"""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Callable

import structlog

from mqstore import fs
from mqstore.errors import FailedPrecondition
from mqstore.format import compaction_segment as cseg, record_reader, sparse_queue
from mqstore.format.record_reader import RecordError

log = structlog.get_logger("mqstore.compaction")
STAGING = "staging"


def clean_directory(directory: pathlib.Path) -> None:
    fs.make_dirs(directory)  # the creation rule (mqstore.fs): compaction logs are durable data
    fs.recover_install(directory)
    fs.remove_leftovers(directory)
    shutil.rmtree(directory / STAGING, ignore_errors=True)


def segment_bases(directory: pathlib.Path, tiered: Callable[[int], bool] = lambda base: False) -> list[int]:
    """The bases of the segments, in position order; pairs a lone file of the newest segment. A sealed
    segment's lone .cq is kept when ``tiered(base)``: its .log is in the tier."""
    logs = {cseg.parse_log_name(p.name) for p in directory.iterdir()} - {None}
    cqs = {cseg.parse_log_name(p.name[:-len(cseg.INDEX_SUFFIX)] + cseg.LOG_SUFFIX)
           for p in directory.glob("*" + cseg.INDEX_SUFFIX)} - {None}
    bases = sorted(logs | cqs)
    for base in bases:
        if base in logs and base in cqs:
            continue
        lone = cseg.log_name(base) if base in logs else cseg.index_name(base)
        if base != bases[-1] and base in cqs and tiered(base):
            continue
        if base != bases[-1]:
            raise FailedPrecondition(f"{directory / lone} has no partner file (.log/.cq of the same name) and the "
                                     f"tier holds no upload of it: the compaction log is damaged; restore the "
                                     f"directory from a replica")
        missing = cseg.index_name(base) if base in logs else cseg.log_name(base)
        (directory / missing).touch()
        fs.fsync_dir(directory)  # the creation rule (mqstore.fs)
        log.warning("compaction.segment_paired", file=str(directory / missing), why="a crash while rolling")
    return bases


def load_index(directory: pathlib.Path, base: int, *, active: bool) -> list[sparse_queue.SparseEntry]:
    """The entries of segment ``base``; in the active segment, only those whose record is whole and valid
    (the files are cut to them)."""
    cq_path = directory / cseg.index_name(base)
    data = cq_path.read_bytes()
    entries, valid = sparse_queue.decode_all(data)
    if valid != len(data) and not active:
        raise FailedPrecondition(f"{cq_path}: invalid entry at byte {valid} of a sealed segment's index; "
                                 f"restore the directory from a replica")
    if active:
        entries = _whole_records(directory / cseg.log_name(base), base, entries)
        _truncate(cq_path, len(entries) * sparse_queue.ENTRY_SIZE)
        end = entries[-1].position + entries[-1].size - base if entries else 0
        _truncate(directory / cseg.log_name(base), end)
    return entries


def _whole_records(path: pathlib.Path, base: int, entries: list) -> list:
    data = path.read_bytes()
    for i, entry in enumerate(entries):
        at = entry.position - base
        try:
            size = record_reader.check(data, at, len(data), physical_offset=entry.position)
        except RecordError as exc:
            log.warning("compaction.torn_tail_cut", file=str(path), position=entry.position, reason=exc.reason,
                        entries_cut=len(entries) - i)
            return entries[:i]
        if size != entry.size or record_reader.is_blank(data, at):
            return entries[:i]
    return entries


def _truncate(path: pathlib.Path, length: int) -> None:
    if path.stat().st_size != length:
        log.warning("compaction.file_cut", file=str(path), from_bytes=path.stat().st_size, to_bytes=length)
        with open(path, "r+b") as f:
            f.truncate(length)
            os.fsync(f.fileno())
