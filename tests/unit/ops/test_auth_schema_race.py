"""Every service of `make run --auth` (the launcher) opens the one shared auth database at start, at the same
moment. Creating its tables must be serialised: before, a SQLite opener that read the schema in a deferred
transaction and then tried to write it got "database is locked" at once (the busy timeout does not apply to a
lock upgrade) and the service failed to start (5 of 15 rounds of 6 processes)."""

from __future__ import annotations

import multiprocessing

import pytest

from mqstore.clock import SystemClock
from mqstore.errors import MqStoreError
from mqstore.meta.auth import AuthStore
from mqstore.meta.txn_audit import AuditTrail

OPENERS = 6
ROUNDS = 4


def _open(args: tuple[str, str]) -> str:
    url, which = args
    try:
        if which == "auth":
            AuthStore(url, SystemClock()).close()
        else:
            AuditTrail(url).close()
        return "ok"
    except MqStoreError as exc:  # reported to the test, which names it
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("which", ["auth", "audit"])
def test_processes_opening_a_fresh_database_at_once_all_start(tmp_path, which):
    context = multiprocessing.get_context("spawn")
    with context.Pool(OPENERS) as pool:
        for round_no in range(ROUNDS):
            url = f"sqlite:///{tmp_path / f'{which}-{round_no}.db'}"
            failed = [r for r in pool.map(_open, [(url, which)] * OPENERS) if r != "ok"]
            assert not failed, f"round {round_no}: {failed[0]}"
