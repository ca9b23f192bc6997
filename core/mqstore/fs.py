"""The one protocol for replacing files, the only module that renames them, and the rule for creating them.

Creating a file or a directory (the creation rule): a power cut keeps only what was made durable.
The entry of a new file in its directory survives only once the directory is fsynced, and its size
(set by fallocate, ftruncate or writes) only once the file is fsynced or fdatasynced. So every file
or directory the store creates is made durable before anything relies on it (an acknowledged write,
a checkpoint or manifest that counts on it):

  - a file: fsync it once its size and first bytes are set, then fsync its directory
    (:func:`sync_created`); replace_file, copy_durably and install do this for the files they write;
  - a directory: :func:`make_dirs`, which fsyncs the parent of each directory it creates.

A site may defer this to a later point off the hot path (consume queue files and directories are made
durable by the checkpoint that first counts on them), or skip it for a file that is not data: a lock
file, a temporary file, a file derived from the commit log that start rebuilds when it is missing or
cut short. Each creation site says which in a comment naming this rule. Start removes what a cut
leaves of a creation that was not yet durable (empty trailing segments: SegmentQueue.load).
Deleting needs no fsync where a deletion undone by a power cut is redone on start (retention,
leftovers); it needs one where later writes count on the file being gone (truncation).

replace_file(path, data): write ``path.tmp``, fsync it, rename over ``path``, fsync the directory.
After a crash at any step either the old or the new content is at ``path``; a leftover ``*.tmp`` is
garbage and is removed by :func:`remove_leftovers` on start:

  found on start            meaning                               action
  ------------------------- ------------------------------------- ----------------------
  path + path.tmp           crash before or during the rename     delete path.tmp
  path.tmp only             crash before the first rename         delete path.tmp
  path only                 clean                                 nothing

copy_durably(src, dst): the same protocol for a copy that must survive a power loss before its
source is changed (the ``.broken`` copies of ``mqstore repair``): copy into ``dst.tmp``, fsync it,
rename to ``dst``, fsync the directory. ``dst`` is then either absent or complete; a leftover
``dst.tmp`` is garbage (repair removes the leftovers of its directory first), and the source is only
changed after copy_durably returns.

copy_range_durably(src, dst, start, end, size): the same protocol for a copy of only the bytes [start, end) of
``src``, written at their own positions in a file of ``size`` bytes whose rest is a hole (reads as zeros, takes no
disk): the ``.broken`` copy of a replica's diverged tail (mqstore.replication.log_ops), where copying the whole
segment took seconds and a segment's size of disk for a few KiB of cut records.

install(directory, staged, replaced): Kafka's staged segment replacement, for a set of files. The new
files are written and complete in a staging folder (same file system); they replace the files named
``replaced`` in ``directory``, all or nothing, even across a crash. Each step ends with an fsync of
the directory (files are fsynced before their first rename):

  1. move each staged file to ``<name>.cleaned`` in ``directory``       failpoint fs.install.staged (each)
  2. write the manifest ``install.manifest`` (the old and new names),   fs.install.manifest_written
     through replace_file
  3. rename each ``.cleaned`` to ``<name>.swap``; once the last one is  fs.install.swapped (each),
     durable the install is committed                                  fs.install.committed
  4. rename each old file to ``<name>.deleted``                         fs.install.old_deleted (each)
  5. rename each ``.swap`` to its name                                  fs.install.renamed (each)
  6. delete each ``.deleted``, then the manifest                        fs.install.cleaned_up (each)

:func:`recover_install` resolves what a crash left, on start, before anything reads the directory:

  found in the directory                          meaning                      action: the result is
  ----------------------------------------------- ---------------------------- ----------------------------
  nothing of the below                            no install was under way     nothing (the old or new set)
  ``.cleaned`` files, no manifest                 crash in step 1              delete them: the old set
  ``install.manifest.tmp``                        crash writing the manifest   delete it (and the above)
  manifest and a ``.cleaned`` file (``.swap``     crash in step 2 or 3, before delete .cleaned, .swap and
  files too or not)                               the commit                   the manifest: the old set
  manifest, ``.swap`` files, no ``.cleaned``      crash after the commit, in   finish steps 4 to 6: the
  (``.deleted`` files too or not)                 step 4 or 5                  new set
  manifest, no ``.cleaned`` nor ``.swap``         crash in step 6              finish step 6: the new set
  ``.deleted`` files, no manifest                 (not left by install)        delete them

Step 4 is redone only while every new file is still ``.swap`` (step 5 starts after step 4 has
finished), so an old file is never confused with a new one of the same name. A directory takes one
install at a time, and no other file in it may end in .cleaned, .swap or .deleted. The staging folder
is the caller's: what a crash left there is garbage.
"""

from __future__ import annotations

import enum
import json
import os
import pathlib
import uuid
import shutil
from typing import Sequence

import structlog

from mqstore import failpoints
from mqstore.errors import FailedPrecondition, invariant

log = structlog.get_logger()

TMP_SUFFIX = ".tmp"
COPY_CHUNK_BYTES = 8 << 20  # copy_range_durably reads and writes this much at a time
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
INSTALL_MANIFEST = "install.manifest"


def fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_created(fd: int, path: pathlib.Path) -> None:
    """Make the creation of the file open as ``fd`` at ``path`` durable (the creation rule): its size
    and contents so far, then its entry in its directory."""
    os.fsync(fd)
    fsync_dir(path.parent)


def make_dirs(directory: pathlib.Path, *, sync: bool = True) -> list[pathlib.Path]:
    """``mkdir -p``; returns the directories it created, parents first. With ``sync`` each one's entry
    is made durable at once (the creation rule: its parent is fsynced); without, the caller must
    :func:`sync_dirs` them before anything counts on them."""
    missing = []
    at = directory
    while not at.is_dir():
        missing.append(at)
        at = at.parent
    created = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            # made meanwhile by another thread, whose sync may not have run yet: sync it here too
        created.append(path)
    if sync:
        sync_dirs(created)
    return created


def sync_dirs(created: Sequence[pathlib.Path]) -> None:
    """Make the entries of the directories ``created`` (by :func:`make_dirs`) durable."""
    for parent in dict.fromkeys(path.parent for path in created):
        fsync_dir(parent)


def replace_file(path: pathlib.Path, data: bytes, *, before_rename=None) -> None:
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: give the bytes back now, not at the next start
        raise
    finally:
        os.close(fd)
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    fsync_dir(path.parent)


def rename_durably(src: pathlib.Path, dst: pathlib.Path) -> None:
    os.replace(src, dst)
    fsync_dir(dst.parent)


def copy_durably(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """Copy ``src`` to ``dst`` through ``dst.tmp`` (see the module docstring); returns ``dst``."""
    tmp = dst.with_name(dst.name + TMP_SUFFIX)
    shutil.copyfile(src, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)
    return dst


def copy_range_durably(src: pathlib.Path, dst: pathlib.Path, start: int, end: int, size: int) -> pathlib.Path:
    """Copy bytes [start, end) of ``src`` to the same positions of ``dst``, a file of ``size`` bytes, sparse
    elsewhere, through ``dst.tmp`` (see the module docstring); returns ``dst``."""
    invariant(0 <= start <= end <= size, f"a range [{start}, {end}) inside a file of {size} bytes")
    tmp = dst.with_name(dst.name + TMP_SUFFIX)
    with open(src, "rb") as source, open(tmp, "wb") as target:
        os.ftruncate(target.fileno(), size)
        position = start
        while position < end:
            data = os.pread(source.fileno(), min(COPY_CHUNK_BYTES, end - position), position)
            if not data:
                raise OSError(f"{src} ends at {position}, before {end}")
            os.pwrite(target.fileno(), data, position)
            position += len(data)
        os.fsync(target.fileno())
    os.replace(tmp, dst)
    fsync_dir(dst.parent)
    return dst


def kept_id(path: pathlib.Path) -> str:
    """An id made at the first call (12 hex digits) and kept in ``path`` after, so that a restarted service
    is the same instance to others (its retention hold's name)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, uuid.uuid4().hex[:12].encode())
    return path.read_text().strip()


def free_name(path: pathlib.Path, suffix: str) -> pathlib.Path:
    """``path`` + ``suffix``, or + ``suffix.1``, ``.2``... for the first that does not exist, so that
    a copy never overwrites an older one (a second repair must not lose the first one's bytes)."""
    candidate = path.with_name(path.name + suffix)
    for n in range(1, 10_000):
        if not candidate.exists():
            return candidate
        candidate = path.with_name(f"{path.name}{suffix}.{n}")
    raise FileExistsError(f"{path.parent} holds 10,000 copies {path.name}{suffix}.N: remove old ones")


def remove_leftovers(directory: pathlib.Path) -> list[pathlib.Path]:
    removed = []
    if directory.is_dir():
        for tmp in directory.glob("*" + TMP_SUFFIX):
            tmp.unlink()
            removed.append(tmp)
    return removed


# ---- the staged install -------------------------------------------------------------------------------

class InstallRecovery(enum.Enum):
    """What :func:`recover_install` found and did."""

    NONE = "none"                # no install was under way
    ROLLED_BACK = "rolled back"  # the install had not committed: the old set stays
    COMPLETED = "completed"      # the install had committed: it was finished, the new set is in place


def _suffixed(directory: pathlib.Path, name: str, suffix: str) -> pathlib.Path:
    return directory / (name + suffix)


def fsync_file(path: pathlib.Path) -> None:
    """fsync an existing file by its path (its data and size)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install(directory: pathlib.Path, staged: Sequence[pathlib.Path], replaced: Sequence[str]) -> None:
    """Put the complete files ``staged`` (each keeps its name) into ``directory`` in place of the files
    named ``replaced`` (which may share names with them), by the protocol in the module docstring."""
    names = [path.name for path in staged]
    if len(set(names)) != len(names) or any(os.sep in name for name in replaced):
        raise ValueError(f"install needs distinct staged file names and plain replaced names: {names}, {replaced}")
    for path in staged:  # 1
        fsync_file(path)
        os.replace(path, _suffixed(directory, path.name, CLEANED_SUFFIX))
        failpoints.hit("fs.install.staged")
    fsync_dir(directory)
    manifest = json.dumps({"version": 1, "new": names, "old": list(replaced)}).encode()
    replace_file(directory / INSTALL_MANIFEST, manifest)  # 2
    failpoints.hit("fs.install.manifest_written")
    for name in names:  # 3
        os.replace(_suffixed(directory, name, CLEANED_SUFFIX), _suffixed(directory, name, SWAP_SUFFIX))
        failpoints.hit("fs.install.swapped")
    fsync_dir(directory)
    failpoints.hit("fs.install.committed")
    _finish_install(directory, names, list(replaced))
    log.info("fs.installed", directory=str(directory), new=names, replaced=list(replaced))


def _finish_install(directory: pathlib.Path, new: list[str], old: list[str]) -> None:
    """Steps 4 to 6, idempotent: also what recovery runs after a crash past the commit."""
    if all(_suffixed(directory, name, SWAP_SUFFIX).exists() for name in new):  # 4: step 5 not begun
        for name in old:
            if (directory / name).exists():
                os.replace(directory / name, _suffixed(directory, name, DELETED_SUFFIX))
                failpoints.hit("fs.install.old_deleted")
        fsync_dir(directory)
    for name in new:  # 5
        swap = _suffixed(directory, name, SWAP_SUFFIX)
        if swap.exists():
            os.replace(swap, directory / name)
            failpoints.hit("fs.install.renamed")
    fsync_dir(directory)
    for name in old:  # 6
        _suffixed(directory, name, DELETED_SUFFIX).unlink(missing_ok=True)
        failpoints.hit("fs.install.cleaned_up")
    (directory / INSTALL_MANIFEST).unlink()
    fsync_dir(directory)


def recover_install(directory: pathlib.Path) -> InstallRecovery:
    """Resolve the leftovers of an install cut short (the table in the module docstring): afterwards
    ``directory`` holds the complete old set or the complete new set, and no install file."""
    manifest_path = directory / INSTALL_MANIFEST
    cleaned, swaps, deleted = (sorted(directory.glob("*" + suffix))
                               for suffix in (CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX))
    if not manifest_path.exists():
        if swaps:
            raise FailedPrecondition(f"{directory} holds {[p.name for p in swaps]} but no {INSTALL_MANIFEST}: an "
                                     f"install cannot be resolved without it; restore it, or move the .swap files "
                                     f"aside to keep the old files")
        manifest_tmp = manifest_path.with_name(manifest_path.name + TMP_SUFFIX)
        uncommitted = cleaned + ([manifest_tmp] if manifest_tmp.exists() else [])
        _remove(directory, uncommitted + deleted)
        return InstallRecovery.ROLLED_BACK if uncommitted else InstallRecovery.NONE
    new, old = _read_manifest(manifest_path)
    if cleaned:  # not committed
        _remove(directory, cleaned + swaps + [manifest_path])
        log.warning("fs.install_rolled_back", directory=str(directory), new=new, kept=old)
        return InstallRecovery.ROLLED_BACK
    _finish_install(directory, new, old)
    log.warning("fs.install_completed", directory=str(directory), new=new, replaced=old)
    return InstallRecovery.COMPLETED


def _read_manifest(path: pathlib.Path) -> tuple[list[str], list[str]]:
    try:
        manifest = json.loads(path.read_bytes())
        return [str(n) for n in manifest["new"]], [str(n) for n in manifest["old"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise FailedPrecondition(f"{path} is unreadable ({exc}); it names the files of an install cut short. "
                                 f"Without it the install cannot be resolved: restore it from a backup") from None


def _remove(directory: pathlib.Path, paths: list[pathlib.Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
    if paths:
        fsync_dir(directory)
        log.warning("fs.install_leftovers_removed", directory=str(directory), files=[p.name for p in paths])
