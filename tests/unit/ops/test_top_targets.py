"""`mqstore top` finds each service's /metrics endpoint from the addresses the CLI was given."""

from __future__ import annotations

from mqstore_rpc import cli, cli_compactor, cli_index, cli_top, cli_txn
from mqstore_rpc.cli_args import build_parser
from mqstore_rpc.cli_top import targets_of


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
