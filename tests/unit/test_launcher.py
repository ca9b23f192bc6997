"""The launcher's table of services (mqstore_rpc.launcher.SERVICES): each row gives a process command, a
--<name>-port flag, the --commitlog address for the services that follow the log, and banner lines."""

from __future__ import annotations

import pathlib
import sys

from mqstore_rpc import launcher


def test_each_row_gives_its_command_with_the_ports_asked_for():
    commitlog, index, txn, compactor, gateway = launcher.services({"index": 6002})
    assert [s.name for s in (commitlog, index, txn, compactor, gateway)] == [e.name for e in launcher.SERVICES] == [
        "commitlog", "index", "txn", "compactor", "gateway"]
    assert txn.command(pathlib.Path("/d"))[3:5] == ["--data-dir", "/d/txn"] and txn.port == 50053
    assert compactor.port == 50054 and compactor.command(pathlib.Path("/d"))[3:5] == ["--data-dir", "/d/compactor"]
    assert (commitlog.port, index.port) == (50051, 6002)
    assert index.command(pathlib.Path("/d")) == [
        sys.executable, "-m", "index_service.main", "--data-dir", "/d/index", "--host", "127.0.0.1",
        "--port", "6002", "--commitlog", "127.0.0.1:50051"]
    assert launcher.services({"commitlog": 7001})[1].extra_args == ("--commitlog", "127.0.0.1:7001")
    assert commitlog.command(pathlib.Path("/d"))[3:5] == ["--data-dir", "/d"] and commitlog.extra_args == ()
    assert gateway.port == 8081 and gateway.extra_args == ("--commitlog", "127.0.0.1:50051", "--txn",
                                                          "127.0.0.1:50053")
    assert launcher.services({"txn": 7003})[4].extra_args[2:] == ("--txn", "127.0.0.1:7003")


def test_every_row_has_a_port_flag(monkeypatch):
    seen = {}
    monkeypatch.setattr(launcher, "run", lambda data_dir, ports: seen.update(ports) or 0)
    assert launcher.main(["--data-dir", "/tmp/x", "--index-port", "6002"]) == 0
    assert seen == {"commitlog": 50051, "index": 6002, "txn": 50053, "compactor": 50054, "gateway": 8081}


def test_the_internal_token_is_made_once_per_data_dir_and_the_variable_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(launcher.TOKEN_ENV, raising=False)
    first = launcher.internal_token(tmp_path)
    assert len(first) == 64 and launcher.internal_token(tmp_path) == first
    assert (tmp_path / "internal-token").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(launcher.TOKEN_ENV, "given")
    assert launcher.internal_token(tmp_path) == "given"


def test_the_banner_exports_moved_addresses_and_shows_each_rows_examples():
    class Running:
        def __init__(self, service):
            self.service = service

    text = launcher.banner([Running(s) for s in launcher.services({"index": 6002})])
    assert "export MQSTORE_INDEX_ADDRESS=127.0.0.1:6002\n" in text and "MQSTORE_ADDRESS=" not in text
    assert "grpcurl -plaintext 127.0.0.1:50051 list" in text and "mqstore query key demo k1" in text
