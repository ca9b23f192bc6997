"""Attacks on the gateway's client sessions (issue 32: "Gateway client sessions are keyed by x-mq-client-id
and not bound to the user; a Telemetry stream whose first command carries no settings is not checked at
all" and "A user with no rights fills the gateway's client table"), with authentication on, in both
gateway modes (Cluster: its own server; Local: the commit log's second port), in plaintext and over TLS,
raw apache.rocketmq.v2 stubs with bearer credentials.

Users: ``victim`` (PUB and SUB on topic ``secret``, SUB on group ``vgroup``), ``pubonly`` (PUB on topic
``pubt``), ``noperm`` (no rule), ``flooder`` (PUB on ``pubt``), ``reader`` and ``other`` (SUB on ``pubt``
and on groups ``rgroup`` / ``ogroup``), ``streamer`` (PUB on ``pubt``), ``admin`` (ADMIN on the cluster).
Every test uses client ids of its own: the services are shared by the tests of a mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import uuid
from typing import Callable, Iterator

import grpc
import pytest

from commitlog_service.main import serving as commitlog_serving
from gateway_service.main import GatewayServiceConfig
from gateway_service.main import serving as gateway_serving
from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.clock import SystemClock
from mqstore.gateway.config import GatewayConfig
from mqstore.meta.auth import AuthStore
from mqstore_launcher.node import LocalMode
from gateway_service.composition import LocalGatewayConfig
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc
from tests.integration.test_auth_matrix import _auth, _bearer, _secret_of
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.txn_testing import TOKEN, txn_config
from tests.support.gateway import MODES, free_port
from tests.support.transport import TRANSPORTS, Transport
from tests.support.waiting import wait_until
from txn_service.main import serving as txn_serving

pytestmark = pytest.mark.integration
TIMEOUT_S = 10
CHECK_TIMEOUT_S = 60     # a check-back: the transaction's timeout (1 s), the check loop, the relay's stream
# Small quotas, so that a flood of a few hundred calls meets them; the client table holds more than one
# user's share and fewer than the flood.
GATEWAY = GatewayConfig(long_poll_min_ms=500, long_poll_max_ms=10_000, max_clients=200, max_clients_per_user=20,
                        max_streams_per_user=3, max_receives_per_user=2)
RULES: dict[str, list[tuple[str, str, frozenset[str]]]] = {
    "victim": [(access.TOPIC, "secret", frozenset({access.PUB, access.SUB})),
               (access.GROUP, "vgroup", frozenset({access.SUB}))],
    "pubonly": [(access.TOPIC, "pubt", frozenset({access.PUB}))],
    "noperm": [],
    "flooder": [(access.TOPIC, "pubt", frozenset({access.PUB}))],
    "reader": [(access.TOPIC, "pubt", frozenset({access.SUB})), (access.GROUP, "rgroup", frozenset({access.SUB}))],
    "other": [(access.TOPIC, "pubt", frozenset({access.SUB})), (access.GROUP, "ogroup", frozenset({access.SUB}))],
    "streamer": [(access.TOPIC, "pubt", frozenset({access.PUB}))],
    "admin": [(access.CLUSTER, "*", frozenset({access.ADMIN}))],
}


def _metadata(user: str, client_id: str) -> tuple:
    return (("x-mq-client-id", client_id), *_bearer(user, _secret_of(user)))


def _producer_settings(*topics: str) -> s.TelemetryCommand:
    return s.TelemetryCommand(settings=d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(
        topics=[d.Resource(name=t) for t in topics])))


def _no_settings() -> s.TelemetryCommand:
    return s.TelemetryCommand(thread_stack_trace=s.ThreadStackTrace(nonce="n", thread_stack_trace="main"))


@dataclasses.dataclass(frozen=True)
class End:
    code: grpc.StatusCode
    details: str


class Telemetry:
    """One raw Telemetry stream: commands written through a queue, answers read on a thread into another."""

    def __init__(self, stub, user: str, client_id: str, timeout_s: float = 120):
        self._requests: queue.Queue = queue.Queue()
        self.answers: queue.Queue = queue.Queue()
        self.seen: list = []
        self._call = stub.Telemetry(iter(self._requests.get, None), metadata=_metadata(user, client_id),
                                    timeout=timeout_s)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self.answers.put(answer)
            self.answers.put(End(grpc.StatusCode.OK, ""))
        except grpc.RpcError as exc:
            self.answers.put(End(exc.code(), exc.details() or ""))

    def send(self, command: s.TelemetryCommand) -> None:
        self._requests.put(command)

    def wait_for(self, wanted: Callable[[object], bool], timeout_s: float = TIMEOUT_S):
        """The first answer (or End) ``wanted`` accepts; every answer read is kept in ``seen``."""
        try:
            while True:
                answer = self.answers.get(timeout=timeout_s)
                self.seen.append(answer)
                if wanted(answer):
                    return answer
                assert not isinstance(answer, End), f"the stream ended: {answer}"
        except queue.Empty:
            raise AssertionError(f"nothing wanted within {timeout_s} s; seen {self.seen}") from None

    def end(self, timeout_s: float = TIMEOUT_S) -> End:
        return self.wait_for(lambda a: isinstance(a, End), timeout_s)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._reader.join(TIMEOUT_S)


@dataclasses.dataclass
class Rig:
    stub: service_pb2_grpc.MessagingServiceStub
    streams: list[Telemetry] = dataclasses.field(default_factory=list)

    def telemetry(self, user: str, client_id: str) -> Telemetry:
        stream = Telemetry(self.stub, user, client_id)
        self.streams.append(stream)
        return stream

    def producer(self, user: str, client_id: str, topic: str) -> Telemetry:
        """A producer's stream whose settings were answered."""
        stream = self.telemetry(user, client_id)
        stream.send(_producer_settings(topic))
        stream.wait_for(lambda a: isinstance(a, s.TelemetryCommand) and a.HasField("settings"))
        return stream

    def heartbeat(self, user: str, client_id: str, group: str = "") -> int:
        request = s.HeartbeatRequest(client_type=d.SIMPLE_CONSUMER if group else d.PRODUCER)
        if group:
            request.group.name = group
        return self.stub.Heartbeat(request, metadata=_metadata(user, client_id), timeout=TIMEOUT_S).status.code

    def send(self, user: str, client_id: str, topic: str, message_type=d.NORMAL) -> s.SendResultEntry:
        message = d.Message(topic=d.Resource(name=topic), body=b"body of " + topic.encode())
        message.system_properties.message_id = uuid.uuid4().hex
        message.system_properties.message_type = message_type
        response = self.stub.SendMessage(s.SendMessageRequest(messages=[message]),
                                         metadata=_metadata(user, client_id), timeout=TIMEOUT_S)
        return response.entries[0]

    def receive(self, user: str, client_id: str, group: str, poll_ms: int) -> list[s.ReceiveMessageResponse]:
        request = s.ReceiveMessageRequest(group=d.Resource(name=group), message_queue=d.MessageQueue(
            topic=d.Resource(name="pubt"), id=-1), filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
            batch_size=1)
        request.invisible_duration.FromMilliseconds(30_000)
        request.long_polling_timeout.FromMilliseconds(poll_ms)
        return list(self.stub.ReceiveMessage(request, metadata=_metadata(user, client_id),
                                             timeout=poll_ms / 1000 + TIMEOUT_S))

    def terminate(self, user: str, client_id: str) -> None:
        self.stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=_metadata(user, client_id),
                                          timeout=TIMEOUT_S)


@contextlib.contextmanager
def _services(tmp, mode: str, transport: Transport) -> Iterator[int]:
    """The commit log, the Transaction service (checks a transaction open for 1 s) and the gateway in
    ``mode``, authentication on, every server over ``transport``; yields the gateway's port."""
    url = f"sqlite:///{tmp / 'auth.db'}"
    server, peers = _auth(url, transport=transport)
    txn_port = free_port()
    local = LocalGatewayConfig(port=0, txn_address=f"127.0.0.1:{txn_port}", gateway=GATEWAY) \
        if mode == "local" else None
    log_config = dataclasses.replace(make_config(tmp / "log"), server=server, internal_token=TOKEN,
                                     hosted=(LocalMode(gateway=local),))
    with contextlib.ExitStack() as stack:
        log_server, log_port = stack.enter_context(commitlog_serving(log_config))
        txn = dataclasses.replace(txn_config(tmp / "txn", log_port, transaction_timeout_ms=1000,
                                             check_interval_ms=2000), server=dataclasses.replace(server, port=txn_port))
        stack.enter_context(txn_serving(txn))
        if mode == "cluster":
            _, port = stack.enter_context(gateway_serving(GatewayServiceConfig(
                gateway=GATEWAY, server=server, commitlog_address=f"127.0.0.1:{log_port}",
                txn_address=f"127.0.0.1:{txn_port}")))
        else:
            port = log_server.extra_ports["gateway"]
        with peers.channel(f"127.0.0.1:{log_port}") as channel:
            log_stub = commitlog_pb2_grpc.CommitLogStub(channel)
            for name in ("secret", "pubt"):
                log_stub.CreateTopic(cpb.CreateTopicRequest(name=name, queue_count=1), timeout=TIMEOUT_S)
        store = AuthStore(url, SystemClock())
        try:
            admin = AccessAdmin(store)
            for user, rules in RULES.items():
                admin.create_user(user, access.NORMAL, _secret_of(user))
                for kind, pattern, actions in rules:
                    admin.add_rule(user, kind, pattern, actions, access.ALLOW)
        finally:
            store.close()
        yield port


@pytest.fixture(scope="module", params=[(m, t) for t in TRANSPORTS for m in MODES], ids="-".join)
def rig(request, tmp_path_factory, certs) -> Iterator[Rig]:
    mode, transport = request.param[0], Transport(request.param[1], certs)
    with _services(tmp_path_factory.mktemp(f"sessions-{mode}-{transport.kind}"), mode, transport) as port, \
            transport.channel(port) as channel:
        rig = Rig(service_pb2_grpc.MessagingServiceStub(channel))

        def seen() -> bool:
            try:
                return rig.heartbeat("admin", "probe") == d.OK
            except grpc.RpcError:
                return False
        wait_until(seen, "the gateway to see the users (auth_refresh_ms)")
        try:
            yield rig
        finally:
            for stream in rig.streams:
                stream.close()


def _refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
    return caught.value


def test_a_telemetry_stream_with_another_users_client_id_is_refused_and_the_victims_stream_stays(rig):
    victim = rig.producer("victim", "producer-a1", "secret")
    sent = rig.send("victim", "producer-a1", "secret", d.TRANSACTION)  # left open: its producer is asked
    assert sent.status.code == d.OK, sent.status
    # The attack (no settings, so nothing was checked), and a user with rights of its own.
    for user, first in (("noperm", _no_settings()), ("pubonly", _producer_settings("pubt")),
                        ("pubonly", _no_settings())):
        attacker = rig.telemetry(user, "producer-a1")
        attacker.send(first)
        end = attacker.end()
        assert end.code == grpc.StatusCode.PERMISSION_DENIED, (user, end)
        assert "another user's session" in end.details and "victim" not in end.details and "secret" not in end.details
        assert not [a for a in attacker.seen if isinstance(a, s.TelemetryCommand)], "the attacker got commands"
    # The victim's stream was not closed: the check-back of its transaction comes on it.
    check = victim.wait_for(lambda a: isinstance(a, s.TelemetryCommand) and
                            a.HasField("recover_orphaned_transaction_command"), CHECK_TIMEOUT_S)
    assert check.recover_orphaned_transaction_command.transaction_id == sent.transaction_id
    assert rig.heartbeat("victim", "producer-a1") == d.OK


def test_another_user_cannot_end_a_session_and_an_admin_can(rig):
    victim = rig.producer("victim", "victim-ended", "secret")
    for user in ("noperm", "pubonly"):
        error = _refused(lambda user=user: rig.terminate(user, "victim-ended"))
        assert "another user's session" in error.details()
    _refused(lambda: rig.heartbeat("pubonly", "victim-ended"))  # nor keep it alive, nor use it
    # The session is as it was: its stream answers another settings write.
    victim.send(_producer_settings("secret"))
    victim.wait_for(lambda a: isinstance(a, s.TelemetryCommand) and a.HasField("settings"))
    rig.terminate("admin", "victim-ended")  # an ADMIN of the cluster may
    assert victim.end().code == grpc.StatusCode.OK


def test_a_telemetry_stream_without_settings_from_a_user_without_rules_is_refused(rig):
    stream = rig.telemetry("noperm", "noperm-own-client")
    stream.send(_no_settings())
    end = stream.end()
    assert end.code == grpc.StatusCode.PERMISSION_DENIED, end
    assert "must begin with the client's settings" in end.details
    # Its owner continues a session whose settings came: a stream opened with another command is taken.
    rig.producer("pubonly", "pubonly-reconnects", "pubt").close()
    again = rig.telemetry("pubonly", "pubonly-reconnects")
    again.send(_no_settings())
    again.send(_producer_settings("pubt"))
    again.wait_for(lambda a: isinstance(a, s.TelemetryCommand) and a.HasField("settings"))
    # A later settings command is checked too: one naming a topic the user may not publish ends the stream.
    again.send(_producer_settings("secret"))
    assert again.end().code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("flooder", ["noperm", "flooder"])
def test_a_flood_of_client_ids_meets_the_users_quota_and_others_are_served(rig, flooder):
    # More new client ids from one user than the whole client table holds (the 10,000 in 4 s,
    # scaled to this table): without the quota the table fills and every other user's new client is refused.
    flood = GATEWAY.max_clients + 50
    codes = [rig.heartbeat(flooder, f"{flooder}-{uuid.uuid4().hex}") for _ in range(flood)]
    assert codes.count(d.OK) <= GATEWAY.max_clients_per_user
    assert codes.count(d.TOO_MANY_REQUESTS) >= flood - GATEWAY.max_clients_per_user
    assert set(codes) == {d.OK, d.TOO_MANY_REQUESTS}
    # A legitimate user's new client is served, and so are its sends.
    client = f"legit-{flooder}-{uuid.uuid4().hex[:8]}"
    assert rig.heartbeat("pubonly", client) == d.OK
    assert rig.send("pubonly", client, "pubt").status.code == d.OK


def test_a_users_receives_in_flight_are_bounded_and_other_users_still_receive(rig):
    stop = threading.Event()
    held: list = []

    def hold(index: int) -> None:  # keeps a long poll of reader's in flight until the test ends
        while not stop.is_set():
            try:
                held.append(rig.receive("reader", f"reader-{index}", "rgroup", poll_ms=5_000))
            except grpc.RpcError:
                return
    holders = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(GATEWAY.max_receives_per_user)]
    for thread in holders:
        thread.start()
    try:
        def refused() -> bool:
            first = rig.receive("reader", "reader-probe", "rgroup", poll_ms=500)[0]
            return first.status.code == d.TOO_MANY_REQUESTS
        wait_until(refused, "a receive beyond the reader's quota to be refused")
        # another user's receive is served as usual (a message of pubt's, or none within the poll)
        assert rig.receive("other", "other-receiver", "ogroup", poll_ms=500)[0].status.code in (
            d.OK, d.MESSAGE_NOT_FOUND)
    finally:
        stop.set()
        for thread in holders:
            thread.join(TIMEOUT_S + 10)


def test_a_users_telemetry_streams_are_bounded_and_other_users_still_open_theirs(rig):
    for i in range(GATEWAY.max_streams_per_user):
        rig.producer("streamer", f"streamer-{i}", "pubt")
    extra = rig.telemetry("streamer", "streamer-extra")
    extra.send(_producer_settings("pubt"))
    refusal = extra.wait_for(lambda a: isinstance(a, s.TelemetryCommand))
    assert refusal.status.code == d.TOO_MANY_REQUESTS and "max_streams_per_user" in refusal.status.message
    rig.producer("pubonly", "pubonly-streams-too", "pubt")
    # Re-opening the stream of a session that has one does not count twice.
    rig.producer("streamer", "streamer-0", "pubt")
