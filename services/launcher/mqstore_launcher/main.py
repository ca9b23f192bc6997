"""``python -m mqstore_launcher`` (``make run``, ``make run-ha``, ``make run-tls``): its options, then the
launcher of every service on loopback (:mod:`mqstore_launcher.launcher`) or, with ``--ha``, its HA mode
(:mod:`mqstore_launcher.ha`, which builds on the first; neither imports this module)."""

from __future__ import annotations

import argparse
import pathlib
import sys

from mqstore import defaults
from mqstore_rpc import private_files

from mqstore_launcher import launcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore_launcher", description="run every mqstore service locally "
                                     "(make run, make run-ha; RUN_ARGS=\"...\" passes these options)")
    parser.add_argument("--data-dir", type=pathlib.Path, default=pathlib.Path("data"),
                        help="where every service keeps its files (default ./data)")
    for entry in launcher.SERVICES:
        parser.add_argument(f"--{entry.name}-port", dest=entry.name, type=_port, default=entry.default_port,
                            metavar="PORT", help=f"{entry.name}'s port on 127.0.0.1 (default {entry.default_port})")
    parser.add_argument("--tls", action="store_true", help="TLS everywhere, with a throwaway CA in <data-dir>/tls")
    parser.add_argument("--auth", action="store_true", help="authentication and permissions on (or MQSTORE_AUTH=on)")
    parser.add_argument("--service-logs", choices=launcher.SERVICE_LOGS, default="files",
                        help="files (default): each service's JSON log goes to <data-dir>/logs/<service>.log, the "
                        "terminal keeps the launcher's own lines; stream: the services' logs on this terminal too")
    parser.add_argument("--ha", action="store_true", help="three commit log replicas with automatic failover "
                        "through a local etcd cluster of three members, and the other services "
                        "(mqstore_launcher.ha; make run-ha)")
    for rank, node_id in enumerate(HA_NODES, 1):
        parser.add_argument(f"--commitlog-{node_id}-port", dest=f"commitlog-{node_id}", type=_port, default=None,
                            metavar="PORT", help=f"with --ha: node {node_id}'s port on 127.0.0.1 (default: "
                            f"--commitlog-port + {rank * defaults.HA_NODE_PORT_STEP}); n1 is on --commitlog-port")
    for name in HA_TWICE:
        parser.add_argument(f"--{name}-2-port", dest=f"{name}-2", type=_port, default=None, metavar="PORT",
                            help=f"with --ha: the second {name}'s port on 127.0.0.1 (default: --{name}-port + "
                            f"{defaults.HA_NODE_PORT_STEP})")
    for rank, member in enumerate(ETCD_MEMBERS):
        name = "etcd" if rank == 0 else f"etcd-{member}"
        above = f"--etcd-port + {rank * defaults.HA_NODE_PORT_STEP}" if rank else str(defaults.ETCD_PORT)
        parser.add_argument(f"--{name}-port", dest=name, type=_port, default=None, metavar="PORT",
                            help=f"with --ha: etcd member {member}'s client port on 127.0.0.1 (default {above})")
        peer_above = f"--etcd-peer-port + {rank * defaults.HA_NODE_PORT_STEP}" if rank else "--etcd-port + 1"
        parser.add_argument(f"--{name}-peer-port", dest=f"{name}-peer", type=_port, default=None, metavar="PORT",
                            help=f"with --ha: etcd member {member}'s peer port on 127.0.0.1 (default {peer_above})")
    args = parser.parse_args(argv)
    ports = {entry.name: getattr(args, entry.name) for entry in launcher.SERVICES}
    ha_names = [f"commitlog-{n}" for n in HA_NODES] + [f"{name}-2" for name in HA_TWICE] + [
        f"{name}{peer}" for name in ["etcd"] + [f"etcd-{m}" for m in ETCD_MEMBERS[1:]] for peer in ("", "-peer")]
    node_ports = {name: getattr(args, name) for name in ha_names if getattr(args, name) is not None}
    if node_ports and not args.ha:
        parser.error(f"--{next(iter(node_ports))}-port is for --ha (make run-ha) only")
    private_files.private_umask()  # what it makes (the data dir, the token, tls/) is its user's only, as the services
    if args.ha:
        from mqstore_launcher import ha  # only this mode needs etcd
        try:
            ha.node_ports({**ports, **node_ports})
            ha.with_second_instances(launcher.services(ports)[1:], node_ports)
            ha.etcd_ports(node_ports)
        except ValueError as exc:  # n2, n3, a second instance or an etcd member's port derived above 65535
            parser.error(str(exc))
        return ha.run(args.data_dir.resolve(), {**ports, **node_ports}, tls=args.tls, auth=args.auth,
                      service_logs=args.service_logs)
    return launcher.run(args.data_dir.resolve(), ports, tls=args.tls, auth=args.auth, service_logs=args.service_logs)


HA_NODES = ("n2", "n3")  # mqstore_launcher.ha.NODE_IDS after n1 (not imported here: ha needs etcd's client)
HA_TWICE = ("index", "txn", "compactor", "gateway")  # mqstore_launcher.ha.TWICE: a second instance of each with --ha
ETCD_MEMBERS = ("e1", "e2", "e3")  # mqstore_launcher.ha.ETCD_MEMBERS


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, not {port}")  # 0 would hide the address
    return port


if __name__ == "__main__":
    sys.exit(main())
