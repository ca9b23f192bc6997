"""The replication data port's settings (ReplicationConfig): a port, 0 (any free one) or -1 (none), and an
advertised host:port; anything else refused at start with a message naming the setting."""

from __future__ import annotations

import pytest

from mqstore.errors import InvalidArgument
from mqstore.replication.config import ReplicationConfig


@pytest.mark.parametrize("port", [-1, 0, 1, 10912, 65535])
def test_a_port_any_free_one_or_none_is_taken(port):
    assert ReplicationConfig(node_id="a", replication_data_port=port).replication_data_port == port


@pytest.mark.parametrize("port", [-2, 65536, 1 << 20])
def test_anything_else_is_refused_naming_the_setting(port):
    with pytest.raises(InvalidArgument, match="replication_data_port must be a port"):
        ReplicationConfig(node_id="a", replication_data_port=port)


@pytest.mark.parametrize("address", ["node-1", "node-1:", "node-1:http", ":", ":7001"])
def test_an_advertised_data_address_must_be_host_and_port(address):
    with pytest.raises(InvalidArgument, match="replication_data_address must be host:port"):
        ReplicationConfig(node_id="a", replication_data_address=address)


def test_an_advertised_data_address_of_host_and_port_is_taken():
    config = ReplicationConfig(node_id="a", replication_data_address="[::1]:7001")
    assert config.replication_data_address == "[::1]:7001"
