"""The commit log's etcd client against a real three-member cluster on 127.0.0.1 (issue 34, item 2): a call
its member does not answer (killed, paused: cut off, or stopping) is made on another member within one
attempt's deadline, and the client stays there; no member answering is Unavailable naming each one."""

from __future__ import annotations

import time

import pytest

from mqstore_rpc.etcd_client import EtcdCoordination, attempt_timeout_s, parse_endpoints
from mqstore.errors import Unavailable
from mqstore_launcher.child import free_port
from tests.support.ha import etcd_cluster_or_skip

pytestmark = [pytest.mark.integration]

ATTEMPT_S = 0.3


def test_endpoints_and_the_attempt_budget():
    assert parse_endpoints(" a:1, b:2,,a:1 ,c:3") == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError, match="at least one host:port"):
        parse_endpoints(" , ")
    # a 2 s lease leaves 1 s after a renewal; one interval (0.2 s) gone, three members share the rest
    assert attempt_timeout_s(2, 200, 3) == pytest.approx(0.8 / 3)
    assert attempt_timeout_s(5, 200, 3) == 1.0   # at most 1 s
    assert attempt_timeout_s(2, 900, 3) == 0.2   # at least 0.2 s
    assert attempt_timeout_s(2, 200, 1) == pytest.approx(0.8)


@pytest.fixture
def cluster():
    etcd = etcd_cluster_or_skip(3)
    try:
        yield etcd
    finally:
        etcd.stop()


def test_a_call_moves_to_another_member_when_its_member_is_killed_or_cut_off(cluster):
    client = EtcdCoordination(cluster.endpoints, rpc_timeout_s=5, attempt_timeout_s=ATTEMPT_S)
    endpoints = [m.endpoint for m in cluster.members]
    try:
        lease = client.grant_lease(5)
        revision = client.commit({"k": 0}, {"k": (b"v1", lease)})
        assert revision > 0 and client.get("k").value == b"v1" and client.current == endpoints[0]
        cluster.kill9(0)  # refused at once: the same call goes to another member (one that has a leader)
        assert client.keep_alive(lease) == 5
        assert client.current != endpoints[0]
        cluster.restart(0)
        cut = endpoints.index(client.current)
        cluster.pause(cut)  # cut off: answers nothing; the call goes elsewhere after one attempt's deadline
        try:
            started = time.monotonic()
            assert client.get("k").value == b"v1"
            took = time.monotonic() - started
            assert client.current != endpoints[cut]
            assert took < 2.5, took  # one attempt (0.3 s), perhaps an etcd election, and a read
            assert client.commit({"k": revision}, {"k": (b"v2", lease)}) > revision
        finally:
            cluster.resume(cut)
        assert client.get("k").value == b"v2"
        stopping = endpoints.index(client.current)
        process = cluster.members[stopping].process
        process.terminate()  # a member stopping (SIGTERM): not an expired lease
        # while it stops it may still answer (etcd hands its leadership over first); the call succeeds either way
        assert client.keep_alive(lease) == 5
        process.wait(timeout=30)
        assert client.keep_alive(lease) == 5  # once it is gone, the call is made on another member
        assert client.current != endpoints[stopping]
    finally:
        client.close()


def test_no_member_answering_is_unavailable_naming_each():
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    client = EtcdCoordination(",".join(dead), rpc_timeout_s=1, attempt_timeout_s=0.2)
    try:
        with pytest.raises(Unavailable, match="no etcd member answered Range k within 1 s") as raised:
            client.get("k")
        assert all(address in str(raised.value) for address in dead)
    finally:
        client.close()
