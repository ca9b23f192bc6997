"""mqstore_rpc.private_files: the data directory a service makes is 0700; one it finds open to others is
left as it is and said once; the permission table asks ADMIN of a Tail that names a retention hold."""

from __future__ import annotations

import stat

from structlog.testing import capture_logs

from mqstore.access import ADMIN, CLUSTER_RESOURCE, SUB, topic
from mqstore_rpc import private_files
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.permissions import PERMISSIONS


def test_a_missing_data_dir_is_made_0700_whatever_the_umask(tmp_path):
    data = tmp_path / "a" / "data"
    private_files.make_data_dir(data)  # this process's umask (022 under pytest) would give 0755
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700


def test_an_existing_open_data_dir_is_kept_and_said_once(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "metadata.db").write_bytes(b"")
    (data / "metadata.db").chmod(0o644)
    with capture_logs() as events:
        private_files.warn_open_data_dir(data)
        private_files.make_data_dir(data)
    assert [e["event"] for e in events] == ["security.data_dir_open"] and events[0]["mode"] == "0o755"
    assert stat.S_IMODE(data.stat().st_mode) == 0o755  # nothing rewritten
    assert stat.S_IMODE((data / "metadata.db").stat().st_mode) == 0o644
    data.chmod(0o700)
    with capture_logs() as events:
        private_files.warn_open_data_dir(data)
    assert events == []


def test_a_tail_naming_a_hold_needs_admin_on_the_cluster_too():
    need = PERMISSIONS["/mqstore.v1.CommitLog/Tail"]
    plain = need.checks(cpb.TailRequest(topics=["t"]))
    held = need.checks(cpb.TailRequest(topics=["t"], hold_retention_as="x"))
    assert plain == [((SUB,), topic("t"))]
    assert held == [((SUB,), topic("t")), ((ADMIN,), CLUSTER_RESOURCE)]
    assert need.checks(cpb.TailRequest(hold_retention_as="x")) == [((SUB,), CLUSTER_RESOURCE),
                                                                  ((ADMIN,), CLUSTER_RESOURCE)]
