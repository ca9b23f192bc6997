"""bench/spark_compose.py's arithmetic (the run itself needs Docker: not part of make test): the lines fitted
through each engine's rounds, the crossover where the cluster's line falls below the local engine's (or none
when its cost per record is the higher), the smallest measured size where the cluster won, and the table."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "spark_compose.py"
spec = importlib.util.spec_from_file_location("spark_compose", BENCH)
spark_compose = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spark_compose)


def _row(records: int, local_s: float, spark_s: float) -> dict:
    return {"records": records, "keys": records // 4, "input_bytes": records * 130, "local_passes": 5,
            "local_s": local_s, "local_cpu_s": local_s, "spark_s": spark_s, "spark_cpu_s": 2 * spark_s}


def test_the_cluster_wins_above_where_its_line_crosses_the_local_engines():
    # local 1 s + 10 us/record, cluster 40 s + 2 us/record: equal at 39 / 8e-6 = 4,875,000 records
    rows = [_row(n, 1 + 10e-6 * n, 40 + 2e-6 * n) for n in (1_000_000, 4_000_000, 16_000_000)]
    fitted = spark_compose.fit(rows)
    assert fitted["wall"]["local_fixed_s"] == pytest.approx(1, abs=0.01)
    assert fitted["wall"]["spark_us_per_record"] == pytest.approx(2, abs=0.01)
    assert fitted["wall"]["crossover_records"] == pytest.approx(4_875_000, rel=1e-6)
    assert fitted["wall"]["spark_over_local_per_record"] == 0.2
    assert fitted["smallest_measured_size_cluster_wins"] == 16_000_000
    assert "4,875,000 records" in spark_compose.markdown({"meta": _meta(), "rows": rows, "fit": fitted})


def test_no_crossover_when_the_clusters_cost_per_record_is_the_higher():
    rows = [_row(n, 0.5 + 5e-6 * n, 30 + 8e-6 * n) for n in (50_000, 200_000, 800_000)]
    fitted = spark_compose.fit(rows)
    assert fitted["wall"]["crossover_records"] is None and fitted["wall"]["crossover"].startswith("none")
    assert fitted["smallest_measured_size_cluster_wins"] is None
    text = spark_compose.markdown({"meta": _meta(), "rows": rows, "fit": fitted})
    assert "none up to the largest size measured" in text and text.count("\n| 200,000 |") == 1


def test_a_clusters_line_that_falls_with_size_gives_no_crossover():
    """Wall times on a loaded machine: the smallest round's fixed cost noisier than the per-record cost."""
    rows = [_row(n, 1e-5 * n, s) for n, s in ((50_000, 160.6), (200_000, 95.5), (800_000, 133.0))]
    fitted = spark_compose.fit(rows)
    assert fitted["wall"]["spark_us_per_record"] < 0 and fitted["wall"]["crossover_records"] is None
    assert fitted["wall"]["crossover"].startswith("not measurable")
    assert fitted["cpu"]["cores_to_match_local_per_record"] == round(
        fitted["cpu"]["spark_us_per_record"] / fitted["cpu"]["local_us_per_record"], 1)


def test_sizes_are_sorted_and_small_ones_refused():
    assert spark_compose.sizes_arg("800000,50000 200000") == [50_000, 200_000, 800_000]
    with pytest.raises(Exception, match="at least 1000"):
        spark_compose.sizes_arg("10")


def _meta() -> dict:
    return {"when": "now", "cpus": 2, "git": "abc", "load_before": "1.0", "command": "bench/spark_compose.py",
            "repeats": 1, "keys_per_record": 0.25, "key_bytes": 14, "segment_mib": 8}
