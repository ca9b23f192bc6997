"""bench/compactor.py's compactor-spark measure (the Spark run itself is not part of make test): the line
fitted through every run with its residuals, and the CPU of a job's processes counted even where no
RUSAGE_CHILDREN holds it (pyspark's daemon ignores SIGCHLD, so the kernel reaps its workers)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import resource
import subprocess
import sys

import pytest

BENCH_DIR = pathlib.Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def compactor():
    sys.path.insert(0, str(BENCH_DIR))  # the bench's own modules (groups, procs, diskuse)
    try:
        spec = importlib.util.spec_from_file_location("bench_compactor", BENCH_DIR / "compactor.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_the_line_goes_through_every_run_and_reports_its_residuals(compactor):
    # 30 s + 5 us/record, each size's runs 1 s either side: the medians alone would hide the spread
    rows = [{"records": n, "local_s": 1e-6 * n, "spark_s": 30 + 5e-6 * n, "local_cpu_s": 1e-6 * n,
             "spark_cpu_s": 30 + 5e-6 * n, "spark_cpu_runs_s": [29 + 5e-6 * n, 31 + 5e-6 * n, 30 + 5e-6 * n]}
            for n in (1_000_000, 2_000_000, 4_000_000)]
    fit = compactor.crossover(rows)
    line = fit["lines"]["spark_cpu_s"]
    assert len(line["residuals"]) == 9  # every run a point
    assert line["residuals"][:3] == pytest.approx([-1, 1, 0], abs=1e-9)
    assert fit["spark_cpu_us_per_record"] == pytest.approx(5, abs=1e-9)
    assert line["residual_sd"] == pytest.approx((6 / 7) ** 0.5, rel=1e-9)  # 6 = three sizes x (1 + 1 + 0), n - 2 = 7
    assert fit["spark_cpu_us_per_record_se"] > 0
    assert fit["cpu_ratio"] == pytest.approx(5, abs=1e-9)


_FORKING = """
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as pyspark's daemon: the kernel reaps the children
if os.fork() == 0:
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
    os._exit(0)
time.sleep(1.6)
"""


def test_the_job_cpu_counts_children_reaped_by_the_kernel(compactor):
    """A process that ignores SIGCHLD forks a child burning 1 CPU-s: RUSAGE_CHILDREN never sees the child's
    CPU, the tree's samples do."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen([sys.executable, "-c", _FORKING])
    with compactor._TreeSampler(child.pid, interval_s=0.05) as sampler:
        child.wait(timeout=60)
        sampler.until_gone(deadline_s=30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    split = sampler.split(reaped)
    assert reaped < 0.5  # the forking process's own CPU only
    assert split["other"] >= 0.8, split  # the forked child, sampled (its kind: below no JVM)
    assert [kind for _, kind, _ in sampler.processes()].count("driver_python") == 1
    assert os.getpid() not in {pid for pid, _, _ in sampler.processes()}
