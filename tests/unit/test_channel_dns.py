"""Every channel a service opens to another looks its host name up again within DNS_REFRESH_MS of a failed
connection (mqstore_rpc.tls, module docstring): grpc's default waits 30 s between resolutions, and a container
started again at another address was unreachable through a channel that kept the old one for 13 s in
`make compose-check-chaos` (a replica's channel to the restarted node just elected leader)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from commitlog_service.replication import GrpcLeaderLink
from mqstore.errors import Unavailable
from mqstore.replication.epochs import EpochHistory
from mqstore.replication.messages import Hello
from mqstore_rpc import etcd_client, tls
from mqstore_rpc.peers import Peers

DNS = ("grpc.dns_min_time_between_resolutions_ms", tls.DNS_REFRESH_MS)


@pytest.fixture
def opened(monkeypatch) -> list[list]:
    """The options of every synchronous channel grpc is asked for from now on."""
    seen: list[list] = []
    real = grpc.insecure_channel

    def insecure_channel(target, options=None, *args, **kwargs):
        seen.append(list(options or ()))
        return real(target, options, *args, **kwargs)
    monkeypatch.setattr(grpc, "insecure_channel", insecure_channel)
    return seen


def test_open_channel_and_peer_channels_resolve_again_within_the_refresh(opened):
    tls.open_channel("127.0.0.1:1", None, [("grpc.max_receive_message_length", 1 << 20)]).close()
    Peers().channel("127.0.0.1:1").close()
    assert len(opened) == 2 and all(DNS in options for options in opened)
    assert ("grpc.max_receive_message_length", 1 << 20) in opened[0]  # the caller's options kept


def test_a_caller_may_set_its_own_refresh():
    assert tls.channel_options([("grpc.dns_min_time_between_resolutions_ms", 5)]) == \
        [("grpc.dns_min_time_between_resolutions_ms", 5)]


def test_the_etcd_members_and_the_replicas_link_resolve_again_within_the_refresh(opened):
    assert DNS in etcd_client._CHANNEL_OPTIONS
    link = GrpcLeaderLink(200)
    hello = Hello("r", "127.0.0.1:2", 0, 0, EpochHistory(()), 1 << 20)
    try:
        with pytest.raises(Unavailable):  # nothing listens on port 1: what counts is the channel it opened
            link.open("127.0.0.1:1", hello)
    finally:
        link.close()
    assert opened and DNS in opened[0]


def test_the_aio_peer_channel_resolves_again_within_the_refresh(monkeypatch):
    seen = []
    real = grpc.aio.insecure_channel

    def insecure_channel(target, options=None, *args, **kwargs):
        seen.append(list(options or ()))
        return real(target, options, *args, **kwargs)
    monkeypatch.setattr(grpc.aio, "insecure_channel", insecure_channel)

    async def open_and_close():
        await Peers().aio_channel("127.0.0.1:1").close()
    asyncio.run(open_and_close())
    assert seen and DNS in seen[0]
