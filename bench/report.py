"""Turns the groups' measurements into rows (workload, figure, comparison point, ratio, target) and
writes them as JSON and as a short markdown table.

A row's ratio is always figure / comparison. For throughput the target is a lower bound on it; for a
time (recovery) an upper bound. A row whose comparison was not measured in this run has no ratio.
"""

from __future__ import annotations

import json
import pathlib

import diskuse
from append import NOOP_POOL, SHAPES
from procs import PY_SUFFIX

MiB = 1 << 20


def _row(section, workload, figure, unit, comparison, comparison_figure, target=None, **extra) -> dict:
    ratio = figure / comparison_figure if figure is not None and comparison_figure else None
    met = None
    if target is not None and ratio is not None:
        op, bound = target
        met = ratio >= bound if op == ">=" else ratio <= bound
    return {"section": section, "workload": workload, "figure": figure, "unit": unit, "comparison": comparison,
            "comparison_figure": comparison_figure, "ratio": ratio,
            "target": f"{target[0]} {target[1]}" if target else None, "met": met, **extra}


def _find(runs, mode, shape, producers):
    return next((r for r in runs if r["mode"] == mode and r["shape"] == shape and r["producers"] == producers), None)


def _cpu_per_msg(run: dict) -> float | None:
    """Server CPU microseconds per message: what the store adds to gRPC shows here."""
    return run["server_cores"] / run["msgs_per_s"] * 1e6 if run["msgs_per_s"] else None


def _append_label(mode, shape, producers, run: dict | None = None):
    """``run``: a merged result of several rounds says so (append.merge_rounds)."""
    codec = ", pure-Python codec" if mode.endswith(PY_SUFFIX) else ""
    rounds = len((run or {}).get("rounds_msgs_per_s", ()))
    return (f"{SHAPES[shape]['label']}, {producers} producer{'s' if producers > 1 else ''}, "
            f"{mode.removesuffix(PY_SUFFIX)}{codec}{f' (median of {rounds} rounds)' if rounds > 1 else ''}")


def codec_rows(append: dict) -> list[dict]:
    """Each compiled-codec run against the same configuration on the pure-Python codec."""
    rows = []
    for r in append["runs"]:
        python = _find(append["runs"], r["mode"] + PY_SUFFIX, r["shape"], r["producers"])
        if r["mode"] in ("noop", NOOP_POOL) or r["mode"].endswith(PY_SUFFIX) or python is None:
            continue
        rows.append(_row("codec", _append_label(r["mode"], r["shape"], r["producers"]), r["msgs_per_s"], "msgs/s",
                         "the same on the pure-Python codec (MQSTORE_PURE_PYTHON=1)", python["msgs_per_s"],
                         server_cpu_us_per_msg=_cpu_per_msg(r),
                         comparison_server_cpu_us_per_msg=_cpu_per_msg(python)))
    return rows


def cpu_rows(append: dict) -> list[dict]:
    """Server CPU per appended message against the no-op server's, for the batched target shape."""
    rows = []
    for mode in ("ASYNC", "ASYNC" + PY_SUFFIX):
        ours, noop = _find(append["runs"], mode, "unary-100", 16), _find(append["runs"], "noop", "unary-100", 16)
        if ours and noop:
            rows.append(_row("cpu", f"server CPU per message, {_append_label(mode, 'unary-100', 16, ours)}",
                             _cpu_per_msg(ours), "us", "no-op gRPC server, same calls", _cpu_per_msg(noop),
                             target=("<=", 2.0) if mode == "ASYNC" else None))
    return rows


def append_rows(append: dict) -> list[dict]:
    rows = []
    for r in append["runs"]:
        if r["mode"] in ("noop", NOOP_POOL):
            continue
        pool = _find(append["runs"], NOOP_POOL, r["shape"], r["producers"])
        if pool is not None and not r["mode"].endswith(PY_SUFFIX):
            rows.append(_row("noop-pool", _append_label(r["mode"], r["shape"], r["producers"], r), r["msgs_per_s"],
                             "msgs/s", "no-op server answering Append in the handler pool (the comparison point "
                             "before)", pool["msgs_per_s"], server_cpu_us_per_msg=_cpu_per_msg(r),
                             comparison_server_cpu_us_per_msg=_cpu_per_msg(pool)))
        noop = _find(append["runs"], "noop", r["shape"], r["producers"])
        rows.append(_row("append", _append_label(r["mode"], r["shape"], r["producers"], r), r["msgs_per_s"], "msgs/s",
                         "no-op gRPC server, same calls", noop and noop["msgs_per_s"],
                         p50_ms=r["p50_ms"], p99_ms=r["p99_ms"], server_cores=r["server_cores"],
                         server_cpu_us_per_msg=_cpu_per_msg(r),
                         comparison_server_cpu_us_per_msg=noop and _cpu_per_msg(noop), errors=r["errors"]))
    for red in append["redis"]:
        mode = "ASYNC" if red["fsync"] == "everysec" else "SYNC"
        ours = _find(append["runs"], mode, "unary-100", red["producers"])
        rows.append(_row("redis", _append_label(mode, "unary-100", red["producers"], ours), ours and ours["msgs_per_s"],
                         "msgs/s", f"Redis XADD, appendfsync {red['fsync']}, pipeline 100, {red['producers']} "
                         f"connection{'s' if red['producers'] > 1 else ''}", red["msgs_per_s"],
                         p50_ms=ours and ours["p50_ms"], p99_ms=ours and ours["p99_ms"],
                         comparison_p50_ms=red["p50_ms"], comparison_p99_ms=red["p99_ms"]))
    return rows


MEMORY_FIELDS = (("VmRSS", "RSS (VmRSS)"), ("VmHWM", "peak RSS (VmHWM)"),
                 ("RssAnon", "anonymous RSS (RssAnon: heap, not the mapped log)"))


def memory_rows(memory: dict, when: str) -> list[dict]:
    rows = []
    noop = memory.get("noop") or {}
    for key in ("ASYNC", "SYNC"):
        m = memory.get(key)
        for field, label in MEMORY_FIELDS if m else ():
            rows.append(_row("memory", f"mqstore {key} server, {label}, {when}", m.get(field, 0) / 1024, "MiB",
                             "no-op server after the same calls", noop.get(field, 0) / 1024 or None,
                             rss_file_mib=m.get("RssFile", 0) / 1024))
    return rows


def best_async_append(results: dict) -> tuple[float | None, str]:
    candidates = []
    for r in (results.get("append") or {}).get("runs", []):
        if r["mode"] == "ASYNC":
            candidates.append((r["msgs_per_s"], _append_label("ASYNC", r["shape"], r["producers"])))
    for group in ("read", "recovery"):
        filled = (results.get(group) or {}).get("fill")
        if filled:
            candidates.append((filled["msgs_per_s"], f"fill of the {group} log (100 msgs/call, 16 producers, ASYNC)"))
    return max(candidates) if candidates else (None, "")


def read_rows(read: dict, results: dict) -> list[dict]:
    rows = []
    for suffix, codec in (("", ""), ("-py", ", pure-Python codec")):
        for n in (1, 8):
            ours, noop = read.get(f"pull_x{n}{suffix}"), read[f"noop_pull_x{n}"]
            if ours is None:
                continue
            rows.append(_row("read", f"Pull 1000 msgs/call, {n} consumer{'s' if n > 1 else ''} over 8 queues{codec}",
                             ours["msgs_per_s"], "msgs/s", "no-op Pull, same calls", noop["msgs_per_s"],
                             target=(">=", 0.6), p50_ms=ours["p50_ms"], p99_ms=ours["p99_ms"],
                             mb_per_s=ours["mb_per_s"]))
    rate, label = best_async_append(results)
    tail = read.get("tail")
    if tail is None:
        return rows
    rows.append(_row("read", f"Tail from earliest over {read['log_bytes'] / MiB:.0f} MiB ({tail['records']} records)",
                     tail["msgs_per_s"], "msgs/s", f"highest append rate in this run: {label}", rate,
                     target=(">=", 1.0), mb_per_s=tail["mb_per_s"]))
    return rows


def recovery_rows(rec: dict) -> list[dict]:
    size = f"{rec['log_bytes'] / MiB:.0f} MiB"
    read = rec["read_twice_total_s"]
    comparison = f"read the same {size} of segment files twice (warm page cache)"
    direct = f"read the same {size} twice from disk (O_DIRECT, no cache)"
    python = rec.get("checkpoint_removed_py")
    py_rows = [
        _row("recovery", f"restart after kill -9, checkpoint removed, pure-Python codec ({size})", python["seconds"],
             "s", direct, rec["read_twice_direct_total_s"], detail=python),
        _row("codec", f"restart after kill -9, checkpoint removed ({size})", rec["checkpoint_removed"]["seconds"],
             "s", "the same on the pure-Python codec (MQSTORE_PURE_PYTHON=1)", python["seconds"]),
    ] if python else []
    return py_rows + [
        _row("recovery", f"restart after kill -9, checkpoint removed: whole {size} log re-checked",
             rec["checkpoint_removed"]["seconds"], "s", comparison, read, detail=rec["checkpoint_removed"]),
        _row("recovery", f"restart after kill -9, checkpoint kept ({size} log)", rec["checkpoint_kept"]["seconds"], "s",
             comparison, read, detail=rec["checkpoint_kept"]),
        _row("recovery", f"restart after kill -9, checkpoint removed: whole {size} log re-checked",
             rec["checkpoint_removed"]["seconds"], "s", direct, rec["read_twice_direct_total_s"], target=("<=", 1.2)),
        _row("recovery", "process floor: start on an empty data directory", rec["process_floor"]["seconds"], "s",
             comparison, read),
    ]


def target_rows(rows: list[dict], results: dict) -> list[dict]:
    # Issue 10's targets (the read, recovery and CPU rows carry their own).
    wanted = [("append", _append_label("ASYNC", "unary-100", 16), (">=", 0.6)),
              ("redis", _append_label("ASYNC", "unary-100", 16) + "|everysec", (">=", 0.75)),
              ("redis", _append_label("SYNC", "unary-100", 32) + "|always", (">=", 1.0)),
              ("append", _append_label("ASYNC", "unary-1", 8), (">=", 0.8))]
    out = []
    for section, key, target in wanted:
        name, _, fsync = key.partition("|")
        for r in rows:
            workload = r["workload"].split(" (median of ")[0]
            if r["section"] == section and workload == name and (not fsync or fsync in r["comparison"]):
                out.append(_row("targets", r["workload"], r["figure"], r["unit"], r["comparison"],
                                r["comparison_figure"], target=target, p50_ms=r.get("p50_ms"), p99_ms=r.get("p99_ms")))
    out += [dict(r, section="targets") for r in rows if r["target"] and r["section"] in ("read", "recovery", "cpu")]
    return out


def build_rows(results: dict) -> list[dict]:
    rows = []
    if results.get("append") and "runs" in results["append"]:
        rows += append_rows(results["append"])
        rows += cpu_rows(results["append"]) + codec_rows(results["append"])
        rows += memory_rows(results["append"]["memory_kib"], "after every append workload")
    if results.get("read") and "noop_pull_x1" in results["read"]:
        rows += read_rows(results["read"], results)
    if results.get("recovery") and "read_twice_total_s" in results["recovery"]:
        rows += recovery_rows(results["recovery"])
    return target_rows(rows, results) + rows


# ---- output ------------------------------------------------------------------------------------------

def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit in ("msgs/s",):
        return f"{value:,.0f}"
    if unit == "MiB":
        return f"{value:,.0f}"
    if unit == "s":
        return f"{value:.2f}"
    return f"{value:.2f}"


def _verdict(row: dict) -> str:
    if row["target"] is None:
        return ""
    if row["met"] is None:
        return f"{row['target']}: not measured"
    return f"{row['target']}: {'met' if row['met'] else '**missed**'}"


SECTIONS = [("targets", "Targets"), ("append", "Append vs the no-op gRPC server (the Python gRPC ceiling)"),
            ("redis", "Append vs Redis Streams (redis-benchmark, XADD 1 KiB, pipeline 100)"),
            ("codec", "Compiled codec vs the pure-Python codec (mqstore.codec; same configuration, same run)"),
            ("cpu", "Server CPU per appended message"),
            ("noop-pool", "Append vs the no-op server of the kind before (Append in the handler pool; no target: "
                          "bench/README.md, *The no-op server's kind*)"),
            ("read", "Pull and Tail"), ("recovery", "Recovery after kill -9"), ("memory", "Server memory")]


def markdown(rows: list[dict], meta: dict, notes: list[str], profiles: dict | None = None) -> str:
    lines = [f"# CommitLog benchmark — {meta['started']}", "",
             f"{meta['machine']}; {meta['mode']} run took {meta['elapsed_s']:.0f} s; git {meta['git']}. "
             "Figures are from one run on a shared machine: read the ratios, not the absolutes. "
             "Latency is per call (one Append, one stream, one Pull). How to read this: bench/README.md. "
             + diskuse.describe(meta), ""]
    for section, title in SECTIONS:
        chosen = [r for r in rows if r["section"] == section]
        if not chosen:
            continue
        lines += [f"## {title}", "",
                  "| workload | figure | p50 / p99 ms | comparison point (same run) | its figure | ratio | target |",
                  "|---|---|---|---|---|---|---|"]
        for r in chosen:
            lat = f"{_fmt(r.get('p50_ms'))} / {_fmt(r.get('p99_ms'))}" if r.get("p50_ms") is not None else ""
            ratio = f"{r['ratio']:.2f}×" if r["ratio"] is not None else "—"
            lines.append(f"| {r['workload']} | {_fmt(r['figure'], r['unit'])} {r['unit']} | {lat} | {r['comparison']} "
                         f"| {_fmt(r['comparison_figure'], r['unit'])} {r['unit']} | {ratio} | {_verdict(r)} |")
        lines.append("")
    lines += profile_lines(profiles or {})
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def profile_lines(profiles: dict, top: int = 12) -> list[str]:
    """Top functions of each py-spy profile: share of samples on top of the stack and anywhere in it."""
    lines = []
    for p in profiles.values():
        if not p or not p.get("samples"):
            continue
        lines += [f"## Profile: {p['workload']}", "",
                  f"{p['samples']} samples " + ("with the GIL held (py-spy --gil" if p.get("gil") else
                                                "of busy threads (py-spy") + ", 100 Hz); raw stacks in "
                  f"{p['raw']}. 'total' lists mqstore's own functions only.", "",
                  "| self | function (on top of the stack) | total | function (anywhere in the stack) |",
                  "|---|---|---|---|"]
        for s, t in zip(p["self"][:top], p["total"][:top], strict=True):
            lines.append(f"| {s['share']:.1%} | {s['function']} | {t['share']:.1%} | {t['function']} |")
        lines.append("")
    return lines


def write(out_dir: pathlib.Path, stem: str, results: dict, rows: list[dict], meta: dict, notes: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "rows": rows, "notes": notes, "results": results}
    tmp = out_dir / f"{stem}.json.tmp"
    tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
    tmp.replace(out_dir / f"{stem}.json")
    tmp = out_dir / f"{stem}.md.tmp"
    profiles = results.get("profile") if isinstance(results.get("profile"), dict) else {}
    tmp.write_text(markdown(rows, meta, notes, {k: v for k, v in profiles.items() if isinstance(v, dict)}))
    tmp.replace(out_dir / f"{stem}.md")
