"""Start-up: resolve what a crash left in the index directory, open every file, find damage.

Leftovers are resolved by this table, in this order (each step is safe to repeat if start-up itself
crashes):

  found on start                     meaning                                  action
  ---------------------------------- ---------------------------------------- ----------------------------
  *.tmp                              crash before a rename (compact, checkpoint) delete (mqstore.fs)
  N.rebuild                          crash during a rebuild                   delete; the range stays
                                                                              "needs rebuild"
  S-E.damaged and N.idx/N.cidx with  crash while a rebuild was being renamed  delete those files (partial
  S <= N < E                         into place                               rebuild); the range stays
  N.idx and N.cidx                   crash after the compact rename, before   compact verified (CRC): delete
                                     the unsealed file was deleted            N.idx; else delete N.cidx
  N.cidx here, and FINISHED for it   crash after a tier move's FINISHED was   delete the local copy (the
  in the tier manifest               recorded, before the local file went     tier copy was verified)
  the tier manifest's files          a crash in a change or a compaction of   mqstore.index.tier_manifest's
                                     the manifest, or the version before's    table (settle)
                                     tier-manifest.json
  a STARTED attempt in the manifest  crash during a tier move                 keep the local file; the
                                                                              first maintenance round
                                                                              deletes the attempt's object
                                                                              (lifecycle.tidy_tier), and
                                                                              any object under index/ the
                                                                              manifest does not name
  a file failing its checks          damaged or truncated                     quarantine: rename to
                                                                              S-E.damaged (a marker for a
                                                                              tier file, forgotten by the
                                                                              manifest), E = next name
  no (or a corrupt) checkpoint       crash before the first checkpoint, or    corrupt one kept as .broken;
  while files exist                  its bytes are bad                        the newest unsealed file is
                                                                              quarantined with an empty
                                                                              range; resume at its name
  entries past the checkpoint that   a power loss tore mmap pages             quarantine the newest file
  fail their checks                                                           ([name, checkpoint) rebuilds)
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import structlog

from mqstore import fs
from mqstore.errors import DataLoss
from mqstore.format import compact_index
from mqstore.format.index_file import IndexFile

from . import checkpoint as ckpt
from . import files as F
from .config import IndexConfig
from .tier import IndexTier, TierReader
from .tier_manifest import TierManifest

log = structlog.get_logger("index.recovery")


@dataclass
class Recovered:
    handles: dict[int, F.Handle] = field(default_factory=dict)
    damaged: dict[int, int] = field(default_factory=dict)  # start -> end physical offset
    resume_physical_offset: int | None = None  # None: nothing indexed, the follower starts at the earliest
    manifest: TierManifest | None = None  # which tier objects hold which files (None without a tier)


def _names(directory: pathlib.Path, suffix: str) -> dict[int, pathlib.Path]:
    found = {}
    for path in directory.glob("*" + suffix):
        try:
            found[F.parse_name(path.name, suffix)] = path
        except ValueError:
            log.warning("index.unknown_file", path=str(path))
    return found


def _delete(path: pathlib.Path, why: str) -> None:
    log.info("index.leftover_deleted", path=str(path), why=why)
    path.unlink(missing_ok=True)
    fs.fsync_dir(path.parent)


def _damaged_ranges(directory: pathlib.Path) -> dict[int, int]:
    ranges = {}
    for path in directory.glob("*" + F.DAMAGED_SUFFIX):
        start, end = F.parse_damaged(path.name)
        ranges[start] = end
    return ranges


def _verified_compact(reader) -> bool:
    try:
        compact_index.verify(reader, compact_index.read_header(reader))
    except DataLoss as exc:
        log.warning("index.compact_copy_bad", file=reader.name, error=str(exc))
        return False
    finally:
        reader.close()
    return True


def _resolve_leftovers(directory: pathlib.Path, manifest: TierManifest | None) -> None:
    fs.remove_leftovers(directory)
    for path in directory.glob("*" + F.REBUILD_SUFFIX):
        _delete(path, "unfinished rebuild")
    damaged = _damaged_ranges(directory)
    for suffix in (F.IDX_SUFFIX, F.CIDX_SUFFIX):
        for first, path in _names(directory, suffix).items():
            if any(start <= first < end for start, end in damaged.items()):
                _delete(path, "partial rebuild of a quarantined range")
    cidx = _names(directory, F.CIDX_SUFFIX)
    for first, path in _names(directory, F.IDX_SUFFIX).items():
        if first in cidx:
            reader = compact_index.FileRangeReader(cidx[first])
            good = _verified_compact(reader)
            reader.close()
            _delete(path if good else cidx[first], "conversion had finished" if good else "bad compact")
    if manifest is not None:
        for path in _names(directory, F.CIDX_SUFFIX).values():
            if path.name in manifest.finished:
                _delete(path, "tier move had finished")


def _open_all(config: IndexConfig, tier: IndexTier | None, manifest: TierManifest | None,
              broken: dict[int, str]) -> dict[int, F.Handle]:
    directory = config.index_dir
    handles: dict[int, F.Handle] = {}
    for first, path in _names(directory, F.IDX_SUFFIX).items():
        try:
            file = IndexFile.open(path, config.slot_count, config.entry_count)
        except DataLoss as exc:
            broken[first] = str(exc)
            continue
        handles[first] = F.UnsealedHandle(first, file, path)
        handles[first].sealed = True
    for first, path in _names(directory, F.CIDX_SUFFIX).items():
        try:
            handles[first] = F.open_compact_local(path, first)
        except DataLoss as exc:
            broken[first] = str(exc)
    for name, entry in (manifest.finished.items() if manifest is not None else ()):
        first = F.parse_name(name, F.CIDX_SUFFIX)  # the header was checked when the manifest was loaded
        handles[first] = F.CompactHandle(first, TierReader(tier, entry.key, entry.size), entry.header, F.TIER)
    for first, handle in list(handles.items()):
        if handle.info().entries and handle.info().begin_phy_offset != first:
            broken[first] = f"name {first} but first physical offset {handle.info().begin_phy_offset}"
            handles.pop(first).retire()
    return handles


def _load_checkpoint(directory: pathlib.Path) -> ckpt.IndexCheckpoint | None:
    """The checkpoint; None when there is none or it is corrupt (kept as .broken, logged)."""
    path = directory / ckpt.FILE_NAME
    try:
        return ckpt.load(path)
    except ckpt.CorruptIndexCheckpoint as exc:
        log.error("index.checkpoint_corrupt", path=str(path), error=str(exc))
        fs.rename_durably(path, path.with_name(path.name + ".broken"))
        return None


def _torn_after_checkpoint(handle: F.UnsealedHandle, cp: ckpt.IndexCheckpoint) -> str | None:
    """Check the entries written after the checkpoint; why they are not sound, None when they are."""
    file = handle.file
    start = cp.file_index_count if cp.file_physical_offset == handle.first_phy_offset else 1
    last_phy = file.entry(start - 1).phy_offset if start > 1 else file.header.begin_phy_offset
    for number in range(max(start, 1), file.header.index_count):
        entry = file.entry(number)
        if not (0 <= entry.prev_index < number and last_phy <= entry.phy_offset
                <= file.header.end_phy_offset):
            return f"entry {number} written after the checkpoint is torn: {entry}"
        last_phy = entry.phy_offset
    return None


def _quarantine(config: IndexConfig, manifest: TierManifest | None, first: int, end: int, reason: str) -> None:
    directory = config.index_dir
    target = directory / F.damaged_name(first, max(first, end))
    for path in (directory / F.idx_name(first), directory / F.cidx_name(first)):
        if path.exists():
            log.error("index.file_quarantined", path=str(path), reason=reason,
                      rebuild_from=first, rebuild_to=max(first, end))
            fs.rename_durably(path, target)
            return
    log.error("index.tier_file_quarantined", file=F.cidx_name(first), reason=reason,
              rebuild_from=first, rebuild_to=max(first, end))
    fs.replace_file(target, reason.encode("utf-8", "replace"))
    if manifest is not None and F.cidx_name(first) in manifest.finished:
        manifest.forget(F.cidx_name(first))  # its object is an orphan now: the first maintenance round deletes it


def recover(config: IndexConfig, tier: IndexTier | None) -> Recovered:
    """Never calls the tier: tier files open from the manifest, what a crash left there is tidied by the
    first maintenance round, so the index starts (and answers from local files) with the store down."""
    directory = config.index_dir
    fs.make_dirs(directory)  # the creation rule (mqstore.fs)
    manifest = TierManifest.load(directory, tier.name if tier is not None else "")
    if tier is None:
        manifest = None  # nothing on a tier (load refuses otherwise)
    else:
        manifest.settle()  # what a crash left in its files (mqstore.index.tier_manifest's table)
    _resolve_leftovers(directory, manifest)
    broken: dict[int, str] = {}
    handles = _open_all(config, tier, manifest, broken)
    cp = _load_checkpoint(directory)
    top = max(set(handles) | set(broken) | set(_damaged_ranges(directory)), default=None)
    newest = top if top in handles and handles[top].layout == F.UNSEALED else None
    resume = cp.next_physical_offset if cp is not None else None
    if newest is not None and cp is None:
        broken[newest] = "no trustworthy checkpoint: the newest file may hold torn entries"
        resume = newest
    elif newest is not None:
        reason = _torn_after_checkpoint(handles[newest], cp)
        if reason is not None:
            broken[newest] = reason
    if cp is None and newest is None and handles:
        resume = max(h.info().end_phy_offset for h in handles.values())
    for first in broken:
        if first in handles:
            handles.pop(first).retire()
    known = sorted(set(handles) | set(broken) | set(_damaged_ranges(directory)))
    for first, reason in sorted(broken.items()):
        later = [n for n in known if n > first]
        end = later[0] if later else (first if cp is None else resume)
        _quarantine(config, manifest, first, end, reason)
    return Recovered(handles, _damaged_ranges(directory), resume, manifest)

