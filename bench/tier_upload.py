"""Appends while the tier uploads vs the same appends with the tier off: ``make bench`` runs
``bench/tier_upload.py`` (bench/README.md, *The tier upload benchmark*).

Issue 36: "Upload throughput vs local sequential write while appends run: the append rate drops by <= 10%".
Each round runs two fresh commit log processes in turn (the order alternates from round to round), ASYNC flush,
SEGMENT-byte segments, the same closed-loop load (bench/loadgen.py: PRODUCERS tasks of Append with BATCH messages
of BODY bytes over 8 queues, WARMUP then a WINDOW):

  tier    --tier-url s3://... on moto's server (its own process on 127.0.0.1, fresh each round),
          --tier-upload-interval-ms 200, --tier-multipart-bytes: the leader hashes and uploads every segment
          sealed meanwhile (multipart above the part size), reads it back and records FINISHED
  off     no tier

  ext     (``--external``) the tier off, moto running and another process putting SEGMENT-byte objects to it as
          the uploader does: what moto and an uploader cost the appends with nothing of the tier in the store

Figures: messages/s appended in the window (median of ROUNDS), the commit log's CPU per message (its own
process: what the uploader costs the store), the MB/s the tier FINISHED in the window (GetTierStatus's
copy_bytes), the upload lag at the window's end, and moto's CPU (another process on the same cores: on a
2-core machine the S3 server competes with the store and the load generator, which a real S3 does not).
Where the time goes, per run (bench/cpu_probe.py, a sub-window of the window): the machine's CPU by kind (user,
system, softirq, idle, steal) and CPU pressure, and the store's, moto's and the load generator's cores, involuntary
switches and busiest threads; the appends' latency percentiles. ``--upload-quota`` sets the store's
--tier-upload-max-bytes-per-second (mqstore.tier.quota).

A full run writes bench/results/tier_upload.json and .md; ``--quick`` writes to bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import boto3
import grpc
import cpu_probe
from append import create_topic
from procs import BENCH_DIR, GrpcServer, cpu_seconds, run_loadgen, run_meta, stop, write_table
from tier_reads import KEYS, _moto

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc

MiB = 1 << 20
FULL = {"segment_bytes": 64 * MiB, "multipart_bytes": 16 * MiB, "producers": 8, "batch": 100, "body_bytes": 1024,
        "warmup_s": 2.0, "window_s": 12.0, "rounds": 3, "moto_nice": 19, "moto_idle": True, "drain_s": 20.0}
QUICK = {"segment_bytes": 8 * MiB, "multipart_bytes": 5 * MiB, "producers": 4, "batch": 100, "body_bytes": 1024,
         "warmup_s": 0.5, "window_s": 3.0, "rounds": 1, "moto_nice": 19, "moto_idle": True, "drain_s": 5.0}
TARGET_DROP = 0.10
IDLE_S = 2.0
PROBE_LEAD_S = 1.5  # the probe's sub-window starts this long after the load's warm-up would (its process start-up)
TOPIC = "bench"
# the store's threads that upload (their OS names: mqstore.profiling.name_os_thread; obstore's tokio workers)
UPLOAD_THREADS = ("tier-uploader", "tokio-rt-worker")
LOOP_THREAD = "grpc-aio-loop"  # the store's thread that runs every Append (mqstore_rpc.aio.LoopThread)


def _status(target: str) -> pb.GetTierStatusResponse:
    with grpc.insecure_channel(target) as channel:
        return commitlog_pb2_grpc.CommitLogStub(channel).GetTierStatus(pb.GetTierStatusRequest(), timeout=30)


def _drain(server: GrpcServer, moto, status, cfg: dict, idle_cores: float) -> dict:
    """The load stopped: the store's CPU per GB while the uploader works off its lag alone (at most drain_s),
    less what the idle store used (``idle_cores``, measured before the load)."""
    cpu0, moto0, copied0, began = cpu_seconds(server.pid), cpu_seconds(moto.pid), status.copy_bytes, time.monotonic()
    while time.monotonic() - began < cfg["drain_s"] and status.copy_lag_segments > 0:
        time.sleep(0.5)
        status = _status(server.target)
    copied = status.copy_bytes - copied0
    seconds = time.monotonic() - began
    return {"drain_gb": copied / 1e9, "drain_s": seconds,
            "store_cpu_s_per_gb": (cpu_seconds(server.pid) - cpu0 - idle_cores * seconds) / (copied / 1e9)
            if copied else None, "idle_cores": idle_cores,
            "moto_cpu_s_per_gb": (cpu_seconds(moto.pid) - moto0) / (copied / 1e9) if copied else None,
            "drain_mb_per_s": copied / seconds / 1e6}


def _sched_idle(pid: int) -> None:
    """Put every thread of ``pid`` under SCHED_IDLE (threads it starts later inherit it from their creator).

    A remote S3 takes none of the store's CPU; moto on the same two cores does. At nice 19 it still ran on a
    core the store or the load generator was about to wake on (the wake-up waits for the tick); under
    SCHED_IDLE any runnable task of the normal class preempts it at once, so it gets only the idle time."""
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))
        except (ProcessLookupError, PermissionError):
            pass


def _probe(out: dict, store_pid: int, moto_pid: int, cfg: dict) -> None:
    """Two /proc snapshots (bench/cpu_probe.py) around a sub-window of the load's window: the machine's CPU by
    kind and pressure, and the store's, moto's and the load generator's threads."""
    began = time.monotonic()
    time.sleep(cfg["warmup_s"] + PROBE_LEAD_S)
    pids = {"store": store_pid, "moto": moto_pid}
    load = cpu_probe.child_pids(os.getpid(), "loadgen.py")
    if load:
        pids["load"] = load[0]
    first = cpu_probe.snapshot(pids)
    time.sleep(max(0.5, began + cfg["warmup_s"] + cfg["window_s"] - 0.5 - time.monotonic()))
    out["breakdown"] = cpu_probe.breakdown(first, cpu_probe.snapshot(pids))


def _minor_faults(pid: int) -> dict[str, int]:
    """The minor page faults of a process so far, from /proc: ``all`` its threads' (exited ones too), ``loop`` its
    loop thread's (LOOP_THREAD), ``upload`` its upload threads' (UPLOAD_THREADS, tier_N) still running."""
    with open(f"/proc/{pid}/stat") as stat:
        found = {"all": int(cpu_probe.parse_stat(stat.read())[1][7]), "loop": 0, "upload": 0}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                text = stat.read()
        except OSError:
            continue  # the thread exited meanwhile
        comm, fields = cpu_probe.parse_stat(text)
        minflt = int(fields[7])
        if comm == LOOP_THREAD:
            found["loop"] += minflt
        elif comm in UPLOAD_THREADS or comm.startswith("tier_"):
            found["upload"] += minflt
    return found


def _print_probe(row: dict) -> None:
    probe = row["probe"]
    m = probe["machine"]
    print(f"    machine: user {m['user']:.2f} nice {m['nice']:.2f} system {m['system']:.2f} softirq {m['softirq']:.2f} "
          f"idle {m['idle']:.2f} iowait {m['iowait']:.2f} steal {m['steal']:.2f}; cpu pressure "
          f"{probe['cpu_pressure']:.2f}; latency ms " + " ".join(f"{k} {v:.1f}" for k, v in row["latency_ms"].items()),
          flush=True)
    for name, p in probe["processes"].items():
        print(f"    {name}: {p['cores']:.2f} cores, {p['involuntary_per_s']:.0f} preemptions/s, by comm "
              + ", ".join(f"{k} {v:.2f}" for k, v in list(p["by_comm"].items())[:4])
              + "; top " + ", ".join(p["top"][:6]),
              flush=True)


def _external_uploader(endpoint: str, work: pathlib.Path, cfg: dict, seconds: float):
    """Mode ``ext``: another process (not the store) that puts SEGMENT-byte objects to moto, as the uploader does
    (a memory map, multipart in MULTIPART-byte parts, 4 in flight; with ``--external-hash`` a SHA-256 of each object
    first, as the uploader's record has), for ``seconds``: moto's and an uploader's load on the cores without
    anything of the tier inside the store."""
    segment = work / "ext-segment"
    if not segment.exists():
        segment.write_bytes(os.urandom(cfg["segment_bytes"]))
    code = (
        "import hashlib, mmap, sys, time, obstore\n"
        "from obstore.store import S3Store\n"
        "endpoint, path, seconds, part = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])\n"
        "hash_first = sys.argv[5] == '1'\n"
        "store = S3Store('bench', prefix='ext', endpoint=endpoint, region='us-east-1', access_key_id='bench',\n"
        "                secret_access_key='bench', client_options={'allow_http': True})\n"
        "sent, end = 0, time.monotonic() + seconds\n"
        "with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:\n"
        "    while time.monotonic() < end:\n"
        "        with memoryview(m) as view:\n"
        "            if hash_first:\n"
        "                hashlib.sha256(view).digest()\n"
        "            obstore.put(store, f'o{sent}', view, use_multipart=True, chunk_size=part, max_concurrency=4)\n"
        "        sent += len(m)\n"
        "print(sent)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, endpoint, str(segment), str(seconds),
                             str(cfg["multipart_bytes"]), "1" if cfg.get("external_hash") else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _run(mode: str, cfg: dict, work: pathlib.Path, round_: int) -> dict:
    data_dir = work / f"{mode}-{round_}"
    moto = external = None
    extra = ("--segment-size-bytes", str(cfg["segment_bytes"]))
    env = {}
    if mode in ("tier", "ext"):
        moto, endpoint = _moto(work)
        if cfg["moto_nice"]:
            os.setpriority(os.PRIO_PROCESS, moto.pid, cfg["moto_nice"])  # its threads start with the request
        if cfg["moto_idle"]:
            _sched_idle(moto.pid)
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="bench")
    if mode == "tier":
        extra += ("--tier-url", "s3://bench/node", "--tier-endpoint", endpoint, "--tier-upload-interval-ms", "200",
                  "--tier-multipart-bytes", str(cfg["multipart_bytes"]))
        if cfg.get("upload_quota") is not None:
            extra += ("--tier-upload-max-bytes-per-second", str(cfg["upload_quota"]))
        env = KEYS
    server = GrpcServer.commitlog(data_dir, "ASYNC", extra=extra)
    server.env = {**(server.env or {}), **env}
    try:
        server.start()
        create_topic(server.target, TOPIC)
        spec = {"kind": "unary", "target": server.target, "topic": TOPIC, "batch": cfg["batch"], "items": 1,
                "body_bytes": cfg["body_bytes"], "concurrency": cfg["producers"], "channels": 1, "start_at": 0,
                "warmup_s": cfg["warmup_s"], "duration_s": cfg["window_s"], "max_calls": 10_000_000}
        idle0, idle_t0 = cpu_seconds(server.pid), time.perf_counter()
        time.sleep(IDLE_S)  # the store's own duties with nothing to do: taken off the drain's CPU
        idle_cores = (cpu_seconds(server.pid) - idle0) / (time.perf_counter() - idle_t0)
        copied0 = _status(server.target).copy_bytes if mode == "tier" else 0
        cpu0, moto0, wall0 = cpu_seconds(server.pid), cpu_seconds(moto.pid) if moto else 0.0, time.perf_counter()
        faults0 = _minor_faults(server.pid)
        probe: dict = {}
        prober = threading.Thread(target=_probe, args=(probe, server.pid, moto.pid if moto else 0, cfg), daemon=True)
        prober.start()
        if mode == "ext":
            external = _external_uploader(endpoint, work, cfg, cfg["warmup_s"] + cfg["window_s"] + 2)
        results = run_loadgen(spec, 1, timeout_s=cfg["warmup_s"] + cfg["window_s"] + 60)
        wall = time.perf_counter() - wall0
        prober.join(timeout=10)
        ext_mb_per_s = ext_cores = 0.0
        if external is not None:
            ext_cpu = cpu_seconds(external.pid)  # before it exits (a zombie's /proc stat still answers)
            out, _ = external.communicate(timeout=cfg["warmup_s"] + cfg["window_s"] + 120)
            ext_wall = time.perf_counter() - wall0
            ext_mb_per_s, ext_cores = int(out or 0) / ext_wall / 1e6, ext_cpu / ext_wall
        faults = {kind: count - faults0[kind] for kind, count in _minor_faults(server.pid).items()}
        cpu, moto_cpu = cpu_seconds(server.pid) - cpu0, (cpu_seconds(moto.pid) - moto0) if moto else 0.0
        status = _status(server.target) if mode == "tier" else None
        messages = sum(r["messages"] for r in results)
        latencies = sorted(ms for r in results for ms in r["latencies_ms"])
        errors = sum(sum(r["errors"].values()) for r in results)
        row = {"mode": mode, "round": round_, "msgs_per_s": messages / cfg["window_s"],
               "body_mb_per_s": messages * cfg["body_bytes"] / cfg["window_s"] / 1e6, "errors": errors,
               "server_cores": cpu / wall, "moto_cores": moto_cpu / wall, "minor_faults": faults,
               "upload_mb_per_s": 0.0, "uploaded_segments": 0, "lag_segments": 0,
               "load_cores": sum(r["window_client_cores"] for r in results),
               "latency_ms": {f"p{q}": latencies[min(len(latencies) - 1, int(len(latencies) * q / 100))]
                              for q in (50, 90, 99, 99.9)} | {"max": latencies[-1]} if latencies else {},
               "probe": probe.get("breakdown"), "ext_upload_mb_per_s": ext_mb_per_s, "ext_uploader_cores": ext_cores}
        store_probe = (row["probe"] or {}).get("processes", {}).get("store") or {}
        by_comm = store_probe.get("by_comm", {})
        # in the probe's sub-window; the busiest thread of that name (grpc's poller, which the loop starts, has it too)
        row["loop_cores"] = max((float(entry.rsplit(": ", 1)[1]) for entry in store_probe.get("top", [])
                                 if entry.split("/", 1)[0] == LOOP_THREAD), default=0.0)
        row["upload_thread_cores"] = sum(cores for comm, cores in by_comm.items()
                                         if comm in UPLOAD_THREADS or comm.startswith("tier_"))
        if status is not None:
            row.update(upload_mb_per_s=(status.copy_bytes - copied0) / wall / 1e6,
                       uploaded_segments=status.tiered_segments, lag_segments=status.copy_lag_segments,
                       copy_errors=status.copy_errors)
            row.update(_drain(server, moto, status, cfg, idle_cores))
        # CPU per message: the run's CPU (warm-up and window) over the messages of both at the window's rate
        row["server_us_per_msg"] = cpu / max(row["msgs_per_s"] * (cfg["warmup_s"] + cfg["window_s"]), 1) * 1e6
        print(f"round {round_} {mode:4} {row['msgs_per_s']:,.0f} msgs/s ({row['body_mb_per_s']:.1f} MB/s of bodies), "
              f"server {row['server_cores']:.2f} cores, {row['server_us_per_msg']:.2f} us/msg; upload "
              f"{row['upload_mb_per_s']:.1f} MB/s, lag {row['lag_segments']} segments, moto {row['moto_cores']:.2f} "
              f"cores, load {row['load_cores']:.2f} cores; minor faults {faults['all']:,} (loop thread "
              f"{faults['loop']:,}, upload threads {faults['upload']:,}), loop thread "
              f"{row['loop_cores']:.3f} cores = {row['loop_cores'] / max(row['msgs_per_s'], 1) * 1e6:.2f} us/msg"
              + (f"; external uploader {ext_mb_per_s:.1f} MB/s, {ext_cores:.2f} cores" if mode == "ext" else ""),
              flush=True)
        if row["probe"]:
            _print_probe(row)
        return row
    finally:
        if external is not None and external.poll() is None:
            external.kill()
            external.wait(10)
        server.stop()
        if moto is not None:
            stop(moto)
        shutil.rmtree(data_dir, ignore_errors=True)


def measure(cfg: dict, work: pathlib.Path) -> tuple[list[dict], list[dict]]:
    raw = []
    for round_ in range(cfg["rounds"]):
        modes = ("tier", "off", "ext") if cfg.get("external") else ("tier", "off")
        for mode in (modes if round_ % 2 == 0 else modes[::-1]):
            raw.append(_run(mode, cfg, work, round_))
    med = {mode: {key: statistics.median(r[key] for r in raw if r["mode"] == mode)
                  for key in ("msgs_per_s", "body_mb_per_s", "server_cores", "server_us_per_msg", "moto_cores",
                              "upload_mb_per_s", "loop_cores", "upload_thread_cores")} for mode in ("tier", "off")}
    drop = 1 - med["tier"]["msgs_per_s"] / med["off"]["msgs_per_s"]
    cpu_ratio = med["tier"]["server_us_per_msg"] / med["off"]["server_us_per_msg"]
    by_round = {(r["round"], r["mode"]): r for r in raw}
    pairs = [1 - by_round[(n, "tier")]["msgs_per_s"] / by_round[(n, "off")]["msgs_per_s"] for n in range(cfg["rounds"])]
    rows = [{"mode": mode, **med[mode]} for mode in ("tier", "off")]
    drains = [r for r in raw if r.get("store_cpu_s_per_gb")]
    per_gb = statistics.median(r["store_cpu_s_per_gb"] for r in drains) if drains else None
    rows[0].update(store_cpu_s_per_gb=per_gb, drain_mb_per_s=statistics.median(r["drain_mb_per_s"] for r in drains)
                   if drains else None,
                   # the store's cores the uploads would take if they kept up with the appends (a real S3)
                   projected_cores=per_gb * med["off"]["body_mb_per_s"] / 1000 if per_gb else None)
    rows[0].update(drop=drop, pair_drops=pairs, cpu_ratio=cpu_ratio, target_drop=TARGET_DROP,
                   max_lag_segments=max(r["lag_segments"] for r in raw if r["mode"] == "tier"),
                   load_cores=statistics.median(r["load_cores"] for r in raw if r["mode"] == "tier"))
    rows[1].update(load_cores=statistics.median(r["load_cores"] for r in raw if r["mode"] == "off"))
    for row in rows:
        row["p99_ms"] = statistics.median(r["latency_ms"].get("p99", 0.0) for r in raw if r["mode"] == row["mode"])
    if cfg.get("external"):
        ext = [r for r in raw if r["mode"] == "ext"]
        rows[0].update(ext_msgs_per_s=statistics.median(r["msgs_per_s"] for r in ext),
                       ext_pair_drops=[1 - by_round[(n, "ext")]["msgs_per_s"] / by_round[(n, "off")]["msgs_per_s"]
                                       for n in range(cfg["rounds"])],
                       ext_upload_mb_per_s=statistics.median(r["ext_upload_mb_per_s"] for r in ext),
                       ext_uploader_cores=statistics.median(r["ext_uploader_cores"] for r in ext),
                       ext_moto_cores=statistics.median(r["moto_cores"] for r in ext))
        rows[0]["ext_drop"] = 1 - rows[0]["ext_msgs_per_s"] / med["off"]["msgs_per_s"]
    return rows, raw


def markdown(rows: list[dict], meta: dict) -> str:
    tier, off = rows
    lines = ["# Appends while the tier uploads vs the tier off (bench/tier_upload.py)", "",
             f"{meta['when']}, {meta['machine']}, {meta['mode']}, {meta['git']}; ASYNC, "
             f"{meta['segment_bytes'] // MiB} MiB segments, multipart parts of {meta['multipart_bytes'] // MiB} MiB, "
             f"{meta['producers']} producers of Append x {meta['batch']} messages of {meta['body_bytes']} bytes, "
             f"{meta['window_s']:.0f} s windows, median of {meta['rounds']} alternating rounds; S3 is moto's server "
             f"on the same cores at nice {meta['moto_nice']}"
             + (" under SCHED_IDLE" if meta.get("moto_idle") else ""), "",
             "| tier | msgs/s appended | MB/s of bodies | store CPU us/msg | store cores | of which its loop thread "
             "| of which its upload threads | uploaded MB/s | moto cores | load generator cores | Append p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['msgs_per_s']:,.0f} | {r['body_mb_per_s']:.1f} | "
                     f"{r['server_us_per_msg']:.2f} | {r['server_cores']:.2f} | {r.get('loop_cores', 0.0):.2f} | "
                     f"{r.get('upload_thread_cores', 0.0):.3f} | {r['upload_mb_per_s']:.1f} | "
                     f"{r['moto_cores']:.2f} | {r.get('load_cores', 0.0):.2f} | {r.get('p99_ms', 0.0):.1f} |")
    verdict = "met" if tier["drop"] <= TARGET_DROP else "**missed**"
    lines += ["", f"Append-rate drop with the tier on: {tier['drop'] * 100:.1f}% (target <= "
              f"{TARGET_DROP * 100:.0f}%: {verdict}; per round: "
              + ", ".join(f"{d * 100:.1f}%" for d in tier["pair_drops"]) + "). The store's own CPU per message: "
              f"{tier['cpu_ratio']:.2f}x with the tier on; upload lag at the window's end at most "
              f"{tier['max_lag_segments']} sealed segments. The store's threads (by their OS names, in a probe "
              f"sub-window of each window): its loop thread runs every Append ({LOOP_THREAD}), its upload threads are "
              f"the uploader's duty, the tier's executor and obstore's tokio workers ("
              + ", ".join(UPLOAD_THREADS) + ", tier_N).", ""]
    if tier.get("ext_drop") is not None:
        lines += [f"The tier off with moto running and another process uploading to it as the uploader does "
                  f"(``--external``): {tier['ext_msgs_per_s']:,.0f} msgs/s, a {tier['ext_drop'] * 100:.1f}% drop "
                  f"(per round: " + ", ".join(f"{d * 100:.1f}%" for d in tier["ext_pair_drops"])
                  + f"); that process put {tier['ext_upload_mb_per_s']:.1f} MB/s on "
                  f"{tier['ext_uploader_cores']:.2f} cores, moto {tier['ext_moto_cores']:.2f} cores.", ""]
    if tier.get("store_cpu_s_per_gb"):
        lines += [f"The load stopped, the uploader alone: {tier['drain_mb_per_s']:.1f} MB/s to moto, the store's "
                  f"CPU {tier['store_cpu_s_per_gb']:.2f} s per GB uploaded; uploads keeping up with the tier-off "
                  f"rate ({off['body_mb_per_s']:.0f} MB/s of bodies) would take {tier['projected_cores']:.2f} of the "
                  f"store's cores (it used {off['server_cores']:.2f} for the appends).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (to bench/results/scratch/)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default: 3, quick 1)")
    parser.add_argument("--moto-nice", type=int, default=19,
                        help="moto's nice value (19: it takes the CPU the store and the load leave, as a remote S3 "
                             "takes none of theirs; 0: it competes as an equal)")
    parser.add_argument("--moto-idle", action=argparse.BooleanOptionalAction, default=True,
                        help="moto's threads under SCHED_IDLE (default: yes; a runnable store or load generator "
                             "preempts it at once, as a remote S3 takes none of their CPU)")
    parser.add_argument("--stem", default="tier_upload", help="the results files' name")
    parser.add_argument("--scratch", action="store_true", help="write the results to bench/results/scratch/")
    parser.add_argument("--upload-quota", type=int, default=None,
                        help="the store's --tier-upload-max-bytes-per-second (default: the store's own default)")
    parser.add_argument("--external-hash", action="store_true",
                        help="--external, that process hashing each object (SHA-256) before its put, as the uploader")
    parser.add_argument("--external", action="store_true",
                        help="a third run a round: the tier off, moto running and another process uploading to it "
                             "(what moto and an uploader cost the appends without the store's tier)")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL, moto_nice=args.moto_nice, moto_idle=args.moto_idle,
               upload_quota=args.upload_quota, external=args.external or args.external_hash,
               external_hash=args.external_hash)
    if args.rounds:
        cfg["rounds"] = args.rounds
    out_dir = BENCH_DIR / "results" / ("scratch" if args.quick or args.scratch else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqstore-tier-upload-") as work:
        rows, raw = measure(cfg, pathlib.Path(work))
    write_table(out_dir, args.stem, run_meta("quick" if args.quick else "full", **cfg), rows, raw, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
