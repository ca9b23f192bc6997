"""Issue 32, items 5 and 7, as attacks: with authentication on,

* a user with SUB only cannot stop retention of the whole log by naming a retention hold in a Tail
  (``hold_retention_as``): PERMISSION_DENIED, and retention deletes the segments it would have kept (the
  issue's scenario: 64 KiB segments, 1 s retention);
* an administrator's hold ends a grace period after its stream closes (the issue saw 7 days), while the
  internal identity's (the compactor's, the Transaction service's) outlives its stream; ListRetentionHolds
  shows both;
* a service's files are its user's only (umask 077: data dir 0700, databases, their WAL, segments 0600),
  and it warns at start when the kek sits in its data directory.

The commit log runs in this process (the retention cases, in plaintext and over TLS) or as a process of
its own (the file cases: the umask is the process's; the transport changes no file).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import stat
import subprocess

import grpc
import pytest

from commitlog_service.main import serving as commitlog_serving
from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from mqstore_rpc.private_files import secrets_in
from mqstore_rpc.secret import Secret
from mqstore_rpc.server import AuthConfig, ServerConfig
from tests.integration.test_auth_matrix import _auth, _bearer
from tests.integration.test_cli import CLI_TIMEOUT_S, MQSTORE
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.txn_testing import TOKEN
from tests.support.processes import commitlog as commitlog_process
from tests.support.transport import TRANSPORTS, Transport
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
T = 10
SEGMENT = 64 * 1024
GRACE_MS = 3000
BODY = b"r" * (15 * 1024)  # four messages a batch: about one segment
READER, OPERATOR = "reader", "operator"
SERVICE = _bearer(access.SERVICE_USER, TOKEN)


def _secret(user: str) -> str:
    return f"secret-of-{user}-0123456789"


def _as(user: str) -> tuple:
    return _bearer(user, _secret(user))


@pytest.fixture(params=TRANSPORTS)
def log(tmp_path, request, certs):
    """A commit log with auth on, 64 KiB segments and 1 s retention checked every 100 ms, in plaintext and over
    TLS; users ``reader`` (SUB on every topic and the cluster) and ``operator`` (also ADMIN). Yields a CommitLog
    stub, the port and the CLI's environment for it."""
    transport = Transport(request.param, certs)
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    server, _ = _auth(url, kek_file=str(tmp_path / "auth.kek"), transport=transport)
    config = dataclasses.replace(
        make_config(tmp_path / "log", segment_size_bytes=SEGMENT, retention_ms=1000, clean_interval_ms=100,
                    flush_interval_ms=50, retention_hold_grace_ms=GRACE_MS), server=server, internal_token=TOKEN)
    store = AuthStore(url, SystemClock())
    try:
        admin = AccessAdmin(store, kek=Kek(tmp_path / "auth.kek", create=True))
        for user, actions in ((READER, {access.SUB}), (OPERATOR, {access.SUB, access.ADMIN})):
            admin.create_user(user, access.NORMAL, _secret(user))
            for kind in (access.TOPIC, access.CLUSTER):
                admin.add_rule(user, kind, "*", frozenset(actions), access.ALLOW)
    finally:
        store.close()
    with commitlog_serving(config) as (_, port), transport.channel(port) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=1), metadata=SERVICE, timeout=T)
        wait_until(lambda: _answers(stub, OPERATOR), "the server to see the new users (auth_refresh_ms)")
        yield stub, port, ({"MQSTORE_TLS_CA": str(certs / "ca.pem")} if transport.kind == "tls" else {})


def _answers(stub, user: str) -> bool:
    try:
        stub.ListRetentionHolds(cpb.ListRetentionHoldsRequest(), metadata=_as(user), timeout=T)
    except grpc.RpcError:
        return False
    return True


def _fill(stub, segments: int) -> list[int]:
    """About ``segments`` segments of records; the physical offset of each batch's first record."""
    starts = []
    for _ in range(segments):
        response = stub.Append(cpb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=BODY)] * 4),
                               metadata=SERVICE, timeout=T)
        starts.append(response.results[0].physical_offset)
    return starts


def _info(stub) -> cpb.StoreInfo:
    return stub.GetStoreInfo(cpb.GetStoreInfoRequest(), metadata=SERVICE, timeout=T)


def _holds(stub) -> dict[str, cpb.RetentionHold]:
    listed = stub.ListRetentionHolds(cpb.ListRetentionHoldsRequest(), metadata=_as(OPERATOR), timeout=T)
    return {h.name: h for h in listed.holds}


def _tail(stub, metadata, **fields):
    """A Tail stream that has sent its first frame (so its hold is open)."""
    stream = stub.Tail(cpb.TailRequest(heartbeat_ms=50, **fields), metadata=metadata, timeout=60)
    next(stream)
    return stream


def test_a_sub_only_users_tail_cannot_hold_retention_and_the_log_is_deleted(log):
    log, _, _ = log
    _fill(log, 19)
    assert _info(log).segment_count >= 18
    with pytest.raises(grpc.RpcError) as denied:
        _tail(log, _as(READER), start=cpb.TAIL_START_EARLIEST, hold_retention_as="x")
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "ADMIN" in denied.value.details() and READER in denied.value.details()
    with pytest.raises(grpc.RpcError) as listing:  # nor may it see the holds
        log.ListRetentionHolds(cpb.ListRetentionHoldsRequest(), metadata=_as(READER), timeout=T)
    assert listing.value.code() == grpc.StatusCode.PERMISSION_DENIED
    reading = _tail(log, _as(READER), start=cpb.TAIL_START_EARLIEST, topics=["t"])  # its Tail without a hold: fine
    try:
        wait_until(lambda: _info(log).segment_count <= 2, "retention to delete the expired segments", timeout_s=60)
        assert _holds(log) == {}
    finally:
        reading.cancel()


def test_an_admins_hold_ends_after_the_grace_and_the_services_outlives_its_stream(log):
    log, port, tls_env = log
    starts = _fill(log, 12)
    kept = starts[6]  # the internal identity holds from here
    backup = _tail(log, _as(OPERATOR), start=cpb.TAIL_START_EARLIEST, hold_retention_as="backup")
    service = _tail(log, SERVICE, start=cpb.TAIL_START_AT_OFFSET, from_physical_offset=kept,
                    hold_retention_as="svc")
    holds = _holds(log)
    assert (holds["backup"].open_streams, holds["backup"].durable, holds["backup"].physical_offset) == (1, False, 0)
    assert (holds["svc"].open_streams, holds["svc"].durable, holds["svc"].physical_offset) == (1, True, kept)
    backup.cancel()
    service.cancel()
    closed = wait_until(lambda: (h := _holds(log)) and all(x.open_streams == 0 for x in h.values()) and h,
                        "both streams to end on the server")
    assert closed["backup"].lapses_at_ms - closed["backup"].closed_ms == GRACE_MS
    assert closed["svc"].lapses_at_ms - closed["svc"].closed_ms == 7 * 24 * 3600 * 1000  # retention_hold_max_ms
    # Once the grace is over, retention deletes up to the segment of the service's hold, and no further.
    wait_until(lambda: _info(log).min_physical_offset == kept - kept % SEGMENT,
               "retention to delete below the service's hold once the administrator's has ended", timeout_s=60)
    assert set(_holds(log)) == {"svc"}
    assert _info(log).min_physical_offset == kept - kept % SEGMENT
    shown = subprocess.run([str(MQSTORE), "--address", f"127.0.0.1:{port}", "--user", OPERATOR, "retention-holds"],
                           env={**os.environ, **tls_env, "MQSTORE_SECRET": _secret(OPERATOR)}, capture_output=True,
                           text=True, timeout=CLI_TIMEOUT_S, check=True)  # what an operator sees
    assert shown.stdout.startswith(f"svc physical_offset={kept} closed at ") and "durable=true" in shown.stdout


def _modes_open_to_others(root: pathlib.Path, files: list[pathlib.Path]) -> dict[str, str]:
    """Each file readable or writable by group or others, with its mode. A file the running service
    renames away between the listing and its stat (a checkpoint's ``.tmp``) is skipped: it was made
    by the same code as the file it became, which is listed on the next walk."""
    opened = {}
    for path in files:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            opened[str(path.relative_to(root))] = oct(mode)
    return opened


def test_a_service_makes_its_files_its_users_only_and_warns_of_the_kek_beside_them(tmp_path):
    data = tmp_path / "new" / "data"  # made by the service
    with commitlog_process(data, "--auth", "--internal-token", TOKEN) as process:
        warning = process.wait_for("security.secret_in_data_dir")
        process.started()
        assert {s["kind"] for s in warning["secrets"]} == {"auth_kek"}
        assert warning["secrets"][0]["path"] == str((data / "auth.kek").resolve())
        with grpc.insecure_channel(process.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=1), metadata=SERVICE, timeout=T)
            stub.Append(cpb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"x")]),
                        metadata=SERVICE, timeout=T)
        named = [data, data / "commitlog", data / "metadata.db", data / "auth.db", data / "auth.db-wal",
                 next((data / "commitlog").iterdir())]
        assert all(path.exists() for path in named), [p for p in named if not p.exists()]
        opened = _modes_open_to_others(tmp_path, [data, *data.rglob("*")])
        assert opened == {}, "readable by others"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert process.stop() == 0


def test_secrets_are_found_in_the_data_dir_and_beside_the_auth_database(tmp_path):
    data, auth_dir, keys = tmp_path / "data", tmp_path / "auth", tmp_path / "keys"
    for directory in (data, auth_dir / "tls", keys):
        directory.mkdir(parents=True)
    (auth_dir / "internal-token").write_text("t")
    (auth_dir / "tls" / "ca.key").write_text("k")

    def server(kek: pathlib.Path) -> ServerConfig:
        return ServerConfig(auth=AuthConfig(enabled=True, url=Secret(f"sqlite:///{auth_dir / 'auth.db'}"),
                                            kek_file=str(kek)))
    assert secrets_in([data], server(keys / "auth.kek")) == []  # the kek outside: nothing to say
    assert [s["kind"] for s in secrets_in([data], server(data / "auth.kek"))] == ["auth_kek"]
    found = secrets_in([data, auth_dir], server(keys / "auth.kek"))
    assert sorted(s["kind"] for s in found) == ["internal_token", "tls_ca_key"]
