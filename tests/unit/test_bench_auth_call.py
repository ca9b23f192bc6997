"""bench/auth_call.py runs to its end: its calls go through the interceptor chain as a grpc.aio server makes
them (an ``async def`` handler awaited on a loop; a call whose credentials are not cached yet is screened: a
request stream of its one message, mqstore_rpc.auth)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "auth_call.py"


def test_the_auth_bench_measures_every_chain():
    done = subprocess.run([sys.executable, str(BENCH), "--calls", "200"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = [line.split("  ")[0] for line in done.stdout.splitlines() if "CPU us/call" in line]
    assert measured == ["none", "auth", "metrics+errors", "metrics+errors+auth", "auth, SDK signature",
                        "auth, SDK signature"]
