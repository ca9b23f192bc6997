"""CommitOffset through the offsets topic vs the SQL table it replaced: ``make bench`` runs ``bench/offsets.py``
(bench/README.md).

Issue 34 moved consumer offsets from a SQL upsert (SQLite by default, ``synchronous=FULL``: one fsync per
commit) into records of the commit log's system topic RMQ_SYS_CONSUMER_OFFSETS (mqstore.consumer_offsets).
Both paths are measured the same way, server side, in one process: CONSUMERS threads, each its own group,
commit offset 1, 2, 3... of one queue back to back for ``seconds``; the figure is commits/s over the window.

  topic, ASYNC flush   store_offsets.commit_offset on a store with --flush-mode ASYNC (the default): the
                       checks, one record appended and dispatched, the map caught up
  topic, SYNC flush    the same with --flush-mode SYNC: each commit acknowledged after the fsync that covers
                       it (group commit), the durability the SQL path had
  SQL (the old path)   what CommitOffset did before: the same checks (TopicRegistry.check_offsets)
                       then MetadataStore.commit_offsets, the upsert, on the store's own SQLite database

Issue 34's target: the offsets topic >= 5x the SQL path at 32 consumers (the row "topic, ASYNC flush";
the SYNC row is the like-for-like durability comparison and is reported beside it).

A full run writes bench/results/offsets.json and .md; ``--quick`` (1 s windows) writes to
bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import threading
import time

from procs import BENCH_DIR, run_meta, write_table

from mqstore import store_offsets
from mqstore.clock import SystemClock
from mqstore.config import StoreConfig
from mqstore.meta import MetadataStore
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store

TOPIC = "orders"
FULL = {"seconds": 5.0, "warmup_s": 1.0, "consumers": 32, "rounds": 3}
QUICK = {"seconds": 1.0, "warmup_s": 0.3, "consumers": 32, "rounds": 1}
TARGET = 5.0


def _loop(commit, consumers: int, warmup_s: float, seconds: float) -> float:
    """Commits/s of ``consumers`` threads calling ``commit(group, offset)`` back to back over ``seconds``
    after ``warmup_s``."""
    counts = [0] * consumers
    counting = threading.Event()
    stop = threading.Event()

    def consumer(index: int) -> None:
        offset, group = 0, f"g{index}"
        while not stop.is_set():
            offset = offset % 100_000 + 1
            commit(group, offset)
            if counting.is_set():
                counts[index] += 1

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(consumers)]
    for t in threads:
        t.start()
    time.sleep(warmup_s)  # the bench's measuring window, not a synchronisation
    counting.set()
    started = time.monotonic()
    time.sleep(seconds)
    total = sum(counts)
    elapsed = time.monotonic() - started
    stop.set()
    for t in threads:
        t.join(60)
    return total / elapsed


def _store(root: pathlib.Path, flush_mode: str) -> MessageStore:
    store = build_store(StoreConfig(data_dir=root, flush_mode=flush_mode, segment_size_bytes=32 << 20))
    store.start()
    store.topic_admin.create(TOPIC, 1)
    for _ in range(100):
        store.append(TOPIC, [MessageIn(body=b"m")] * 1000)  # offsets 1..100,000 are in range
    return store


def measure(cfg: dict, work: pathlib.Path) -> tuple[list[dict], dict]:
    raw: dict[str, list[float]] = {"topic_async": [], "topic_sync": [], "sql": []}
    for round_ in range(cfg["rounds"]):
        for name, flush_mode in (("topic_async", "ASYNC"), ("topic_sync", "SYNC"), ("sql", "ASYNC")):
            store = _store(work / f"{name}-{round_}", flush_mode)
            try:
                if name == "sql":
                    meta = MetadataStore(store.config.metadata_url_resolved, SystemClock())

                    def commit(group, offset, store=store, meta=meta):
                        rows = [(group, TOPIC, 0, offset)]
                        store.topics.check_offsets(rows)
                        meta.commit_offsets(rows)
                else:
                    meta = None

                    def commit(group, offset, store=store):
                        store_offsets.commit_offset(store, group, TOPIC, 0, offset)
                rate = _loop(commit, cfg["consumers"], cfg["warmup_s"], cfg["seconds"])
                if meta is not None:
                    meta.close()
            finally:
                store.stop()
            raw[name].append(rate)
            print(f"round {round_} {name:12} {rate:,.0f} commits/s", flush=True)
    best = {name: max(rates) for name, rates in raw.items()}
    rows = [{"path": path, "commits_per_s": best[name], "ratio": best[name] / best["sql"], "target": target}
            for path, name, target in (("topic, ASYNC flush", "topic_async", TARGET),
                                       ("topic, SYNC flush", "topic_sync", None),
                                       ("SQL (the old path)", "sql", None))]
    return rows, raw


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# CommitOffset: the offsets topic vs the SQL table (bench/offsets.py)", "",
             f"{meta['when']}, {meta['machine']}, {meta['mode']}, {meta['git']}; {meta['consumers']} consumers, "
             f"best of {meta['rounds']} windows of {meta['seconds']} s, server side in one process", "",
             "| path | commits/s | vs SQL | target |", "|---|---|---|---|"]
    for r in rows:
        target = "" if r["target"] is None else (f">= {r['target']:.0f}x: " + ("met" if r["ratio"] >= r["target"]
                                                                               else "**missed**"))
        lines.append(f"| {r['path']} | {r['commits_per_s']:,.0f} | {r['ratio']:.1f}x | {target} |")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (to bench/results/scratch/)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = BENCH_DIR / "results" / ("scratch" if args.quick else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqstore-offsets-") as work:
        rows, raw = measure(cfg, pathlib.Path(work))
    write_table(out_dir, "offsets", run_meta("quick" if args.quick else "full", **cfg), rows, raw, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
