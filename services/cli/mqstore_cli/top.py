"""``mqstore top``: the key figures of every service, live in a terminal, from their /metrics endpoints.

    mqstore top                      redraws every --interval seconds (2) until Ctrl-C
    mqstore top --once               one frame (two scrapes --interval apart, for the rates) and exit
    mqstore top --metrics commitlog=10.0.0.5:50151 --metrics index=10.0.0.6:50152

Without ``--metrics`` it reads the services at their gRPC addresses' host and port + 100 (the default
metrics ports: ``--address``, ``--index-address``, ``--txn-address``, ``--compactor-address``, and the
gateway's MQSTORE_GATEWAY_ADDRESS, default 127.0.0.1:8081). A
service that does not answer is shown as down; the others are still shown. Rates are per second
between the last two scrapes; p99 comes from the histograms' buckets (an upper bound: the bucket's).

Each frame is plain lines (the terminal is cleared between frames with ANSI codes when stdout is one).
Imported by ``mqstore_cli.main``; must not import it back.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from mqstore import defaults
from prometheus_client.parser import text_string_to_metric_families

METRICS_PORT_OFFSET = defaults.METRICS_PORT_OFFSET
DEFAULT_GATEWAY_ADDRESS = defaults.GATEWAY_ADDRESS  # the RocketMQ gateway (env MQSTORE_GATEWAY_ADDRESS)
CLEAR = "\x1b[H\x1b[2J"


@dataclass
class Sample:
    """One scrape of one service: (name, sorted labels) -> value."""

    values: dict[tuple[str, tuple], float] = field(default_factory=dict)
    error: str = ""

    def get(self, name: str, **labels) -> float:
        want = {k: str(v) for k, v in labels.items()}
        return sum(v for (n, ls), v in self.values.items() if n == name and all(dict(ls).get(k) == x
                                                                                 for k, x in want.items()))

    def by(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, ls), v in self.values.items():
            if n == name and label in dict(ls):
                key = dict(ls)[label]
                out[key] = out.get(key, 0.0) + v
        return out

    def rows(self, name: str) -> list[tuple[dict, float]]:
        return [(dict(ls), v) for (n, ls), v in self.values.items() if n == name]


def fetch(target: str, timeout_s: float) -> Sample:
    try:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=timeout_s) as response:
            text = response.read().decode("utf-8")
    except (OSError, urllib.error.URLError) as exc:
        return Sample(error=str(getattr(exc, "reason", exc)))
    sample = Sample()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sample.values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return sample


def _rate(now: Sample, before: Sample | None, seconds: float, name: str, **labels) -> float | None:
    if before is None or before.error or seconds <= 0:
        return None
    return max(0.0, now.get(name, **labels) - before.get(name, **labels)) / seconds


def _p99(now: Sample, before: Sample | None, name: str, **labels) -> float | None:
    """The 99th percentile's bucket bound of the observations between the scrapes (all of them without
    a previous scrape)."""
    buckets: dict[float, float] = {}
    for ls, value in now.rows(name + "_bucket"):
        if all(ls.get(k) == str(v) for k, v in labels.items()):
            bound = math.inf if ls["le"] == "+Inf" else float(ls["le"])
            old = before.get(name + "_bucket", le=ls["le"], **labels) if before and not before.error else 0.0
            buckets[bound] = buckets.get(bound, 0.0) + value - old
    total = buckets.get(math.inf, 0.0)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= 0.99 * total:
            return bound
    return None


def _num(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value * scale:,.{digits}f}{unit}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{value:,.0f} B"
        value /= 1024
    return "-"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else ("> 10 s" if math.isinf(seconds) else f"{seconds * 1000:,.1f} ms")


def _rpc_line(now: Sample, before: Sample | None, seconds: float) -> str:
    calls = _rate(now, before, seconds, "grpc_server_handled_total")
    ok = _rate(now, before, seconds, "grpc_server_handled_total", grpc_code="OK")
    errors = None if calls is None or ok is None else calls - ok
    p99 = _ms(_p99(now, before, "grpc_server_handling_seconds"))
    return f"  rpc       {_num(calls)} calls/s  errors {_num(errors)}/s  p99 {p99}"


def _follower_lines(now: Sample) -> list[str]:
    lines = []
    for labels, up in now.rows("mqstore_follower_connected"):
        name = labels.get("follower", "")
        seconds = now.get("mqstore_follower_lag_seconds", follower=name)
        lag = next((v for ls, v in now.rows("mqstore_follower_lag_bytes") if ls.get("follower") == name), None)
        shown = "unknown (no Tail frame yet)" if lag is None else _bytes(lag)
        lines.append(f"  follower  {name}: lag {shown} ({seconds:,.1f} s)  {'connected' if up else 'DISCONNECTED'}")
    return lines


def commitlog_lines(now: Sample, before: Sample | None, seconds: float) -> list[str]:
    read_only = [r for r, v in now.by("mqstore_commitlog_read_only", "reason").items() if v]
    topics = sorted(now.by("mqstore_commitlog_topic_bytes", "topic").items(), key=lambda kv: -kv[1])[:5]
    lags = sorted(((ls, v) for ls, v in now.rows("mqstore_consumer_lag_messages")), key=lambda r: -r[1])[:5]
    lines = [
        f"  appends   {_num(_rate(now, before, seconds, 'mqstore_commitlog_appended_messages_total'))} msg/s  "
        f"{_bytes(_rate(now, before, seconds, 'mqstore_commitlog_appended_bytes_total'))}/s  "
        f"flushes {_num(_rate(now, before, seconds, 'mqstore_commitlog_flushes_total'))}/s  "
        f"p99 flush {_ms(_p99(now, before, 'mqstore_commitlog_flush_seconds'))}",
        f"  log       written {_bytes(now.get('mqstore_commitlog_physical_offset', position='written'))}  "
        f"segments {now.get('mqstore_commitlog_segments'):.0f}  disk {now.get('mqstore_commitlog_disk_used_ratio'):.1%}"
        f"  read-only {'YES (' + ', '.join(read_only) + ')' if read_only else 'no'}",
        "  topics    " + (", ".join(f"{t} {_bytes(b)}" for t, b in topics) or "(none)"),
    ]
    if lags:
        lines.append("  lag       " + ", ".join(f"{ls['group']}@{ls['topic']}/{ls['queue_id']} {v:,.0f}"
                                               for ls, v in lags))
    return lines


def index_lines(now: Sample, before: Sample | None, seconds: float) -> list[str]:
    return [f"  index     {_num(_rate(now, before, seconds, 'mqstore_index_records_indexed_total'))} records/s  "
            f"queries {_num(_rate(now, before, seconds, 'mqstore_index_queries_total'))}/s  "
            f"entries {now.get('mqstore_index_entries'):,.0f}"]


def txn_lines(now: Sample, before: Sample | None, seconds: float) -> list[str]:
    states = now.by("mqstore_txn_transactions", "state")
    return [f"  txns      open {states.get('OPEN', 0):,.0f}  parked {states.get('PARKED', 0):,.0f}  "
            f"oldest open {now.get('mqstore_txn_oldest_open_age_seconds'):,.1f} s  "
            f"half:OP {now.get('mqstore_txn_half_to_op_ratio'):.2f}",
            f"  checks    sent {now.get('mqstore_txn_checks_sent_total'):,.0f}  "
            f"answered {now.get('mqstore_txn_check_answers_total'):,.0f}  "
            f"cache hits {now.get('mqstore_txn_cache_hit_ratio'):.0%}"]


def compactor_lines(now: Sample, before: Sample | None, seconds: float) -> list[str]:
    dirty = now.by("mqstore_compactor_dirty_ratio", "topic")
    running = sum(v for _, v in now.rows("mqstore_compactor_round_running"))
    worst = max(dirty.items(), key=lambda kv: kv[1], default=("-", 0.0))
    return [f"  rounds    running {running:.0f}  quarantined {now.get('mqstore_compactor_quarantined_queues'):.0f}  "
            f"dirtiest {worst[0]} {worst[1]:.0%}"]


SECTIONS = {"commitlog": commitlog_lines, "index": index_lines, "txn": txn_lines, "compactor": compactor_lines}


def frame(targets: dict[str, str], now: dict[str, Sample], before: dict[str, Sample] | None, seconds: float) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [f"mqstore top  {stamp}  (rates over {seconds:.1f} s)"]
    for name, target in targets.items():
        sample = now[name]
        if sample.error:
            lines.append(f"{name:<10} {target}  DOWN ({sample.error})")
            continue
        lines.append(f"{name:<10} {target}  up")
        previous = before.get(name) if before else None
        lines += SECTIONS.get(name, lambda *a: [])(sample, previous, seconds)
        lines += _follower_lines(sample)
        lines.append(_rpc_line(sample, previous, seconds))
    return "\n".join(lines)


def _metrics_target(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + METRICS_PORT_OFFSET}"


def targets_of(args: argparse.Namespace) -> dict[str, str]:
    """Name -> HOST:PORT of each /metrics endpoint (``--metrics [NAME=]HOST:PORT``; NAME picks the section:
    commitlog, index, txn, compactor)."""
    if args.metrics:
        named = [m.split("=", 1) if "=" in m else (f"#{i + 1}", m) for i, m in enumerate(args.metrics)]
        return {name: target for name, target in named}
    # a replication group's --address (a:1,b:2,...): the first node's figures
    addresses = {"commitlog": args.address.split(",")[0].strip(), "index": args.index_address, "txn": args.txn_address,
                 "compactor": args.compactor_address.split(",")[0].strip(),
                 "gateway": os.environ.get("MQSTORE_GATEWAY_ADDRESS", DEFAULT_GATEWAY_ADDRESS)}
    return {name: _metrics_target(address) for name, address in addresses.items()}


def cmd_top(cli) -> int:
    a = cli.args
    targets = targets_of(a)
    stop = threading.Event()
    before = {name: fetch(t, a.timeout_s) for name, t in targets.items()}
    tty = cli.out.isatty()
    try:
        while True:
            stop.wait(a.interval)
            now = {name: fetch(t, a.timeout_s) for name, t in targets.items()}
            cli.out.write((CLEAR if tty and not a.once else "") + frame(targets, now, before, a.interval) + "\n")
            cli.out.flush()
            if a.once:
                return 0 if any(not s.error for s in now.values()) else 1
            before = now
    except KeyboardInterrupt:
        return 0


def add_commands(parser: argparse.ArgumentParser) -> None:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser("top", help="key figures of every service, live, from their /metrics endpoints")
    p.add_argument("--metrics", action="append", default=[], metavar="[NAME=]HOST:PORT",
                   help="a /metrics endpoint, NAME one of commitlog, index, txn, compactor (repeatable; default: "
                        "each service's address, port + 100)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    p.add_argument("--once", action="store_true", help="one frame, then exit (1 if no service answered)")
    p.add_argument("--timeout-s", type=float, default=3.0, help="per scrape (default 3)")
    p.set_defaults(func=cmd_top)
