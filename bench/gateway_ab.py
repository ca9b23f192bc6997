"""Same-run A/B of two gateway trees in Cluster mode: ``gateway_ab.py OLD_TREE COUNT ROUNDS MANY_COUNT``.

OLD_TREE is a copy of the repository's ``core`` and ``services`` at another commit (e.g. ``git archive`` of
it, with the generated stubs and compiled codec copied in); this tree's gateway is "new". One commit log and
one Transaction service (this tree's), both gateways on them, and in alternating rounds: the official Python
client's sequential loop of COUNT sends through each gateway and the direct Append loop (bench/gateway.py's
shapes), and when MANY_COUNT > 0, 16 client processes at once (MANY_COUNT sends each) through each gateway
and 16 direct loops. Prints each round and the medians' ratios. Not in ``make bench``; used for issue 37's
A/B figures (bench/README.md, *The RocketMQ 5 gateway benchmark*).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gateway as g
from procs import spawn, stop_all, wait_for_event


def main(argv: list[str]) -> int:
    old_tree, count, rounds, many_count = pathlib.Path(argv[0]).resolve(), int(argv[1]), int(argv[2]), int(argv[3])
    cfg = {"count": count, "warmup": 300, "rounds": 1, "many": 16, "many_count": many_count}
    work = pathlib.Path(tempfile.mkdtemp(prefix="gateway-ab-"))
    new_path = os.environ["PYTHONPATH"]
    old_path = new_path.replace(str(g.ROOT), str(old_tree))

    def start_gateway(path: str, name: str, log_address: str, txn_address: str):
        log_path = work / f"{name}.err"
        proc = spawn([sys.executable, "-m", "gateway_service.main", "--port", "0", "--commitlog", log_address,
                      "--txn", txn_address], log_path,
                     env={**os.environ, "MQSTORE_INTERNAL_TOKEN": g.TOKEN, "PYTHONPATH": path})
        return f"127.0.0.1:{wait_for_event(proc, log_path, 'server.started', 60)['port']}"

    rates: dict[str, list[float]] = {k: [] for k in ("new", "old", "direct", "many_new", "many_old", "many_direct")}
    try:
        _, log_address = g.start("commitlog_service.main", ["--data-dir", str(work / "log")], work / "log.err")
        _, txn_address = g.start("txn_service.main", ["--data-dir", str(work / "txn"), "--commitlog", log_address],
                                 work / "txn.err")
        g.create_topic(log_address)
        new_gw = start_gateway(new_path, "new", log_address, txn_address)
        old_gw = start_gateway(old_path, "old", log_address, txn_address)
        for r in range(rounds):
            rates["new"].append(g.client_rate("python", new_gw, cfg, work / f"new-{r}"))
            rates["direct"].append(g.direct_rate(log_address, cfg))
            rates["old"].append(g.client_rate("python", old_gw, cfg, work / f"old-{r}"))
            if many_count:
                rates["many_new"].append(g.many_clients_rate(new_gw, cfg, work / f"many-new-{r}"))
                rates["many_direct"].append(g.many_direct_rate(log_address, cfg))
                rates["many_old"].append(g.many_clients_rate(old_gw, cfg, work / f"many-old-{r}"))
            print(r, {k: round(v[-1]) for k, v in rates.items() if v}, "load", os.getloadavg()[0], flush=True)
    finally:
        stop_all()
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    print(f"sequential: new {med['new'] / med['direct']:.3f}x, old {med['old'] / med['direct']:.3f}x the direct loop")
    if many_count:
        print(f"16 clients: new {med['many_new'] / med['many_direct']:.3f}x, old "
              f"{med['many_old'] / med['many_direct']:.3f}x 16 direct loops")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
