"""The commit log's settings of the Transaction service in Local mode (mqstore-commitlog --txn-port): off
unless a port is given, --txn-data-dir defaulting under the commit log's data directory, --txn-<field> for
each TxnConfig field, and a bad value refused at start with the flag that sets it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from commitlog_service.main import describe
from mqstore_launcher.node import local_mode, parse_config
from mqstore.errors import InvalidArgument


def test_local_mode_is_off_unless_a_txn_port_is_given_and_takes_txn_flags():
    assert local_mode(parse_config(["--data-dir", "/tmp/x"], {})).txn is None
    local = local_mode(parse_config(["--data-dir", "/tmp/x", "--txn-port", "18053", "--txn-op-batch-max-bytes", "1",
                                     "--txn-rpc-timeout-ms", "500"], {"MQSTORE_TXN_CHECK_ANSWER_WORKERS": "3"})).txn
    assert (local.port, local.rpc_timeout_ms, local.max_workers) == (18053, 500, None)
    assert (local.txn.op_batch_max_bytes, local.txn.check_answer_workers) == (1, 3)
    assert local.txn.data_dir == pathlib.Path("/tmp/x/txn")
    from_env = local_mode(parse_config(["--data-dir", "/tmp/x", "--txn-data-dir", "/tmp/t"],
                                       {"MQSTORE_TXN_PORT": "0"})).txn
    assert (from_env.port, from_env.txn.data_dir) == (0, pathlib.Path("/tmp/t"))


def test_the_metadata_url_is_not_shown_in_the_started_event():
    config = parse_config(["--data-dir", "/tmp/x", "--txn-port", "0", "--txn-metadata-url",
                           "postgresql://u:secret@db/txn"], {})
    shown = describe(config, 50051)["txn"]
    assert shown["port"] == 0 and shown["txn"]["metadata_url"] == "<set>" and "secret" not in repr(shown)


@pytest.mark.parametrize("flags, says", [
    (["--txn-port", "70000"], "txn_port must be in 0..65535"),
    (["--txn-port", "any"], "--txn-port / MQSTORE_TXN_PORT"),
    (["--txn-port", "0", "--txn-op-batch-max-bytes", "0"], "--txn-<field>"),
    (["--txn-port", "0", "--txn-follow-linger-ms", "5000"], "follow_linger_ms must be in [0, 1000]"),
    (["--txn-port", "0", "--txn-rpc-timeout-ms", "0"], "txn_rpc_timeout_ms must be positive"),
    (["--txn-port", "0", "--txn-max-workers", "-1"], "txn_max_workers must be positive"),
])
def test_bad_txn_flags_are_a_config_error_naming_the_setting(flags, says):
    with pytest.raises(InvalidArgument) as refused:
        parse_config(["--data-dir", "/tmp/x", *flags], {})
    assert says in str(refused.value)


def test_a_bad_txn_flag_stops_the_process_with_status_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mqstore_launcher.node", "--data-dir", str(tmp_path), "--port", "0",
                          "--txn-port", "0", "--txn-check-max", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "config.invalid" in run.stderr and "check_max must be positive" in run.stderr
    assert not (tmp_path / "txn").exists()  # refused before anything was made


def test_the_commit_log_alone_refuses_a_variable_that_turns_local_mode_on():
    """commitlog_service.main composes no Local mode (mqstore-commitlog does): a variable asking for it is a
    config error naming the command, not a process silently without its gateway or Transaction port."""
    from commitlog_service.main import parse_config as parse_commitlog_alone
    for name in ("MQSTORE_TXN_PORT", "MQSTORE_GATEWAY_PORT"):
        with pytest.raises(InvalidArgument, match=f"{name} is set, but .* run mqstore-commitlog"):
            parse_commitlog_alone(["--data-dir", "/tmp/x"], {name: "0"})


@pytest.mark.parametrize("flag", ["--txn-one-way-workers", "--txn-one-way-queue"])
def test_the_one_way_workers_flags_are_gone_and_refused(flag, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_config(["--data-dir", "/tmp/x", "--txn-port", "0", flag, "3"], {})
    assert exited.value.code == 2 and f"unrecognized arguments: {flag} 3" in capsys.readouterr().err
