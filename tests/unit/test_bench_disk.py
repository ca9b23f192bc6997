"""bench/diskuse.py: what `make bench` does to stay within the disk it says it needs (bench/README.md); and
bench/append.py's rule for adding rounds to a target's measurement and its round order; bench/txn.py's
summary of the targets by mode."""

from __future__ import annotations

import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import append  # noqa: E402 - bench/ is a folder of scripts, not a package
import diskuse  # noqa: E402
import txn  # noqa: E402


def _write(path: pathlib.Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_allocated_bytes_counts_written_blocks_not_sparse_holes(tmp_path):
    _write(tmp_path / "a" / "data", 64 * 1024)
    with open(tmp_path / "a" / "sparse", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB apparent size, nothing allocated
    assert 64 * 1024 <= diskuse.allocated_bytes(tmp_path) < 1 << 20
    assert diskuse.allocated_bytes(tmp_path / "missing") == 0


def test_prune_deletes_data_directories_but_keeps_logs_and_kept_ones(tmp_path):
    _write(tmp_path / "append-async" / "commitlog" / "00000000000000000000", 4096)
    _write(tmp_path / "recovery" / "commitlog" / "00000000000000000000", 4096)
    _write(tmp_path / "append-async.log", 10)
    diskuse.prune(tmp_path, keep=("recovery",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["append-async.log", "recovery"]


def test_the_watch_reports_the_peak_not_the_end(tmp_path):
    watch = diskuse.DiskWatch(tmp_path, interval_s=3600)  # samples by hand below
    _write(tmp_path / "g" / "big", 256 * 1024)
    watch.sample()
    diskuse.prune(tmp_path)
    watch.sample()
    report = watch.report()
    assert report["disk_peak_gib"] >= 0 and watch.peak_bytes >= 256 * 1024
    assert diskuse.allocated_bytes(tmp_path) == 0
    assert report["disk_min_free_gib"] is not None
    assert "Peak disk use" in diskuse.describe(report) and diskuse.describe({}) == ""


def test_a_target_gets_more_rounds_while_one_rounds_ratio_moves_by_more_than_ten_percent():
    def rounds(*rates):
        return [{"msgs_per_s": r} for r in rates]

    pair = (("SYNC", "redis-always"),)
    steady = {"SYNC": rounds(100, 105, 98), "redis-always": rounds(100, 100, 100)}
    assert not append.unsettled(steady, pair)
    moved = {"SYNC": rounds(100, 125, 98), "redis-always": rounds(100, 100, 100)}
    assert append.unsettled(moved, pair)  # 1.25 against a median of 1.0
    both_moved = {"SYNC": rounds(100, 125, 98), "redis-always": rounds(100, 125, 98)}
    assert not append.unsettled(both_moved, pair)  # the noise fell on both: the ratio held
    assert not append.unsettled({"SYNC": rounds(100)}, pair)  # Redis not measured: nothing to compare


def test_each_fsync_bound_server_follows_a_page_cache_writer_in_one_round_and_an_fsync_in_the_next():
    keys = ["noop", "ASYNC", "SYNC", "ASYNC-py", "SYNC-py"]
    even = append.round_order(keys, ["everysec", "always"], 0)
    odd = append.round_order(keys[:3], ["everysec", "always"], 1)
    assert [n for _, n in even] == ["noop", "ASYNC", "everysec", "SYNC", "always", "ASYNC-py", "SYNC-py"]
    assert [n for _, n in odd] == ["noop", "everysec", "ASYNC", "always", "SYNC"]
    assert [side for side, _ in odd] == ["ours", "redis", "ours", "redis", "ours"]
    # where Redis is not measured (unbatched shapes, or no redis-server), only mqstore's servers run
    assert append.round_order(keys, [], 1) == [("ours", k) for k in keys]
    # every server is measured exactly once per round
    assert sorted(append.round_order(keys, ["everysec", "always"], 3)) == sorted(
        [("ours", k) for k in keys] + [("redis", "everysec"), ("redis", "always")])


def test_the_txn_summary_marks_each_mode_against_each_target():
    def row(mode, kind, n, ratio):
        return {"workload": f"{mode} {kind} {n}", "ratio": ratio, "host": "cluster", "mode": mode, "kind": kind,
                "producers": n}

    table = [row("carried", "rate", 8, 0.62), row("carried", "rate", 32, 0.5), row("carried", "p50", 1, 1.02),
             row("carried", "batched", 8, 5.0), row("unary", "rate", 8, 0.22), row("unary", "p50", 1, 2.27),
             {"workload": "half:OP ratio, 8 producers", "ratio": None}]
    lines = txn.summary(table)
    carried = next(line for line in lines if line.startswith("| cluster, carried"))
    unary = next(line for line in lines if line.startswith("| cluster, unary"))
    assert carried.split(" | ")[1:] == ["0.62 met", "0.50 met", "5.00 met", "-", "1.02 met |"]
    assert unary.split(" | ")[1:] == ["0.22 **missed**", "-", "-", "-", "2.27 **missed** |"]
    assert txn.summary([{"workload": "x", "ratio": 1.0}]) == []  # a table without the target rows
