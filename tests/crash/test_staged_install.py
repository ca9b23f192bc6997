"""The staged install (mqstore.fs.install): a crash at every step, raised in-process or a process exit
(os._exit, like kill -9), then recover_install: the directory holds the complete old set or the
complete new set, never a mix, and nothing else is lost."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from mqstore import failpoints, fs
from mqstore.errors import FailedPrecondition

OLD = {"a.seg": b"old a" * 100, "b.seg": b"old b" * 100}
NEW = {"b.seg": b"new b" * 90, "c.seg": b"new c" * 80}  # b.seg is replaced by a file of the same name
UNTOUCHED = {"z.seg": b"not part of the install"}
REPLACED = ["a.seg", "b.seg"]
# Where a crash leaves the install: before the commit the old set stays, after it the new set comes.
OUTCOME = {"fs.install.staged": OLD, "fs.install.manifest_written": OLD,
           "fs.install.swapped": OLD,  # the first of two renames: one .cleaned is left
           "fs.install.committed": NEW, "fs.install.old_deleted": NEW, "fs.install.renamed": NEW,
           "fs.install.cleaned_up": NEW}
INSTALL_POINTS = sorted(name for name in failpoints.KNOWN if name.startswith("fs.install."))


def _prepare(root: pathlib.Path) -> tuple[pathlib.Path, list[pathlib.Path]]:
    directory, staging = root / "dir", root / "staging"
    directory.mkdir()
    staging.mkdir()
    for name, data in {**OLD, **UNTOUCHED}.items():
        (directory / name).write_bytes(data)
    staged = []
    for name, data in NEW.items():
        (staging / name).write_bytes(data)
        staged.append(staging / name)
    return directory, staged


def _contents(directory: pathlib.Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def test_every_install_failpoint_has_an_expected_outcome():
    assert set(OUTCOME) == set(INSTALL_POINTS)


def test_an_install_replaces_the_set_and_leaves_nothing_behind(tmp_path):
    directory, staged = _prepare(tmp_path)
    fs.install(directory, staged, REPLACED)
    assert _contents(directory) == {**NEW, **UNTOUCHED}
    assert fs.recover_install(directory) is fs.InstallRecovery.NONE
    assert not any((tmp_path / "staging").iterdir())


@pytest.mark.parametrize("point", INSTALL_POINTS)
def test_a_raise_at_each_step_recovers_to_the_old_or_the_new_set(tmp_path, failpoint, point):
    directory, staged = _prepare(tmp_path)
    with failpoint.armed(point), pytest.raises(failpoints.FailpointHit):
        fs.install(directory, staged, REPLACED)
    outcome = fs.recover_install(directory)
    assert _contents(directory) == {**OUTCOME[point], **UNTOUCHED}
    expected = fs.InstallRecovery.COMPLETED if OUTCOME[point] is NEW else fs.InstallRecovery.ROLLED_BACK
    assert outcome is expected
    assert fs.recover_install(directory) is fs.InstallRecovery.NONE  # resolved for good


_CHILD = """
import pathlib, sys
from mqstore import failpoints, fs
from mqstore.errors import FailedPrecondition
failpoints.arm(sys.argv[1], "exit")
fs.install(pathlib.Path(sys.argv[2]), [pathlib.Path(p) for p in sys.argv[4:]], sys.argv[3].split(","))
"""


@pytest.mark.parametrize("point", INSTALL_POINTS)
def test_a_process_exit_at_each_step_recovers_to_the_old_or_the_new_set(tmp_path, point):
    directory, staged = _prepare(tmp_path)
    child = subprocess.run([sys.executable, "-c", _CHILD, point, str(directory), ",".join(REPLACED),
                            *map(str, staged)], capture_output=True, timeout=60)
    assert child.returncode == 137, child.stderr.decode()
    fs.recover_install(directory)
    assert _contents(directory) == {**OUTCOME[point], **UNTOUCHED}


def test_recovery_without_a_manifest_keeps_the_old_set_or_refuses(tmp_path):
    directory, _ = _prepare(tmp_path)
    (directory / "c.seg.cleaned").write_bytes(b"half an install")
    (directory / "install.manifest.tmp").write_bytes(b"{")
    assert fs.recover_install(directory) is fs.InstallRecovery.ROLLED_BACK
    assert _contents(directory) == {**OLD, **UNTOUCHED}
    (directory / "c.seg.swap").write_bytes(b"no manifest names it")
    with pytest.raises(FailedPrecondition, match="no install.manifest"):
        fs.recover_install(directory)
