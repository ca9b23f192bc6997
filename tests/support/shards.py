"""The suite split into shards that run side by side (``scripts/run_suite.py``, what ``make test`` runs).

Most of the suite's wall time is spent waiting: for a server process to import and start, for a lease to
expire, for a killed node to be replaced. Two pytest processes on two cores fill those waits with the other
one's work. A test stays with its module (module-scoped fixtures start once) and every test under a
directory in ``WHOLE_DIRECTORIES`` stays together (the Spark tests share one JVM session per process).

Shards are balanced on the seconds each unit took in an earlier run: ``.pytest-timings.json`` at the
repository's root (written by the runner after every run, not committed) or else ``tests/timings.json``
(committed; ``scripts/run_suite.py --save-timings`` refreshes it). A unit with no figure counts
``UNKNOWN_S_PER_TEST`` per test. The split is a pure function of the collected tests and the figures, so
every shard of one run computes the same one.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCAL_TIMINGS = ROOT / ".pytest-timings.json"
COMMITTED_TIMINGS = ROOT / "tests" / "timings.json"
WHOLE_DIRECTORIES = ("tests/spark/",)
UNKNOWN_S_PER_TEST = 0.5


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes K/N (for example 1/2), not {text!r}") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text}: K must be between 1 and N")
    return index, count


def unit_of(nodeid: str) -> str:
    """The unit a test is scheduled with: its module, or a directory of WHOLE_DIRECTORIES."""
    module = nodeid.split("::", 1)[0]
    for directory in WHOLE_DIRECTORIES:
        if module.startswith(directory):
            return directory
    return module


def load_timings() -> dict[str, float]:
    for path in (LOCAL_TIMINGS, COMMITTED_TIMINGS):
        try:
            figures = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(figures, dict):
            return {str(unit): float(seconds) for unit, seconds in figures.items()}
    return {}


def split(tests_per_unit: Mapping[str, int], timings: Mapping[str, float], count: int) -> list[set[str]]:
    """Units into ``count`` shards, the heaviest first onto the lightest shard (ties by name: deterministic)."""
    weights = {unit: timings.get(unit, UNKNOWN_S_PER_TEST * tests) for unit, tests in tests_per_unit.items()}
    shards: list[set[str]] = [set() for _ in range(count)]
    loads = [0.0] * count
    for unit in sorted(weights, key=lambda name: (-weights[name], name)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        shards[lightest].add(unit)
        loads[lightest] += weights[unit]
    return shards


def merge_timings(figures: Iterable[Mapping[str, float]], previous: Mapping[str, float]) -> dict[str, float]:
    """This run's figures over the previous ones (a unit not run this time keeps its old figure)."""
    merged = dict(previous)
    for shard in figures:
        merged.update(shard)
    return {unit: round(merged[unit], 2) for unit in sorted(merged)}


class UnitTimer:
    """A pytest plugin (``--timings-out PATH``): the seconds of setup, call and teardown of each unit's tests,
    written to PATH as JSON when the session ends."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        unit = unit_of(report.nodeid)
        self.seconds[unit] = self.seconds.get(unit, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({unit: round(s, 2) for unit, s in sorted(self.seconds.items())}, indent=0))
