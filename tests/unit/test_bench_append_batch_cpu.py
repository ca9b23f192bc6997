"""bench/append_batch_cpu.py, issue 37's in-process measure of a batched Append's CPU: it runs the servicer's Append as
the port does now (a coroutine wrapped by the error mapping, which wraps async handlers only) and reports its parts."""

from __future__ import annotations

import json
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import append_batch_cpu  # noqa: E402 - bench/ is a folder of scripts, not a package


def test_the_harness_appends_through_the_async_handler_and_reports_each_part(tmp_path, capsys):
    assert append_batch_cpu.main(["--batches", "20", "--repeats", "1", "--batch", "10", "--dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["batches"] == 20 and out["batch"] == 10
    for part in ("mqstore_us_per_batch", "noop_us_per_batch", "parse_us", "store_append_us", "response_us"):
        assert out[part] > 0, part
