"""The slow duties of the IndexStore: conversion to the compact layout, tier moves, retention, and
putting rebuilt files in place. Each is crash-safe; what a crash between two steps leaves is resolved
on start by the table in recovery.py. The caller holds the store's maintenance lock; the file table
(``store.files()``, which holds the store lock) is used only to pick a file and to swap it, never
during slow I/O.
"""

from __future__ import annotations

import structlog

from mqstore import failpoints, fs
from mqstore.errors import invariant
from mqstore.format import compact_index

from . import files as F
from .tier import TierReader

log = structlog.get_logger("index.lifecycle")


def _pick(store, predicate) -> F.Handle | None:
    """The oldest file matching ``predicate`` (never the newest file), pinned."""
    with store.files() as table:
        handle = table.oldest_matching(predicate)
        if handle is not None:
            handle.pin()
        return handle


def _swap(store, old: F.Handle, new: F.Handle) -> None:
    with store.files() as table:
        table.replace(old, new)
    old.retire()


def _unlink(path) -> None:
    path.unlink(missing_ok=True)
    fs.fsync_dir(path.parent)


def _write_compact(store, handle: F.UnsealedHandle) -> F.CompactHandle:
    first = handle.first_phy_offset
    final = store.config.index_dir / F.cidx_name(first)
    tmp = final.with_name(final.name + fs.TMP_SUFFIX)
    tmp.unlink(missing_ok=True)
    header = compact_index.compact_to_file(handle.file, tmp)
    failpoints.hit("index.compact.after_write")
    reader = compact_index.FileRangeReader(tmp)
    try:
        invariant(compact_index.read_header(reader) == header, f"{tmp}: header differs after writing")
        compact_index.verify(reader, header)
    finally:
        reader.close()
    fs.rename_durably(tmp, final)
    failpoints.hit("index.compact.after_rename")
    return F.open_compact_local(final, first)


def convert_sealed(store, max_files: int) -> int:
    done = 0
    while done < max_files:
        handle = _pick(store, lambda h: isinstance(h, F.UnsealedHandle) and h.sealed)
        if handle is None:
            break
        try:
            compact = _write_compact(store, handle)
        finally:
            handle.unpin()
        _swap(store, handle, compact)
        _unlink(handle.path)
        log.info("index.file_compacted", first_physical_offset=handle.first_phy_offset,
                 entries=compact.header.entry_count, size_bytes=compact.header.size_bytes)
        done += 1
    return done


def move_to_tier(store, max_files: int) -> int:
    done, tier = 0, store.tier
    horizon_ms = store.clock.now_ms() - store.config.tier_min_age_ms
    while done < max_files:
        handle = _pick(store, lambda h: h.layout == F.COMPACT and h.tier == F.LOCAL
                       and h.header.end_timestamp_ms <= horizon_ms)
        if handle is None:
            break
        name = F.cidx_name(handle.first_phy_offset)
        reader = None
        try:
            tier.put(name, handle.path)
            failpoints.hit("index.tier.after_put")
            reader = TierReader(tier, name)
            header = compact_index.read_header(reader)
            invariant(header == handle.header, f"tier copy {reader.name}: header differs")
            compact_index.verify(reader, header)
        except BaseException:
            if reader is not None:
                reader.close()
            raise
        finally:
            handle.unpin()
        _swap(store, handle, F.CompactHandle(handle.first_phy_offset, reader, header, F.TIER))
        _unlink(handle.path)
        log.info("index.file_moved_to_tier", tier=tier.name, file=name)
        done += 1
    return done


def delete_before(store, log_min_physical_offset: int) -> int:
    with store.files() as table:
        victims, expired = table.remove_before(log_min_physical_offset)
    for handle in victims:
        handle.retire()
        if handle.tier == F.TIER:
            store.tier.delete(F.cidx_name(handle.first_phy_offset))
        else:
            _unlink(handle.path)
        log.info("index.file_deleted", first_physical_offset=handle.first_phy_offset,
                 end_physical_offset=handle.info().end_phy_offset,
                 log_min_physical_offset=log_min_physical_offset)
    for start, end in expired:
        _unlink(store.config.index_dir / F.damaged_name(start, end))
    return len(victims)


def finish_rebuild(store, range_start: int) -> None:
    with store.files() as table:
        end = table.damaged_end(range_start)
        writer_files = table.rebuild_files(range_start)
    for handle in writer_files:
        handle.file.flush()
        final = store.config.index_dir / F.idx_name(handle.first_phy_offset)
        fs.rename_durably(handle.path, final)
        handle.path = handle.file.path = final
        handle.sealed = True
    failpoints.hit("index.rebuild.after_rename")
    _unlink(store.config.index_dir / F.damaged_name(range_start, end))
    with store.files() as table:
        table.install_rebuilt(range_start)
    log.info("index.range_rebuilt", start_physical_offset=range_start, end_physical_offset=end,
             files=len(writer_files))
