"""The launcher's table of services (mqstore_launcher.launcher.SERVICES): each row gives a process command, a
--<name>-port flag, the --commitlog address for the services that follow the log, and banner lines; the
smaller file sizes of a data dir that ``make run`` creates. (Starting, ports and failures:
tests/integration/test_launcher.py.)"""

from __future__ import annotations

import pathlib
import sys

import pytest
from mqstore_launcher import launcher
from mqstore_launcher import main as launcher_main


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
    monkeypatch.setattr(launcher, "run", lambda data_dir, ports, **_: seen.update(ports) or 0)
    assert launcher_main.main(["--data-dir", "/tmp/x", "--index-port", "6002"]) == 0
    assert seen == {"commitlog": 50051, "index": 6002, "txn": 50053, "compactor": 50054, "gateway": 8081}


def test_the_internal_token_is_made_once_per_data_dir_and_the_variable_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(launcher.TOKEN_ENV, raising=False)
    first = launcher.internal_token(tmp_path)
    assert len(first) == 64 and launcher.internal_token(tmp_path) == first
    assert (tmp_path / "internal-token").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(launcher.TOKEN_ENV, "given")
    assert launcher.internal_token(tmp_path) == "given"


def test_the_banner_exports_moved_addresses_and_shows_each_rows_examples_and_the_disk(tmp_path):
    (tmp_path / "file").write_bytes(b"x" * (3 << 20))
    text = launcher.banner(list(launcher.services({"index": 6002})), tmp_path, embedded=True)
    assert "export MQSTORE_INDEX_ADDRESS=127.0.0.1:6002\n" in text and "MQSTORE_ADDRESS=" not in text
    assert "grpcurl -plaintext 127.0.0.1:50051 list" in text and "mqstore query key demo k1" in text
    [disk] = [line for line in text.splitlines() if line.startswith("  disk")]
    assert f"3.0 MiB in {tmp_path} (commit log segments of 64 MiB, preallocated)" in disk, disk


def test_a_new_data_dir_gets_the_embedded_sizes_unless_a_variable_sets_them(tmp_path):
    assert launcher.uses_embedded_sizes(tmp_path / "new")
    commitlog, index, txn, compactor, gateway = launcher.services(embedded=True, env={})
    assert commitlog.extra_args == ("--segment-size-bytes", str(64 << 20), "--warm-ahead-bytes", str(4 << 20),
                                    "--cq-entries-per-file", "50000")
    assert index.extra_args == ("--commitlog", "127.0.0.1:50051", "--slot-count", "100000", "--entry-count", "400000")
    assert txn.extra_args == ("--commitlog", "127.0.0.1:50051")
    assert compactor.extra_args == ("--commitlog", "127.0.0.1:50051", "--segment-size-bytes", str(8 << 20))
    assert gateway.extra_args == ("--commitlog", "127.0.0.1:50051", "--txn", "127.0.0.1:50053")
    commitlog = launcher.services(embedded=True, env={"MQSTORE_SEGMENT_SIZE_BYTES": "1GiB"})[0]
    assert commitlog.extra_args == ("--warm-ahead-bytes", str(4 << 20), "--cq-entries-per-file", "50000")


def _segment(data_dir: pathlib.Path, size: int) -> None:
    (data_dir / "commitlog").mkdir(parents=True)
    with open(data_dir / "commitlog" / f"{0:020d}", "wb") as f:
        f.truncate(size)  # sparse: the size is what counts
    (data_dir / "commitlog" / "00000000000000000000.broken").write_bytes(b"")


def test_a_data_dir_made_with_other_segment_sizes_keeps_the_services_defaults(tmp_path):
    _segment(tmp_path / "big", 1 << 30)
    assert not launcher.uses_embedded_sizes(tmp_path / "big")  # its log would not open with 64 MiB segments
    assert launcher.services(embedded=False, env={})[0].extra_args == ()
    assert "segments of 1,024 MiB, preallocated, as this data dir was made" in launcher.sizes_text(
        tmp_path / "big", embedded=False)
    _segment(tmp_path / "small", 64 << 20)
    assert launcher.uses_embedded_sizes(tmp_path / "small")


def test_the_ha_port_plan_puts_n1_on_the_commit_log_port_and_n2_n3_above_it_or_where_asked():
    from mqstore_launcher import ha
    assert ha.node_ports() == ha.NODES == (("n1", 50051), ("n2", 50061), ("n3", 50071))
    assert ha.node_ports({"commitlog": 61051, "index": 61052}) == (("n1", 61051), ("n2", 61061), ("n3", 61071))
    assert ha.node_ports({"commitlog": 61051, "commitlog-n3": 7003}) == (("n1", 61051), ("n2", 61061), ("n3", 7003))
    with pytest.raises(ValueError, match="node n3's port would be 65540: give it one with --commitlog-n3-port"):
        ha.node_ports({"commitlog": 65520})
    others = launcher.services({"index": 6002})[1:2]
    assert ha.wanted_ports(ha.node_ports({"commitlog": 6001}), others) == [
        ("commitlog", 6001), ("commitlog-n2", 6011), ("commitlog-n3", 6021), ("index", 6002),
        ("commitlog metrics", 6101), ("commitlog-n2 metrics", 6111), ("commitlog-n3 metrics", 6121),
        ("index metrics", 6102)]


def test_the_ha_etcd_plan_is_three_members_with_a_client_and_a_peer_port_each_movable_by_flags():
    from mqstore_launcher import ha
    assert ha.etcd_ports() == (("e1", 2379, 2380), ("e2", 2389, 2390), ("e3", 2399, 2400))
    assert ha.etcd_ports({"etcd": 30000}) == (("e1", 30000, 30001), ("e2", 30010, 30011), ("e3", 30020, 30021))
    assert ha.etcd_ports({"etcd": 30000, "etcd-peer": 31000, "etcd-e3": 7003, "etcd-e2-peer": 7004}) == (
        ("e1", 30000, 31000), ("e2", 30010, 7004), ("e3", 7003, 31020))
    with pytest.raises(ValueError, match="etcd member e3's peer port would be 65541: give it one with "
                                         "--etcd-e3-peer-port"):
        ha.etcd_ports({"etcd": 1000, "etcd-peer": 65521})
    members = ha.etcd_ports({"etcd": 7001})
    assert ha.wanted_ports(ha.node_ports({"commitlog": 6001}), [], members)[-6:] == [
        ("etcd", 7001), ("etcd-peer", 7002), ("etcd-e2", 7011), ("etcd-e2-peer", 7012), ("etcd-e3", 7021),
        ("etcd-e3-peer", 7022)]


def test_every_ha_node_is_given_every_etcd_member(tmp_path):
    from commitlog_service.main import parse_config
    from mqstore_launcher import ha
    endpoints = ",".join(f"127.0.0.1:{client}" for _, client, _ in ha.etcd_ports())
    for node in ha._node_services(endpoints, tmp_path, embedded=False):
        config = parse_config(node.command(tmp_path)[3:], {})
        assert config.replication.etcd_endpoints == "127.0.0.1:2379,127.0.0.1:2389,127.0.0.1:2399"


def test_ha_mode_takes_the_port_flags_of_make_run_and_the_nodes_own(monkeypatch):
    from mqstore_launcher import ha
    seen = {}
    monkeypatch.setattr(ha, "run", lambda data_dir, ports, tls, auth, service_logs: seen.update(ports) or 0)
    assert launcher_main.main(["--data-dir", "/tmp/x", "--ha", "--commitlog-port", "61051", "--gateway-port",
                               "61081", "--commitlog-n3-port", "61099"]) == 0
    assert seen == {"commitlog": 61051, "index": 50052, "txn": 50053, "compactor": 50054, "gateway": 61081,
                    "commitlog-n3": 61099}
    assert [port for _, port in ha.node_ports(seen)] == [61051, 61061, 61099]
    seen.clear()
    assert launcher_main.main(["--data-dir", "/tmp/x", "--ha", "--etcd-port", "62379", "--etcd-e2-peer-port",
                               "62999"]) == 0
    assert (seen["etcd"], seen["etcd-e2-peer"]) == (62379, 62999) and "etcd-e3" not in seen
    assert ha.etcd_ports(seen) == (("e1", 62379, 62380), ("e2", 62389, 62999), ("e3", 62399, 62400))


def test_ha_mode_runs_the_index_the_txn_service_and_the_gateway_twice_on_ports_of_their_own(monkeypatch):
    """issue 34: a second Index, Transaction service and gateway, 10 above the first or on --index-2-port /
    --txn-2-port / --gateway-2-port, each with its own data dir and the first one's flags."""
    from mqstore_launcher import ha
    seen = {}
    monkeypatch.setattr(ha, "run", lambda data_dir, ports, tls, auth, service_logs: seen.update(ports) or 0)
    assert launcher_main.main(["--data-dir", "/tmp/x", "--ha", "--gateway-2-port", "61091"]) == 0
    assert seen["gateway-2"] == 61091 and "index-2" not in seen
    planned = ha.with_second_instances(launcher.services(seen)[1:], seen)
    assert [(s.name, s.port) for s in planned] == [
        ("index", 50052), ("index-2", 50062), ("txn", 50053), ("txn-2", 50063), ("compactor", 50054),
        ("compactor-2", 50064),
        ("gateway", 8081), ("gateway-2", 61091)]
    first, second = planned[0], planned[1]
    assert second.extra_args == first.extra_args and second.entry.data_subdir == "index-2"
    assert ha.instances_text(planned) == (
        "Index instances: 127.0.0.1:50052,127.0.0.1:50062 (`export MQSTORE_INDEX_ADDRESS=127.0.0.1:50052,"
        "127.0.0.1:50062`: a query one cannot answer goes to the next).\n"
        "Transaction services (active and standby): 127.0.0.1:50053,127.0.0.1:50063 (`export MQSTORE_TXN_ADDRESS="
        "127.0.0.1:50053,127.0.0.1:50063`: the standby's refusal sends a call to the active one).\n"
        "Compactors: 127.0.0.1:50054,127.0.0.1:50064 (`export MQSTORE_COMPACTOR_ADDRESS=127.0.0.1:50054,"
        "127.0.0.1:50064`: either answers reads; rounds run on the one holding the etcd lease).\n"
        'Gateways: give the RocketMQ clients both, endpoints "127.0.0.1:8081;127.0.0.1:61091" (sends go on '
        "through the other when one stops).\n")


def test_a_node_port_without_ha_or_beyond_65535_is_a_usage_error(capsys):
    for argv, said in ((["--commitlog-n2-port", "6002"], "--commitlog-n2-port is for --ha (make run-ha) only"),
                       (["--gateway-2-port", "6002"], "--gateway-2-port is for --ha (make run-ha) only"),
                       (["--ha", "--gateway-port", "65530"], "gateway-2's port would be 65540"),
                       (["--etcd-e3-peer-port", "6002"], "--etcd-e3-peer-port is for --ha (make run-ha) only"),
                       (["--ha", "--etcd-port", "65530"], "etcd member e2's client port would be 65540"),
                       (["--ha", "--commitlog-port", "65530"], "node n2's port would be 65540")):
        with pytest.raises(SystemExit) as exited:
            launcher_main.main(["--data-dir", "/tmp/x", *argv])
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_ha_mode_gives_its_nodes_topic_metadata_they_share(tmp_path):
    """make run-ha's three nodes keep their topics in the etcd they elect their leader through (every member
    given), which a group node accepts; without --metadata-url (SQLite inside the data dir) it is refused."""
    from commitlog_service.main import parse_config
    from mqstore.errors import InvalidArgument
    from mqstore_launcher import ha
    for node in ha._node_services("127.0.0.1:2379,127.0.0.1:2389", tmp_path, embedded=False):
        argv = node.command(tmp_path)[3:]
        assert parse_config(argv, {}).store.metadata_url == "etcd://127.0.0.1:2379,127.0.0.1:2389/mqstore/meta"
        at = argv.index("--metadata-url")
        without = argv[:at] + argv[at + 2:]
        with pytest.raises(InvalidArgument, match=r"--metadata-url \(MQSTORE_METADATA_URL\)"):
            parse_config(without, {})


