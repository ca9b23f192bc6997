"""The lock files and pyproject.toml agree, and each lock file is exactly what its group needs.

Groups: runtime (pyproject ``dependencies`` -> requirements.lock), build (the ``build`` extra, the
[build-system] requirements and pip -> requirements-build.lock, on top of the runtime lock), tools,
test and spark (their extras -> requirements-tools.lock / requirements-test.lock /
requirements-spark.lock). Every pin is exact (``==``);
a package pinned in two files has one version; each lock holds the whole closure of its group's
requirements (read from the installed packages' metadata: ``make setup`` installs every lock) and
nothing else, so the runtime image (requirements.lock only) has everything it imports and no more.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS = {"runtime": "requirements.lock", "build": "requirements-build.lock", "tools": "requirements-tools.lock",
         "test": "requirements-test.lock", "spark": "requirements-spark.lock"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


def lock(group: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for number, line in enumerate((ROOT / LOCKS[group]).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"{LOCKS[group]}:{number}: {line!r} is not an exact pin NAME==VERSION"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{LOCKS[group]}:{number}: {name} pinned twice"
        pins[name] = match.group(2)
    return pins


def roots(group: str) -> list[Requirement]:
    project = PYPROJECT["project"]
    if group == "runtime":
        return [Requirement(r) for r in project["dependencies"]]
    found = [Requirement(r) for r in project["optional-dependencies"][group]]
    if group == "build":
        found += [Requirement(r) for r in PYPROJECT["build-system"]["requires"]] + [Requirement("pip")]
    return found


def base(group: str) -> dict[str, str]:
    """Pins the group's lock file is installed on top of (the build lock goes with the runtime lock)."""
    return lock("runtime") if group == "build" else {}


def closure(requirements: list[Requirement]) -> set[str]:
    """Names of the packages these need, transitively, by the installed metadata (extras not taken)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{name} is not installed: run `make setup` (it installs every lock file)")
        todo.extend(Requirement(r) for r in requires)
    return seen


@pytest.mark.parametrize("group", sorted(LOCKS))
def test_pyproject_pins_are_exact_and_those_of_the_lock(group):
    pins = {**base(group), **lock(group)}
    for requirement in roots(group):
        if requirement.name == "pip":
            continue  # the installer: pinned in the build lock only
        specs = list(requirement.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"pyproject.toml: {requirement} is not an exact pin"
        name = canonicalize_name(requirement.name)
        assert pins.get(name) == specs[0].version, f"pyproject.toml pins {requirement}, {LOCKS[group]} {pins.get(name)}"


def test_a_package_in_two_lock_files_has_one_version():
    versions: dict[str, tuple[str, str]] = {}
    for group in LOCKS:
        for name, version in lock(group).items():
            other = versions.setdefault(name, (version, LOCKS[group]))
            assert other[0] == version, f"{name}: {version} in {LOCKS[group]}, {other[0]} in {other[1]}"


@pytest.mark.parametrize("group", sorted(LOCKS))
def test_each_lock_is_the_closure_of_its_group(group):
    needed = closure(roots(group)) - set(base(group))
    pinned = set(lock(group))
    assert needed - pinned == set(), f"{LOCKS[group]} misses {sorted(needed - pinned)}"
    assert pinned - needed == set(), f"{LOCKS[group]} holds {sorted(pinned - needed)}, which its group does not need"
    for name, version in {**base(group), **lock(group)}.items():
        installed = importlib.metadata.version(name)
        assert installed == version, f"{name} {installed} is installed, {LOCKS[group]} pins {version}: make setup"
    for name in needed | set(base(group)):
        for requirement in importlib.metadata.requires(name) or []:
            req = Requirement(requirement)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            version = {**base(group), **lock(group)}[canonicalize_name(req.name)]
            assert req.specifier.contains(version, prereleases=True), f"{name} needs {req}; the pin is {version}"
