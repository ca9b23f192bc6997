"""The cost of one change of the tier manifests holding FILES entries (issue 36's follow-up: the manifests were
rewritten whole on each change). Not part of ``make bench``; run by hand, old and new code alternated:

  PYTHONPATH=<checkout>/core python bench/tier_manifest.py [--files 1000] [--changes 200] [--json]

Index (mqstore.index.tier_manifest, a local file): FILES tiered files recorded, then CHANGES moves of one more
file, each a STARTED then a FINISHED change (and the file forgotten again, so the size stays FILES): wall and
CPU seconds per change. Compaction tier (mqstore.compaction.tier_manifest, objects on a file:// tier): FILES
segments recorded, then CHANGES saves adding (then dropping) one segment. Both include the fsyncs; a run also
reports what a load (a start) of the manifest costs afterwards. The API of the code before the incremental
manifests (``started``/``finished`` mutated, then ``save()``) is detected, so the same script measures both.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from mqstore.compaction.tier_manifest import FINISHED, Manifest, TieredSegment
from mqstore.format.compact_index import CompactHeader
from mqstore.index.tier_manifest import TierFile, TierManifest
from mqstore.tier.urls import open_store


def _entry(first: int) -> tuple[str, str, TierFile]:
    name = f"{first:020d}.cidx"
    header = CompactHeader(1_700_000_000_000, 1_700_000_060_000, first, first + 1000, 0, 10, 16, 1, 2)
    return name, f"index/{name}.{first:032x}", TierFile(f"index/{name}.{first:032x}", header.size_bytes, header)


def _index_change(manifest, name: str, key: str, entry: TierFile, forget: bool) -> None:
    if hasattr(manifest, "start"):  # (the incremental manifest)
        if forget:
            manifest.forget(name)
        else:
            manifest.start(name, key)
            manifest.finish(name, entry)
        return
    if forget:
        del manifest.finished[name]
        manifest.save()
        return
    manifest.started[name] = key
    manifest.save()
    del manifest.started[name]
    manifest.finished[name] = entry
    manifest.save()


def _timed(work) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_index(tmp: pathlib.Path, files: int, changes: int) -> dict:
    directory = tmp / "index"
    directory.mkdir()
    manifest = TierManifest.load(directory, "file:///tier")
    for first in range(files):
        name, key, entry = _entry(first)
        if hasattr(manifest, "start"):
            manifest.start(name, key)
            manifest.finish(name, entry)
        else:
            manifest.finished[name] = entry
    if not hasattr(manifest, "start"):
        manifest.save()

    def run():
        for n in range(changes):
            name, key, entry = _entry(files + n)
            _index_change(manifest, name, key, entry, False)
            _index_change(manifest, name, key, entry, True)
    wall, cpu = _timed(run)
    per = 3 * changes  # STARTED, FINISHED, forgotten
    load_wall, load_cpu = _timed(lambda: TierManifest.load(directory, "file:///tier"))
    return {"files": files, "changes": per, "change_ms": 1000 * wall / per, "change_cpu_ms": 1000 * cpu / per,
            "load_ms": 1000 * load_wall, "load_cpu_ms": 1000 * load_cpu,
            "disk_bytes": sum(p.stat().st_size for p in directory.iterdir())}


def _segment(base: int, state: str = FINISHED) -> TieredSegment:
    return TieredSegment("orders", 3, base, f"compaction/a/segments/orders/3/{base:020d}.{base:032x}", 1 << 20,
                         "ab" * 32, "cd" * 32, state)


def bench_compaction(tmp: pathlib.Path, files: int, changes: int) -> dict:
    url = f"file://{tmp / 'tier'}"
    (tmp / "tier").mkdir()
    writes, reads = open_store(url, timeout_ms=60_000), open_store(url, timeout_ms=60_000)
    try:
        manifest = Manifest(writes, reads, "compaction/a")
        manifest.load()
        segments = {s.where: s for s in (_segment(b) for b in range(files))}
        manifest.save(segments)

        def run():
            for n in range(changes):
                entry = _segment(files + n)
                manifest.save({**manifest.segments(), entry.where: entry})
                after = manifest.segments()
                del after[entry.where]
                manifest.save(after)
        wall, cpu = _timed(run)
        again = Manifest(writes, reads, "compaction/a")
        load_wall, load_cpu = _timed(again.load)
        assert again.segments() == manifest.segments()
    finally:
        writes.close()
        reads.close()
    per = 2 * changes
    return {"files": files, "changes": per, "change_ms": 1000 * wall / per, "change_cpu_ms": 1000 * cpu / per,
            "load_ms": 1000 * load_wall, "load_cpu_ms": 1000 * load_cpu,
            "tier_bytes": sum(p.stat().st_size for p in (tmp / "tier").rglob("*") if p.is_file())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        (pathlib.Path(tmp) / "i").mkdir()
        (pathlib.Path(tmp) / "c").mkdir()
        found = {"index": bench_index(pathlib.Path(tmp) / "i", args.files, args.changes),
                 "compaction": bench_compaction(pathlib.Path(tmp) / "c", args.files, args.changes)}
    if args.json:
        print(json.dumps(found))
        return
    for kind, figures in found.items():
        print(f"{kind:11s} " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in figures.items()))


if __name__ == "__main__":
    main()
