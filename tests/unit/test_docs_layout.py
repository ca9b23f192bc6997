"""The README's *Layout* block matches the tree (issue 33: docs that match the tree).

Every path the block names exists, and every part a newcomer looks for is named in it: each top-level
entry git tracks, each package under ``services/``, each feature package of ``core/mqstore/`` and each
compose file. A folder added without a line in *Layout*, or a line left behind by a move, fails here.
"""

from __future__ import annotations

import fnmatch
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def layout_block() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Layout\n")
    opening = text.index("```\n", start) + 4
    return text[opening:text.index("```\n", opening)]


def named_paths(block: str) -> list[str]:
    """The paths in the first column: a line that does not start with a space names one path, or several
    separated by commas (the last may be a glob such as requirements*.lock)."""
    paths = []
    for line in block.splitlines():
        if not line or line.startswith(" "):
            continue
        head = re.split(r"\s{2,}", line, maxsplit=1)[0]
        paths += [part.strip() for part in head.split(",") if part.strip()]
    return paths


def tracked_top_level() -> set[str]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked archive): the tree
        return {p.name for p in ROOT.iterdir() if p.name not in (".git", ".venv", ".venv-rmq", "data")}
    return {line.split("/", 1)[0] for line in listed.splitlines() if line}


def test_every_path_the_layout_names_exists():
    missing = [p for p in named_paths(layout_block()) if not list(ROOT.glob(p.rstrip("/")))]
    assert missing == [], f"README's Layout names paths that do not exist: {missing}"


def test_the_layout_names_every_top_level_entry_service_package_and_core_feature():
    block = layout_block()
    named = named_paths(block)

    def mentioned(path: str) -> bool:
        return any(fnmatch.fnmatch(path, n.rstrip("/")) or n.startswith(path + "/") for n in named)

    wanted = sorted(tracked_top_level() - {".git"})
    assert [p for p in wanted if not mentioned(p)] == [], "top-level entries missing from README's Layout"
    services = sorted(f"services/{d.name}" for d in (ROOT / "services").iterdir()
                      if d.is_dir() and not d.name.startswith(("_", ".")))
    assert [s for s in services if not mentioned(s)] == [], "service packages missing from README's Layout"
    features = sorted(d.name for d in (ROOT / "core" / "mqstore").iterdir()
                      if d.is_dir() and (d / "__init__.py").exists())
    assert [f for f in features if f"{f}/" not in block] == [], "core packages missing from README's Layout"
    compose = sorted(p.name for p in ROOT.glob("docker-compose*.yml"))
    assert [c for c in compose if not mentioned(c)] == [], "compose files missing from README's Layout"
