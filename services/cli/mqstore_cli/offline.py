"""``mqstore check``: the offline full check of a stopped store's commit log (runs locally, no gRPC).

    mqstore check --data-dir ./data              # progress on stderr when a TTY (or --progress)
    mqstore --json check --data-dir ./data       # the summary as one JSON object

It walks every record of every segment (length, magic, PHYSICALOFFSET, body CRC) and prints a summary:
segments, records, bytes, time and the verdict the next start would reach (``ok``, ``torn tail``: the
start cuts it; ``corrupt``, ``wrong segment size``: the start refuses, run ``mqstore repair``). Exit
status 0 when the store would start, 1 when it would not.

This module is imported by ``mqstore_cli.main`` and must not import it back.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Callable, TextIO

MiB = 1 << 20


class CheckProgress:
    """``checked X of Y MiB`` on stderr: rewritten in place on a terminal (at most 10 times a second),
    else a line at most once per interval; :meth:`finish` prints the final figure. Not thread-safe."""

    def __init__(self, err: TextIO, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._err, self._interval_s, self._clock = err, interval_s, clock
        self._tty = err.isatty()
        self._start = self._last = clock()
        self._done = self._total = 0

    def __call__(self, done: int, total: int) -> None:
        self._done, self._total = done, total
        now = self._clock()
        if now - self._last >= (0.1 if self._tty else self._interval_s):
            self._last = now
            self._show(now, final=False)

    def finish(self) -> None:
        self._show(self._clock(), final=True)

    def _show(self, now: float, final: bool) -> None:
        rate = self._done / MiB / max(now - self._start, 1e-9)
        line = (f"checked {self._done / MiB:,.1f} MiB of {self._total / MiB:,.1f} MiB of segment files "
                f"({rate:,.0f} MiB/s)")
        start = "\r" if self._tty else ""
        end = "\n" if final or not self._tty else ""
        self._err.write(f"{start}{line}{end}")
        self._err.flush()


def add_commands(parser: argparse.ArgumentParser) -> None:
    # argparse offers no public way to reach a parser's subcommands once they exist.
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser("check", help="check every record of a stopped store's log (CRC included); runs locally")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--segment-size-bytes", type=int, default=None,
                   help="default: from the segment file names (needed when the only segment was cut short)")
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")
    p.set_defaults(func=cmd_check)
    catalog = sub.add_parser("catalog", help="the topic and auth catalogs (runs locally)")
    verbs = catalog.add_subparsers(dest="catalog_command", required=True, metavar="VERB")
    p = verbs.add_parser("import", help="copy a SQL catalog once into an empty etcd prefix (HA's catalogs)")
    p.add_argument("--to", required=True, help="the etcd catalog, etcd://HOST:PORT[,HOST:PORT...]/PREFIX (what the "
                   "nodes get as --metadata-url and --auth-url)")
    p.add_argument("--metadata-url", default="", help="the SQL topic catalog to copy (a node's --metadata-url, e.g. "
                   "sqlite:////PATH/metadata.db)")
    p.add_argument("--auth-url", default="", help="the SQL auth database to copy (users, rules, SDK keys)")
    p.set_defaults(func=cmd_catalog_import)


def cmd_catalog_import(cli) -> None:
    from mqstore.clock import SystemClock
    from mqstore_rpc.catalogs import import_sql

    a = cli.args
    counts = import_sql(a.to, SystemClock(), metadata_url=a.metadata_url, auth_url=a.auth_url)
    if a.json:
        cli.out.write(json.dumps(counts) + "\n")
    else:
        cli.out.write("imported " + ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in counts.items())
                      + f" into {a.to}\n")
    cli.out.flush()


def cmd_check(cli) -> int:
    from mqstore.log.repair import check  # only the offline commands need the storage engine itself

    a = cli.args
    progress = CheckProgress(cli.err) if a.progress or cli.err.isatty() else None
    report = check(a.data_dir, a.segment_size_bytes, progress)
    if progress is not None:
        progress.finish()
    if a.json:
        cli.out.write(json.dumps({**dataclasses.asdict(report), "will_start": report.will_start}) + "\n")
    else:
        rate = report.bytes_checked / MiB / max(report.seconds, 1e-9)
        cli.out.write(f"segments: {report.segments} of {report.segment_size_bytes} bytes\n"
                      f"records: {report.records}\n"
                      f"bytes: {report.bytes_checked} ({report.bytes_checked / MiB:,.1f} MiB, physical offsets "
                      f"[{report.start_offset}, {report.end_offset}))\n"
                      f"time: {report.seconds:.2f} s ({rate:,.0f} MiB/s)\n"
                      f"checkpoint: {report.checkpoint}\n"
                      f"verdict: {report.verdict}: {report.detail}\n")
    cli.out.flush()
    return 0 if report.will_start else 1
