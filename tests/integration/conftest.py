"""Fixtures shared by the integration tests: real servers on 127.0.0.1, port 0, real files in tmp_path."""

from __future__ import annotations

import pytest
from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from mqstore.config import StoreConfig
from mqstore_rpc.server import ServerConfig


@pytest.fixture
def commitlog_port(tmp_path):
    """A CommitLog server in this process with small sparse segments; yields its port."""
    config = CommitLogConfig(store=StoreConfig(data_dir=tmp_path / "log", segment_size_bytes=64 * 1024,
                                               preallocate_segments=False),
                             server=ServerConfig(port=0, grace_s=1.0))
    with commitlog_serving(config) as (_, port):
        yield port


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A throwaway CA with a server and a client certificate (mqstore_rpc.tls_certs, openssl)."""
    from mqstore_rpc.tls_certs import make_ca
    return make_ca(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def other_certs(tmp_path_factory):
    """A second, unrelated CA: what a client or server of another installation holds."""
    from mqstore_rpc.tls_certs import make_ca
    return make_ca(tmp_path_factory.mktemp("tls-other"))
