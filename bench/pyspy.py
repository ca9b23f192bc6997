"""Where the server's time goes: py-spy samples of the server under the batched-append workload.

Optional: runs only when ``py-spy`` is installed (it is not a project dependency: ``.venv/bin/pip
install py-spy``), after the measured groups, on a server of its own, so that sampling never slows
a measured figure. py-spy samples at 100 Hz with ``--gil`` (only the thread holding the GIL, which is
what limits a Python server) and ``--nonblocking`` (the server is not paused while sampled). Two
restarts of the recovery log are sampled too (checkpoint kept, then removed), without ``--gil``. The
raw stacks are kept in ``bench/results/profile-*.txt``; the summary lists the functions with the most
samples on top of the stack (self) and anywhere in it (total), as shares of all samples.
"""

from __future__ import annotations

import collections
import pathlib
import re
import shutil
import signal
import subprocess
import time

from append import SHAPES, create_topic, measure
from procs import PYTHON, GrpcServer, free_port, kill9, spawn, stop, wait_serving

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = pathlib.Path(PYTHON).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/core/", "/services/", "/bench/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match['func']} ({path})"


def _relative(path: pathlib.Path) -> str:
    root = pathlib.Path(__file__).resolve().parent.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _ours(name: str) -> bool:
    """A frame of mqstore's own code (the generic frames above it are in every stack)."""
    ours = ("mqstore", "mqstore_rpc", "commitlog_service", "gateway_service", "txn_service")
    return any(f"({package}/" in name for package in ours)


def summarize(raw: pathlib.Path, top: int = 15) -> dict:
    """Sample shares per function from py-spy's raw (collapsed stack) output: ``self`` (on top of the
    stack, any code) and ``total`` (anywhere in the stack, mqstore's own functions only)."""
    self_counts: collections.Counter = collections.Counter()
    total_counts: collections.Counter = collections.Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        samples += n
        self_counts[frames[-1]] += n
        for name in set(frames):
            if _ours(name):
                total_counts[name] += n
    share = (lambda c: round(c / samples, 4)) if samples else (lambda c: 0.0)
    return {"samples": samples,
            "self": [{"function": f, "share": share(c)} for f, c in self_counts.most_common(top)],
            "total": [{"function": f, "share": share(c)} for f, c in total_counts.most_common(top)]}


class Recorder:
    """py-spy record attached to a pid; stop() ends it with SIGINT so that it writes its output."""

    def __init__(self, exe: str, pid: int, out: pathlib.Path, max_s: float, log_path: pathlib.Path, gil: bool = True):
        self.out = out
        self.proc = spawn([exe, "record", "--pid", str(pid), "--rate", "100", *(["--gil"] if gil else []),
                           "--nonblocking",
                           "--format", "raw", "--duration", str(int(max_s)), "-o", str(out)],
                          stderr_path=log_path, stdout=log_path.open("ab"))
        time.sleep(0.5)  # let py-spy attach before the workload starts

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30.0)
            except subprocess.TimeoutExpired:
                pass  # stop() below escalates
        stop(self.proc, 10.0)


def profile_append(work: pathlib.Path, results_dir: pathlib.Path, timing: dict, log) -> dict:
    exe = py_spy()
    server = GrpcServer.commitlog(work / "profile-append", "ASYNC").start()
    out = results_dir / "profile-append-async.txt"
    try:
        create_topic(server.target)
        measure(server, "unary-100", 16, timing, 1)  # warm-up: first segment touched, caches filled
        timing = {**timing, "duration_s": timing["profile_s"]}
        recorder = Recorder(exe, server.pid, out, timing["warmup_s"] + timing["duration_s"] + 30, work / "py-spy.log")
        try:
            run_ = measure(server, "unary-100", 16, timing, 1)
        finally:
            recorder.stop()
    finally:
        server.stop()
    summary = summarize(out) if out.exists() else {"samples": 0, "self": [], "total": []}
    summary.update(workload=f"{SHAPES['unary-100']['label']}, 16 producers, ASYNC (sampled: slower than measured)",
                   msgs_per_s_while_sampled=run_["msgs_per_s"], raw=_relative(out), gil=True)
    log("profile", "append", {"samples": summary["samples"], "top_self": summary["self"][:3]})
    return summary


def profile_recovery(work: pathlib.Path, results_dir: pathlib.Path, sizes: dict, log, remove_checkpoint: bool) -> dict:
    """py-spy over a restart of the recovery group's log (left in ``work/recovery``, killed with -9).

    Sampled without ``--gil``: start-up is one thread, and its I/O waits belong in the picture. The
    server is killed with -9 again afterwards, so the next restart is an unclean one too.
    """
    exe = py_spy()
    data = work / "recovery"
    variant = "checkpoint-removed" if remove_checkpoint else "checkpoint-kept"
    if remove_checkpoint:
        (data / "checkpoint").unlink(missing_ok=True)
    out = results_dir / f"profile-recovery-{variant}.txt"
    port = free_port()
    server = GrpcServer.commitlog(data, "ASYNC", port=port, log_name=f"profile-recovery-{variant}.log",
                                  extra=("--segment-size-bytes", str(sizes["segment_bytes"])))
    began = time.perf_counter()
    server.proc = spawn(server.args, server.log_path)
    server.port = port
    try:
        # Attaches while the interpreter is still importing; recovery starts after the imports.
        recorder = Recorder(exe, server.pid, out, sizes["recovery_timeout_s"] * 3, work / "py-spy.log", gil=False)
        try:
            wait_serving(server.proc, port, sizes["recovery_timeout_s"] * 3, interval_s=0.005)
            seconds = time.perf_counter() - began
        finally:
            recorder.stop()
    finally:
        kill9(server.proc)
    summary = summarize(out) if out.exists() else {"samples": 0, "self": [], "total": []}
    summary.update(workload=f"restart after kill -9, {variant.replace('-', ' ')} (sampled: slower than measured)",
                   seconds_while_sampled=seconds, raw=_relative(out), gil=False)
    log("profile", f"recovery {variant}", {"samples": summary["samples"], "seconds": seconds})
    return summary
