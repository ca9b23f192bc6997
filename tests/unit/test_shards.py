"""The suite's split into shards (tests/support/shards.py): every test in exactly one shard, a module and a
whole directory never split, heavy units spread, the same split whatever order the tests were collected in."""

from __future__ import annotations

import pytest

from tests.support import shards


def test_units_are_modules_and_whole_directories():
    assert shards.unit_of("tests/unit/test_x.py::test_a[1]") == "tests/unit/test_x.py"
    assert shards.unit_of("tests/spark/test_round.py::test_b") == "tests/spark/"


def test_every_unit_lands_in_exactly_one_shard_and_the_heavy_ones_apart():
    tests = {f"tests/m{i}.py": 1 + i % 7 for i in range(40)}
    timings = {"tests/m0.py": 300.0, "tests/m1.py": 290.0, "tests/m2.py": 10.0}
    for count in (1, 2, 3):
        split = shards.split(tests, timings, count)
        assert sorted(unit for shard in split for unit in shard) == sorted(tests)
        assert all(a.isdisjoint(b) for i, a in enumerate(split) for b in split[i + 1:])
    first, second = shards.split(tests, timings, 2)
    assert ("tests/m0.py" in first) != ("tests/m1.py" in first)  # the two heaviest are not together
    reordered = dict(reversed(list(tests.items())))
    assert shards.split(reordered, timings, 2) == [first, second]


def test_a_unit_without_a_figure_weighs_by_its_number_of_tests():
    first, second = shards.split({"a.py": 100, "b.py": 1, "c.py": 1}, {}, 2)
    assert first == {"a.py"} and second == {"b.py", "c.py"}


def test_the_shard_option_is_checked():
    assert shards.parse_shard("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "x", "1/"):
        with pytest.raises(ValueError, match="--shard"):
            shards.parse_shard(bad)


def test_this_runs_figures_replace_earlier_ones_unit_by_unit():
    merged = shards.merge_timings([{"a.py": 1.234}, {"b.py": 2.0}], {"a.py": 9.0, "c.py": 3.0})
    assert merged == {"a.py": 1.23, "b.py": 2.0, "c.py": 3.0}
