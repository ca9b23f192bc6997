"""The slow duties of the IndexStore: conversion to the compact layout, tier moves (and tidying what a crash
left on the tier), retention, and putting rebuilt files in place. Each is crash-safe; what a crash between two
steps leaves is resolved on start by the table in recovery.py. The caller holds the store's maintenance lock;
the file table (``store.files()``, which holds the store lock) is used only to pick a file and to swap it,
never during slow I/O.
"""

from __future__ import annotations

import structlog

from mqstore import failpoints, fs
from mqstore.errors import MqStoreError, Unavailable, invariant
from mqstore.format import compact_index
from mqstore.format.index_file import CorruptIndexFile

from . import files as F
from .tier import TierReader
from .tier_manifest import TierFile

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
    """Move up to ``max_files`` due compact files, each in two phases (mqstore.index.tier_manifest):

      1. STARTED: a fresh key recorded in the manifest (durable)        crash: the object may exist;
                                                                        tidy_tier deletes it
      2. put the object (if absent), read it back, verify header + CRCs crash: as 1; a failure: the
                                                                        object is deleted (or left to
                                                                        tidy_tier), the move retried
      3. FINISHED: key, size and header recorded (durable)              crash: start deletes the local
                                                                        copy (recovery.py)
      4. the handle swapped to the tier copy, the local file deleted
    """
    tidy_tier(store)
    done = 0
    horizon_ms = store.clock.now_ms() - store.config.tier_min_age_ms
    while done < max_files:
        handle = _pick(store, lambda h: h.layout == F.COMPACT and h.tier == F.LOCAL
                       and h.header.end_timestamp_ms <= horizon_ms)
        if handle is None:
            break
        try:
            entry = _copy_to_tier(store, handle)
        finally:
            handle.unpin()
        _swap(store, handle, F.CompactHandle(handle.first_phy_offset, TierReader(store.tier, entry.key, entry.size),
                                             entry.header, F.TIER))
        _unlink(handle.path)
        log.info("index.file_moved_to_tier", tier=store.tier.name, file=handle.path.name, key=entry.key)
        done += 1
    return done


def _copy_to_tier(store, handle: F.CompactHandle) -> TierFile:
    tier, manifest, name = store.tier, store.tier_manifest, handle.path.name
    key = tier.new_key(name)
    manifest.start(name, key)
    failpoints.hit("index.tier.started")
    try:
        tier.put(key, handle.path)
        failpoints.hit("index.tier.after_put")
        reader = TierReader(tier, key, handle.header.size_bytes, verifying=True)
        header = compact_index.read_header(reader)
        if header != handle.header:
            raise CorruptIndexFile(reader.name, "the tier copy's header differs from the local file's")
        compact_index.verify(reader, header)
    except (MqStoreError, OSError):
        _discard(store, name, key)
        raise
    entry = TierFile(key, header.size_bytes, header)
    manifest.finish(name, entry)
    failpoints.hit("index.tier.finished")
    return entry


def _discard(store, name: str, key: str) -> None:
    """A failed attempt: delete its object, then forget it; a store that does not answer leaves both to
    tidy_tier (the attempt stays STARTED, so its object is never trusted). A put that timed out may still
    land after the delete: the next round's tidy_tier lists the tier again."""
    store.tier_untidy = True
    try:
        store.tier.delete(key)
    except Unavailable as exc:
        log.warning("index.tier_discard_failed", key=key, error=str(exc))
        return
    store.tier_manifest.discard(name)


def tidy_tier(store) -> int:
    """Finish what a crash or a failed call left on the tier: delete the object of every STARTED attempt
    and every object under ``index/`` the manifest does not name (orphans), then forget the attempts. Runs
    on the first maintenance round after a start and after a failed attempt or delete (or while an attempt
    is still STARTED); raises Unavailable when the store does not answer (the round fails, the next
    retries). Number of listed objects deleted."""
    manifest, tier = store.tier_manifest, store.tier
    if not store.tier_untidy and not manifest.started:
        return 0
    keep = {f.key for f in manifest.finished.values()}
    orphans = sorted(set(tier.keys()) - keep)
    for key in orphans:
        tier.delete(key)
        log.info("index.tier_orphan_deleted", tier=tier.name, key=key)
    for key in set(manifest.started.values()) - keep - set(orphans):
        tier.delete(key)  # not listed: its put never landed, or lands late (deleted again at the next tidy)
    manifest.discard_all()
    store.tier_untidy = False
    return len(orphans)


def _delete_tier_file(store, handle: F.CompactHandle) -> None:
    """Forget the file (durable), then delete its object; an object left by a failed delete is an orphan
    tidy_tier deletes."""
    name = F.cidx_name(handle.first_phy_offset)
    entry = store.tier_manifest.forget(name)
    try:
        store.tier.delete(entry.key)
    except Unavailable as exc:
        log.warning("index.tier_delete_failed", key=entry.key, error=str(exc))
        store.tier_untidy = True


def delete_before(store, log_min_physical_offset: int) -> int:
    with store.files() as table:
        victims, expired = table.remove_before(log_min_physical_offset)
    for handle in victims:
        handle.retire()
        if handle.tier == F.TIER:
            _delete_tier_file(store, handle)
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
