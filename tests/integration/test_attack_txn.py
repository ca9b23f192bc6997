"""Issue 32's attacks on transactions (rows "EndTransaction checks the request's topic", "CheckBack streams
halves of any topic; Prepare never checks the group", "existence oracle"), each a test that the attack on
the code before the fix got through and now is refused; and the victim's own commit, rollback and
check-back still work.

The users are the issue's: ``pubonly`` PUB on topic ``pubt``; ``grp`` PUB on every group and on topic
``A``; the victim ``bob`` PUB and SUB on topic ``secret`` and group ``bobpg``. All services run in this
process with authentication on (test_auth_matrix's rig); the gateway's calls are made to both of its
deployments, its own server (Cluster mode) and the commit log's second port (Local mode), which share
the one Transaction service. The rig runs in plaintext and over TLS (every server, the services calling
each other over it too).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from typing import Iterator

import grpc
import pytest

from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d, service_pb2 as v2, service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb, commitlog_pb2_grpc, common_pb2, txn_pb2 as tpb
from mqstore_rpc.gen.mqstore.v1 import txn_pb2_grpc
from tests.integration.test_auth_matrix import _bearer, _secret_of, _services
from tests.support.transport import TRANSPORTS, Transport
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TIMEOUT_S = 10
MODES = ("cluster", "local")          # the gateway's deployments
PUBT, A, SECRET, BOBPG = "pubt", "A", "secret", "bobpg"
UNKNOWN_ID = "no-such-transaction-0"
# Short check-back delays: a check is due 1 s after its Prepare and asked again every second.
TXN_SETTINGS = dict(transaction_timeout_ms=1000, check_interval_ms=1000, check_max=1000)
_ids = itertools.count(1)


def _rules(admin: AccessAdmin) -> None:
    both = frozenset({access.PUB, access.SUB})
    for name, rules in (("pubonly", [(access.TOPIC, PUBT, {access.PUB})]),
                        ("grp", [(access.GROUP, "*", {access.PUB}), (access.TOPIC, A, {access.PUB})]),
                        ("bob", [(access.TOPIC, SECRET, both), (access.GROUP, BOBPG, both)])):
        admin.create_user(name, access.NORMAL, _secret_of(name))
        for kind, pattern, actions in rules:
            admin.add_rule(name, kind, pattern, frozenset(actions), access.ALLOW)


class Rig:
    def __init__(self, ports: dict[str, int], service_channel: grpc.Channel, channels: dict[str, grpc.Channel]):
        self.ports, self._channels = ports, channels
        self.admin_txn = txn_pb2_grpc.TransactionStub(service_channel)   # as `service`: ADMIN

    def txn(self) -> txn_pb2_grpc.TransactionStub:
        return txn_pb2_grpc.TransactionStub(self._channels["txn"])

    def gateway(self, mode: str) -> service_pb2_grpc.MessagingServiceStub:
        return service_pb2_grpc.MessagingServiceStub(self._channels[mode])

    def show(self, txn_id: str) -> tpb.TransactionInfo:
        return self.admin_txn.Show(tpb.ShowRequest(transaction_id=txn_id), timeout=TIMEOUT_S)

    def state(self, txn_id: str) -> str:
        return tpb.TransactionState.Name(self.show(txn_id).state)


@pytest.fixture(scope="module", params=TRANSPORTS)
def rig(request, tmp_path_factory, certs) -> Iterator[Rig]:
    with serving(tmp_path_factory.mktemp(f"attack-txn-{request.param}"), Transport(request.param, certs)) as r:
        yield r


@contextlib.contextmanager
def serving(tmp, transport: Transport) -> Iterator[Rig]:
    """The services over ``transport``, the users of _rules and the topics made; yields once the users are seen."""
    with _services(tmp, transport, **TXN_SETTINGS) as (url, servers, peers, kek_file, local_port), \
            contextlib.ExitStack() as stack:
        ports = {name: port for name, (_, port) in servers.items()} | {"gateway-local": local_port}
        service = stack.enter_context(peers.channel(f"127.0.0.1:{ports['commitlog']}"))
        log = commitlog_pb2_grpc.CommitLogStub(service)
        for topic in (PUBT, A, SECRET):
            log.CreateTopic(cpb.CreateTopicRequest(name=topic, queue_count=1), timeout=TIMEOUT_S)
        store = AuthStore(url, SystemClock())
        try:
            _rules(AccessAdmin(store, kek=Kek(kek_file, create=True)))
        finally:
            store.close()
        channels = {name: stack.enter_context(transport.channel(port))
                    for name, port in (("txn", ports["txn"]), ("cluster", ports["gateway"]),
                                       ("local", ports["gateway-local"]))}
        r = Rig(ports, stack.enter_context(peers.channel(f"127.0.0.1:{ports['txn']}")), channels)
        wait_until(lambda: not r.admin_txn.Stats(tpb.TxnStatsRequest(), timeout=TIMEOUT_S).recovering,
                   "the Transaction service to recover")
        wait_until(lambda: _sees_the_users(r), "the services to see the new users (auth_refresh_ms)")
        yield r


def _sees_the_users(r: Rig) -> bool:
    try:
        r.txn().Stats(tpb.TxnStatsRequest(), timeout=TIMEOUT_S, metadata=_as("bob"))
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.PERMISSION_DENIED:  # bob is known (and no admin)
            return False
    for mode in MODES:
        route = r.gateway(mode).QueryRoute(v2.QueryRouteRequest(topic=d.Resource(name=SECRET), endpoints=d.Endpoints(
            scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=1)])), timeout=TIMEOUT_S,
            metadata=_as("bob", "probe"))
        if route.status.code != d.OK:
            return False
    return True


def _as(user: str, client: str = "") -> tuple:
    """The call metadata of ``user`` (and, at the gateway, a client id of its own)."""
    return (*_bearer(user, _secret_of(user)), *((("x-mq-client-id", f"{user}-{client}"),) if client else ()))


def _msg(body: bytes, **properties: str) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=body, properties=properties)


def _prepare(r: Rig, user: str = "bob", topic: str = SECRET, group: str = BOBPG, **properties: str) -> str:
    return r.txn().Prepare(tpb.PrepareRequest(topic=topic, messages=[_msg(b"bob's payment", **properties)],
                                              producer_group=group), timeout=TIMEOUT_S,
                           metadata=_as(user)).transaction_id


def _code_and_message(call, request, metadata) -> tuple[grpc.StatusCode, str]:
    try:
        call(request, timeout=TIMEOUT_S, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def _frame(r: Rig, user: str, request: tpb.TransactRequest) -> tuple[grpc.StatusCode, str]:
    """A Transact frame's answer as (status, message): its ``error``, or OK."""
    answer = next(iter(r.txn().Transact(iter([request]), timeout=TIMEOUT_S, metadata=_as(user))))
    if answer.WhichOneof("kind") != "error":
        return grpc.StatusCode.OK, ""
    return next(c for c in grpc.StatusCode if c.value[0] == answer.error.code), answer.error.message


def _gateway_send(r: Rig, mode: str, user: str, topic: str) -> str:
    """A transactional message sent through the gateway: its transaction id."""
    message = d.Message(topic=d.Resource(name=topic), body=f"{user}'s payment".encode())
    message.system_properties.message_id = f"0{next(_ids):031X}"
    message.system_properties.message_type = d.TRANSACTION
    sent = r.gateway(mode).SendMessage(v2.SendMessageRequest(messages=[message]), timeout=TIMEOUT_S,
                                       metadata=_as(user, "producer"))
    assert sent.status.code == d.OK, sent.status
    return sent.entries[0].transaction_id


def _end(r: Rig, mode: str, user: str, topic: str, txn_id: str, resolution: int,
         source: int = d.SOURCE_CLIENT) -> d.Status:
    return r.gateway(mode).EndTransaction(v2.EndTransactionRequest(
        topic=d.Resource(name=topic), message_id="01", transaction_id=txn_id, resolution=resolution, source=source),
        timeout=TIMEOUT_S, metadata=_as(user, "producer")).status


def _same(one: tuple, other: tuple, one_id: str, other_id: str) -> bool:
    """Two answers alike, but for the id each names."""
    return one[0] == other[0] and one[1].replace(one_id, "<id>") == other[1].replace(other_id, "<id>")


# ---- row 1: EndTransaction acts on the transaction's own topic, never the one the request names ---------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attacker, own_topic, resolution", [("pubonly", PUBT, d.ROLLBACK), ("grp", A, d.COMMIT)])
def test_end_transaction_naming_a_topic_of_ones_own_does_not_end_anothers_transaction(rig, mode, attacker,
                                                                                       own_topic, resolution):
    victims = _gateway_send(rig, mode, "bob", SECRET)
    refused = _end(rig, mode, attacker, own_topic, victims, resolution)
    assert refused.code != d.OK and rig.state(victims) == "TRANSACTION_STATE_OPEN"
    # No oracle: the same answer as for an id that does not exist, naming neither the topic nor the group
    unknown = _end(rig, mode, attacker, own_topic, UNKNOWN_ID, resolution)
    assert _same((refused.code, refused.message), (unknown.code, unknown.message), victims, UNKNOWN_ID)
    assert refused.code == d.INVALID_TRANSACTION_ID and SECRET not in refused.message
    # The victim's own end works
    assert _end(rig, mode, "bob", SECRET, victims, d.COMMIT).code == d.OK
    assert rig.state(victims) == "TRANSACTION_STATE_COMMITTED"


class _Telemetry:
    """A producer's Telemetry stream at the gateway, its settings written first; the commands it gets."""

    def __init__(self, stub: service_pb2_grpc.MessagingServiceStub, user: str, topics: list[str]):
        self._outbox: queue.Queue = queue.Queue()
        self._outbox.put(v2.TelemetryCommand(settings=d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(
            topics=[d.Resource(name=t) for t in topics]))))
        self._call = stub.Telemetry(iter(self._outbox.get, None), metadata=_as(user, "telemetry"))
        self.commands: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for command in self._call:
                self.commands.put(command)
        except grpc.RpcError:
            pass

    def recover(self, txn_id: str) -> v2.RecoverOrphanedTransactionCommand:
        """Wait for the check-back of ``txn_id`` (other commands are skipped)."""
        def found():
            try:
                command = self.commands.get(timeout=0.1)
            except queue.Empty:
                return None
            recover = command.recover_orphaned_transaction_command
            return recover if command.HasField("recover_orphaned_transaction_command") and \
                recover.transaction_id == txn_id else None
        return wait_until(found, f"the check-back of {txn_id}", timeout_s=30)

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self._reader.join(TIMEOUT_S)


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_to_a_check_naming_another_topic_does_not_decide_it(rig, mode):
    """A check of the victim's transaction waits for its producer's answer at the gateway; an attacker's
    EndTransaction from a check, naming its own topic and the victim's id, does not answer it."""
    victims = _gateway_send(rig, mode, "bob", SECRET)
    telemetry = _Telemetry(rig.gateway(mode), "bob", [SECRET])
    try:
        command = telemetry.recover(victims)
        assert command.message.topic.name == SECRET
        refused = _end(rig, mode, "pubonly", PUBT, victims, d.COMMIT, d.SOURCE_SERVER_CHECK)
        assert refused.code == d.INVALID_TRANSACTION_ID and rig.state(victims) == "TRANSACTION_STATE_OPEN"
        # The victim's answer to the check decides it
        assert _end(rig, mode, "bob", SECRET, victims, d.ROLLBACK, d.SOURCE_SERVER_CHECK).code == d.OK
        wait_until(lambda: rig.state(victims) == "TRANSACTION_STATE_ROLLED_BACK", "the victim's rollback")
    finally:
        telemetry.close()


# ---- row 2: CheckBack streams only halves of topics its user may publish; Prepare checks the group -----

class _CheckStream:
    """A CheckBack stream of ``user`` for ``group``; the checks it receives, and a way to answer them."""

    def __init__(self, stub: txn_pb2_grpc.TransactionStub, user: str, group: str):
        self._outbox: queue.Queue = queue.Queue()
        self._outbox.put(tpb.CheckBackMessage(hello=tpb.CheckBackHello(producer_group=group)))
        self._call = stub.CheckBack(iter(self._outbox.get, None), metadata=_as(user))
        self.received: list[tpb.CheckRequest] = []
        self.ended: grpc.StatusCode | None = None
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for check in self._call:
                with self._lock:
                    self.received.append(check)
            self.ended = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.ended = exc.code()

    def check_of(self, txn_id: str) -> tpb.CheckRequest | None:
        with self._lock:
            return next((c for c in self.received if c.transaction_id == txn_id), None)

    def answer(self, check_id: int, decision: int) -> None:
        self._outbox.put(tpb.CheckBackMessage(answer=tpb.CheckAnswer(check_id=check_id, decision=decision)))

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self._reader.join(TIMEOUT_S)


def test_check_back_sends_a_stream_only_halves_of_topics_its_user_may_publish(rig):
    snoop = _CheckStream(rig.txn(), "grp", BOBPG)   # grp may PUB every group: its hello is allowed
    bobs = None
    try:
        victims = _prepare(rig)
        assert rig.show(victims).producer_group == BOBPG
        # Past the first-check delay (1 s) and several scans (every 50 ms), grp's the group's only stream:
        # no check was sent (before the fix, grp received it with the half's body)
        wait_until(lambda: rig.show(victims).age_ms > 1000 + 500, "the transaction to be due for some scans")
        assert rig.show(victims).checks_sent == 0 and snoop.received == [] and snoop.ended is None
        bobs = _CheckStream(rig.txn(), "bob", BOBPG)
        check = wait_until(lambda: bobs.check_of(victims), "the check on the victim's own stream")
        assert check.halves[0].body == b"bob's payment" and check.halves[0].properties["PGROUP"] == BOBPG
        # An answer on grp's stream naming the victim's check is refused: not a check sent on it
        snoop.answer(check.check_id, tpb.DECISION_COMMIT)
        wait_until(lambda: snoop.ended is not None, "grp's stream to end")
        assert snoop.ended == grpc.StatusCode.INVALID_ARGUMENT and rig.state(victims) == "TRANSACTION_STATE_OPEN"
        assert snoop.received == []
        # The victim's own answer decides it
        bobs.answer(check.check_id, tpb.DECISION_COMMIT)
        wait_until(lambda: rig.state(victims) == "TRANSACTION_STATE_COMMITTED", "the victim's commit")
    finally:
        snoop.close()
        if bobs is not None:
            bobs.close()


def test_prepare_needs_pub_on_the_producer_group_too(rig):
    """pubonly may PUB pubt but no group: its halves in bob's group would be asked of bob's stream."""
    request = tpb.PrepareRequest(topic=PUBT, messages=[_msg(b"x")], producer_group=BOBPG)
    code, message = _code_and_message(rig.txn().Prepare, request, _as("pubonly"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and BOBPG in message
    assert _frame(rig, "pubonly", tpb.TransactRequest(request_id=1, prepare=request))[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    # grp may PUB every group, and its own topic
    assert rig.show(_prepare(rig, "grp", A, BOBPG)).producer_group == BOBPG


# ---- row "existence oracle": a forbidden transaction answers as an unknown one ----------------------------

@pytest.mark.parametrize("attacker", ["pubonly", "grp"])
def test_ending_a_forbidden_transaction_answers_as_an_unknown_id(rig, attacker):
    victims = _prepare(rig)
    txn = rig.txn()
    calls = {
        "Commit": lambda i: _code_and_message(txn.Commit, tpb.EndRequest(transaction_id=i), _as(attacker)),
        "Rollback": lambda i: _code_and_message(txn.Rollback, tpb.EndRequest(transaction_id=i), _as(attacker)),
        "Transact commit": lambda i: _frame(rig, attacker, tpb.TransactRequest(
            request_id=1, commit=tpb.EndRequest(transaction_id=i))),
        "Transact rollback": lambda i: _frame(rig, attacker, tpb.TransactRequest(
            request_id=1, rollback=tpb.EndRequest(transaction_id=i))),
        "Show": lambda i: _code_and_message(txn.Show, tpb.ShowRequest(transaction_id=i), _as(attacker)),
    }
    for name, call in calls.items():
        forbidden, unknown = call(victims), call(UNKNOWN_ID)
        assert _same(forbidden, unknown, victims, UNKNOWN_ID), (name, forbidden, unknown)
        assert forbidden[0] != grpc.StatusCode.OK and SECRET not in forbidden[1] and BOBPG not in forbidden[1], name
        assert forbidden[0] == (grpc.StatusCode.PERMISSION_DENIED if name == "Show" else grpc.StatusCode.NOT_FOUND)
    assert rig.state(victims) == "TRANSACTION_STATE_OPEN"
    # A caller with the right gets NOT_FOUND for an unknown id, and ends its own
    assert _code_and_message(txn.Commit, tpb.EndRequest(transaction_id=UNKNOWN_ID), _as("bob"))[0] == \
        grpc.StatusCode.NOT_FOUND
    assert txn.Rollback(tpb.EndRequest(transaction_id=victims), timeout=TIMEOUT_S, metadata=_as("bob")).state == \
        tpb.TRANSACTION_STATE_ROLLED_BACK


def test_an_end_naming_another_topic_than_the_transactions_is_refused_as_unknown(rig):
    """EndRequest.topic / producer_group (the gateway's): the transaction must be of them."""
    victims = _prepare(rig)
    txn = rig.txn()
    for topic, group in ((PUBT, ""), ("", "other"), (PUBT, PUBT)):
        code, _ = _code_and_message(txn.Commit, tpb.EndRequest(transaction_id=victims, topic=topic,
                                                               producer_group=group), _as("bob"))
        assert code == grpc.StatusCode.NOT_FOUND, (topic, group)
    assert txn.Commit(tpb.EndRequest(transaction_id=victims, topic=SECRET, producer_group=BOBPG), timeout=TIMEOUT_S,
                      metadata=_as("bob")).state == tpb.TRANSACTION_STATE_COMMITTED
