"""`mqstore top` finds each service's /metrics endpoint from the addresses the CLI was given."""

from __future__ import annotations

from mqstore_cli import compactor as cli_compactor
from mqstore_cli import index as cli_index
from mqstore_cli import main as cli
from mqstore_cli import top as cli_top
from mqstore_cli import txn as cli_txn
from mqstore_cli.args import build_parser
from mqstore_cli.top import targets_of


def _args(*argv: str):
    parser = build_parser(cli)
    for commands in (cli_index, cli_txn, cli_compactor, cli_top):  # the flags naming the other services
        commands.add_commands(parser)
    return parser.parse_args([*argv, "top", "--once"])


def test_a_replication_group_address_scrapes_its_first_node():
    targets = targets_of(_args("--address", "127.0.0.1:50051,127.0.0.1:50061,127.0.0.1:50071"))
    assert targets["commitlog"] == "127.0.0.1:50151"


def test_one_address_scrapes_its_port_plus_100():
    assert targets_of(_args("--address", "10.0.0.5:6000"))["commitlog"] == "10.0.0.5:6100"


def test_a_follower_without_a_tail_frame_yet_shows_its_lag_as_unknown():
    sample = cli_top.Sample()
    for name, connected in (("index-follower", 1), ("txn-follower", 0)):
        sample.values[("mqstore_follower_connected", (("follower", name),))] = connected
        sample.values[("mqstore_follower_lag_seconds", (("follower", name),))] = 0.0 if connected else 12.5
    sample.values[("mqstore_follower_lag_bytes", (("follower", "index-follower"),))] = 2048
    lines = cli_top._follower_lines(sample)
    assert lines == ["  follower  index-follower: lag 2.0 KiB (0.0 s)  connected",
                     "  follower  txn-follower: lag unknown (no Tail frame yet) (12.5 s)  DISCONNECTED"]
