"""The Local-mode Transaction service's settings on the commit log's command line (``mqstore-commitlog``,
composed by mqstore_launcher.node): ``--txn-port PORT`` (env ``MQSTORE_TXN_PORT``) turns it on;
``--txn-data-dir`` (default ``<data-dir>/txn``), ``--txn-rpc-timeout-ms``, ``--txn-max-workers`` and
``--txn-<field>`` for each field of TxnConfig."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Mapping

from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.txn.config import TxnConfig

from mqstore_rpc import settings as S

from .composition import LocalTxnConfig

FLAGS = {
    "txn_port": "serve the Transaction service (mqstore.v1.Transaction) from this process on this port (Local mode; "
                "0 = any free port); unset = no Transaction service here",
    "txn_data_dir": "Local-mode Transaction service: its state directory (default <data-dir>/txn)",
    "txn_rpc_timeout_ms": "Local-mode Transaction service: how long a call waits for its append (default 10000)",
    "txn_max_workers": "Local-mode Transaction service: handler threads of its port (default 64 plus one per "
                       "stream it admits)",
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    S.add_texts(parser, FLAGS)
    S.add_flags(parser, TxnConfig, skip={"data_dir"}, prefix="txn_",
                about="Local-mode Transaction service: {field} (README)")


def parse(args: argparse.Namespace, env: Mapping[str, str], store: StoreConfig) -> LocalTxnConfig | None:
    port = S.typed(args, env, "txn_port", S.parse_int, None)
    if port is None:
        return None
    values = S.values_for(args, env, TxnConfig, skip={"data_dir"}, prefix="txn_")
    data_dir = S.typed(args, env, "txn_data_dir", pathlib.Path, store.data_dir / "txn")
    try:
        txn = TxnConfig(data_dir=data_dir, **values)
    except InvalidArgument as exc:  # the domain names its field: say which flag sets it
        raise InvalidArgument(f"Local-mode Transaction service (--txn-<field> / MQSTORE_TXN_<FIELD>): {exc}") from None
    return LocalTxnConfig(port=port, txn=txn,
                          rpc_timeout_ms=S.typed(args, env, "txn_rpc_timeout_ms", S.parse_int, 10_000),
                          max_workers=S.typed(args, env, "txn_max_workers", S.parse_int, None))


def describe(local: LocalTxnConfig | None) -> dict | None:
    if local is None:
        return None
    described = dataclasses.asdict(dataclasses.replace(local, clock=None))
    described["txn"]["metadata_url"] = "<set>" if local.txn.metadata_url else ""  # it may hold a password
    return described
