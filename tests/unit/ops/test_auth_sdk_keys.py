"""The RocketMQ SDKs' signed requests (mqstore.auth.signature), SDK secret keys sealed at rest
(mqstore.auth.sealing) and the Authority's signed path (mqstore.auth.authority)."""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import stat
import subprocess
import sys
import threading
import time

import pytest

from mqstore import access
from mqstore.auth import sealing, signature
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.authority import Authority
from mqstore.access import ALLOW, PUB, SUB, topic
from mqstore.auth.sealing import Kek, SealError
from mqstore.clock import FakeClock, SystemClock
from mqstore.errors import FailedPrecondition, NotFound, PermissionDenied, Unauthenticated
from mqstore.meta.auth import AuthStore
from mqstore.metrics import Registry
from tests.conftest import golden_bytes

# 2023-10-13 06:30:59 UTC, as the SDKs format it (yyyyMMdd'T'HHmmss'Z').
DATE = "20231013T063059Z"
DATE_MS = 1_697_178_659_000
# HMAC-SHA1(key "my-secret-key", "20231013T063059Z"), computed once with `openssl dgst -sha1 -hmac` and kept
# here: the golden vector of the SDKs' documented signature.
GOLDEN_SIGNATURE = "e74742afbd98352b3af6f857535b082e10f594fc"


def header(access_key: str, hex_signature: str) -> str:
    return f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={hex_signature}"


# ---- signature ---------------------------------------------------------------------------------------

def test_the_signature_is_hmac_sha1_of_the_date_time_in_hex():
    expected = hmac.new(b"my-secret-key", DATE.encode(), hashlib.sha1).hexdigest()
    assert signature.sign("my-secret-key", DATE).hex() == expected == GOLDEN_SIGNATURE
    signed = signature.parse(header("MQABCDEF12", expected), DATE)
    assert signed == signature.Signed("MQABCDEF12", DATE, bytes.fromhex(expected))
    assert signature.verify(b"my-secret-key", signed)
    assert signature.verify(b"my-secret-key", signature.parse(header("MQABCDEF12", expected.upper()), DATE))  # Node
    assert not signature.verify(b"my-secret-kez", signed)
    other_date = signature.parse(header("MQABCDEF12", expected), "20231013T063100Z")
    assert not signature.verify(b"my-secret-key", other_date)                  # the date is what is signed
    assert signature.parse(header("MQABCDEF12/20231013/x", expected), DATE).access_key == "MQABCDEF12"


@pytest.mark.parametrize("value, date, message", [
    ("Bearer a:b", DATE, "is not 'MQv2-HMAC-SHA1"),
    ("MQv2-HMAC-SHA1 Credential=MQABCDEF12, Signature=" + "0" * 40, DATE, "is not 'MQv2-HMAC-SHA1"),
    ("MQv2-HMAC-SHA1 Credential=MQABCDEF12, SignedHeaders=host, Signature=" + "0" * 40, DATE, "SignedHeaders"),
    (header("MQABCDEF12", "zz" * 20), DATE, "40 hexadecimal"),
    (header("MQABCDEF12", "00" * 19), DATE, "40 hexadecimal"),
    (header("", "00" * 20), DATE, "signed without an access key.*mqstore user sdk-key create"),
    (header("MQABCDEF12", "00" * 20), None, "needs the x-mq-date-time"),
    (header("MQABCDEF12", "00" * 20) + ", Credential=x", DATE, "is not 'MQv2-HMAC-SHA1"),
])
def test_malformed_signed_requests_are_refused_saying_what_to_send(value, date, message):
    with pytest.raises(Unauthenticated, match=message):
        signature.parse(value, date)


def test_the_date_must_be_within_the_skew_window():
    signed = signature.parse(header("MQABCDEF12", "00" * 20), DATE)
    assert signature.date_ms(DATE) == DATE_MS
    signature.check_fresh(signed, DATE_MS + signature.MAX_SKEW_MS)
    signature.check_fresh(signed, DATE_MS - signature.MAX_SKEW_MS)
    with pytest.raises(Unauthenticated, match="901 s behind the server.s clock; at most 900 s"):
        signature.check_fresh(signed, DATE_MS + signature.MAX_SKEW_MS + 1000)
    with pytest.raises(Unauthenticated, match="ahead of"):
        signature.check_fresh(signed, DATE_MS - signature.MAX_SKEW_MS - 1000)
    for bad in ("2023-10-13T06:30:59Z", "20231013T063059", "20231313T063059Z", "20231013T253059Z"):
        with pytest.raises(Unauthenticated, match="x-mq-date-time"):
            signature.date_ms(bad)


# ---- sealing -----------------------------------------------------------------------------------------

KEK = bytes(range(32))
NONCE = bytes(range(100, 116))


def test_sealed_layout_golden(request):
    sealed = sealing.seal(KEK, "secret-key-0123456789", "MQABCDEF12", nonce=NONCE)
    assert sealed == golden_bytes("sdk_key_sealed.bin", sealed, request)
    assert len(sealed) == 1 + 16 + len("secret-key-0123456789") + 32
    assert sealed[0] == sealing.VERSION and sealed[1:17] == NONCE
    assert b"secret-key" not in sealed
    # The layout of the module docstring, recomputed here from its definition.
    enc = hmac.digest(KEK, b"mqstore sdk-key encryption", hashlib.sha256)
    mac = hmac.digest(KEK, b"mqstore sdk-key mac", hashlib.sha256)
    stream = hmac.digest(enc, NONCE + b"\0\0\0\0", hashlib.sha256)
    assert bytes(a ^ b for a, b in zip(sealed[17:-32], stream[:21], strict=True)) == b"secret-key-0123456789"
    assert sealed[-32:] == hmac.digest(mac, sealed[:-32] + b"MQABCDEF12", hashlib.sha256)


def test_seal_round_trips_and_refuses_tampering_another_kek_and_another_row():
    for secret in ("12345678", "x" * 256, "sécrèt-ключ-0123"):
        sealed = sealing.seal(KEK, secret, "MQABCDEF12")
        assert sealing.open_sealed(KEK, sealed, "MQABCDEF12") == secret
        assert sealing.seal(KEK, secret, "MQABCDEF12") != sealed              # a fresh nonce each time
    sealed = sealing.seal(KEK, "secret-key-0123456789", "MQABCDEF12")
    for i in range(len(sealed)):
        tampered = bytearray(sealed)
        tampered[i] ^= 0x01
        with pytest.raises(SealError):
            sealing.open_sealed(KEK, bytes(tampered), "MQABCDEF12")
    with pytest.raises(SealError, match="does not open under this key-encryption key"):
        sealing.open_sealed(bytes(32), sealed, "MQABCDEF12")
    with pytest.raises(SealError):
        sealing.open_sealed(KEK, sealed, "MQOTHERKEY1")                       # moved to another access key
    with pytest.raises(SealError, match="at least 49 bytes"):
        sealing.open_sealed(KEK, sealed[:40], "MQABCDEF12")


def test_sealing_matches_a_plain_model_on_random_secrets_keys_and_tampering():
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    alphabet = "abcXYZ019-_éß"
    for _ in range(200):
        kek = rnd.randbytes(32)
        secret = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(8, 256)))
        access_key = "MQ" + "".join(rnd.choice("0123456789ABCDEF") for _ in range(rnd.randint(6, 30)))
        sealed = sealing.seal(kek, secret, access_key)
        assert len(sealed) == sealing.HEADER.size + len(secret.encode()) + sealing.TAG_BYTES   # the model: no padding
        assert sealing.open_sealed(kek, sealed, access_key) == secret                         # ...and a round trip
        damaged = bytearray(sealed)
        damaged[rnd.randrange(len(damaged))] ^= 1 << rnd.randrange(8)
        with pytest.raises(SealError):                                                         # any bit flipped
            sealing.open_sealed(kek, bytes(damaged), access_key)
        with pytest.raises(SealError):                                                         # cut anywhere
            sealing.open_sealed(kek, sealed[:rnd.randrange(len(sealed))], access_key)


def test_a_dead_process_temporary_kek_file_is_removed_and_a_live_one_kept(tmp_path):
    """A crash between writing the temporary file and unlinking it leaves 32 bytes of key material
    beside the kek; the next process that may create the kek removes it, unless its maker still runs."""
    path = tmp_path / "auth.kek"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stray = tmp_path / f"auth.kek.{dead.pid}.0a1b2c3d.tmp"
    live = tmp_path / f"auth.kek.{os.getpid()}.0a1b2c3d.tmp"
    other = tmp_path / "auth.kek.backup.1.tmp"  # not one of ours
    for file in (stray, live, other):
        file.write_bytes(os.urandom(32))
    with pytest.raises(FailedPrecondition):
        Kek(path, create=False).key()
    assert stray.exists()                      # an opener (the gateway) never deletes anything
    assert len(Kek(path, create=True).key()) == 32
    assert not stray.exists() and live.exists() and other.exists()


def test_the_kek_file_is_made_0600_once_and_shared(tmp_path):
    path = tmp_path / "keys" / "auth.kek"
    with pytest.raises(FailedPrecondition, match="does not exist"):
        Kek(path, create=False).key()                                         # the gateway never makes it
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(Kek(path, create=True).key())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results[0]) == 32                   # one key, whoever made it
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["auth.kek"]      # no temporary file left
    text = Kek(path, create=True).seal("secret-key-1", "MQABCDEF12")
    assert Kek(path, create=False).open(text, "MQABCDEF12") == "secret-key-1"
    path.write_bytes(b"short")
    with pytest.raises(FailedPrecondition, match="holds 5 bytes"):
        Kek(path, create=False).key()


# ---- the Authority's signed path ---------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    s = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    yield s
    s.close()


def signed_now(clock: FakeClock, access_key: str, secret_key: str) -> signature.Signed:
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock.now_ms() // 1000))
    return signature.parse(header(access_key, signature.sign(secret_key, date).hex()), date)


def test_signed_requests_map_to_the_keys_user_and_are_cached(store, tmp_path, monkeypatch):
    clock, registry = FakeClock(DATE_MS), Registry()
    kek = Kek(tmp_path / "auth.kek", create=True)
    authority = Authority(store, metrics=registry, kek=Kek(tmp_path / "auth.kek", create=False), clock=clock)
    admin = AccessAdmin(store, authority.invalidate, kek)
    admin.create_user("alice", access.NORMAL, "alice-secret-1")
    admin.add_rule("alice", access.TOPIC, "orders-*", frozenset({PUB}), ALLOW)
    created = admin.create_sdk_key("alice")
    ak, sk = created.key.access_key, created.secret_key
    assert access.is_access_key(ak) and sk not in store.sdk_key(ak).sealed_secret
    assert [k.access_key for k in admin.sdk_keys("alice")] == [ak]
    alice = authority.authenticate_signed(signed_now(clock, ak, sk))
    assert alice.name == "alice"
    authority.authorize(alice, PUB, topic("orders-1"))
    with pytest.raises(PermissionDenied, match="lacks SUB"):
        authority.authorize(alice, SUB, topic("orders-1"))
    reads = []
    monkeypatch.setattr(store, "sdk_key", lambda key: reads.append(key))
    for _ in range(20):                                                       # the date changes, the cache holds
        clock.advance(1000)
        assert authority.authenticate_signed(signed_now(clock, ak, sk)) is alice
    assert reads == []
    with pytest.raises(Unauthenticated, match="not accepted") as refused:
        authority.authenticate_signed(signed_now(clock, ak, "wrong-secret-key"))
    assert sk not in str(refused.value)
    stale = signed_now(clock, ak, sk)
    clock.advance(signature.MAX_SKEW_MS + 1000)
    with pytest.raises(Unauthenticated, match="behind the server's clock"):   # an old signature replayed
        authority.authenticate_signed(stale)


def test_unknown_revoked_and_deleted_keys_are_refused(store, tmp_path):
    clock = FakeClock(DATE_MS)
    kek = Kek(tmp_path / "auth.kek", create=True)
    authority = Authority(store, kek=kek, clock=clock)
    admin = AccessAdmin(store, authority.invalidate, kek)
    admin.create_user("bob", access.NORMAL, "bob-secret-1")
    first, second = admin.create_sdk_key("bob"), admin.create_sdk_key("bob")
    for created in (first, second):
        authority.authenticate_signed(signed_now(clock, created.key.access_key, created.secret_key))
    with pytest.raises(Unauthenticated, match="unknown or revoked access key"):
        authority.authenticate_signed(signed_now(clock, "MQ0000000000", "whatever-secret"))
    admin.revoke_sdk_key(first.key.access_key)
    with pytest.raises(Unauthenticated):
        authority.authenticate_signed(signed_now(clock, first.key.access_key, first.secret_key))
    assert authority.authenticate_signed(signed_now(clock, second.key.access_key, second.secret_key)).name == "bob"
    with pytest.raises(NotFound, match="no SDK key"):
        admin.revoke_sdk_key(first.key.access_key)
    admin.delete_user("bob")                                                  # its keys go with it
    assert store.sdk_keys() == []
    with pytest.raises(Unauthenticated):
        authority.authenticate_signed(signed_now(clock, second.key.access_key, second.secret_key))
    with pytest.raises(NotFound):
        admin.create_sdk_key("bob")


def test_a_key_under_another_kek_or_none_is_refused_and_logged(store, tmp_path):
    clock = FakeClock(DATE_MS)
    admin = AccessAdmin(store, kek=Kek(tmp_path / "auth.kek", create=True))
    admin.create_user("carol", access.NORMAL, "carol-secret-1")
    created = admin.create_sdk_key("carol")
    signed = signed_now(clock, created.key.access_key, created.secret_key)
    other = Kek(tmp_path / "other.kek", create=True)
    with pytest.raises(Unauthenticated, match="cannot be checked by this server"):
        Authority(store, kek=other, clock=clock).authenticate_signed(signed)
    with pytest.raises(Unauthenticated, match="no key-encryption key"):
        Authority(store, clock=clock).authenticate_signed(signed)
    with pytest.raises(FailedPrecondition, match="no key-encryption key"):
        AccessAdmin(store).create_sdk_key("carol")


def _user_signing_now(store, tmp_path, user: str):
    """A user with an SDK key, and a request signed with it now: (clock, authority, admin, the request, its
    authorization value)."""
    clock = FakeClock(DATE_MS)
    kek = Kek(tmp_path / "auth.kek", create=True)
    authority = Authority(store, kek=kek, clock=clock)
    admin = AccessAdmin(store, authority.invalidate, kek)
    admin.create_user(user, access.NORMAL, f"{user}-secret-1")
    created = admin.create_sdk_key(user)
    signed = signed_now(clock, created.key.access_key, created.secret_key)
    return clock, authority, admin, signed, header(created.key.access_key, signed.signature.hex())


def test_the_same_signature_within_its_second_costs_no_hmac_until_a_change_or_its_window_ends(store, tmp_path,
                                                                                             monkeypatch):
    clock, authority, admin, signed, value = _user_signing_now(store, tmp_path, "dave")
    assert authority.cached_signed(value, signed.date_time) is None
    dave = authority.authenticate_signed(signed, value)
    hmacs = []
    monkeypatch.setattr(signature, "verify", lambda *a: hmacs.append(a) or True)
    assert authority.cached_signed(value, signed.date_time) is dave
    assert authority.cached_signed(value, "20231013T063058Z") is None         # the date is part of the key
    assert hmacs == []
    clock.advance(signature.MAX_SKEW_MS + 1000)
    assert authority.cached_signed(value, signed.date_time) is None           # out of its window: checked again
    clock.advance(-signature.MAX_SKEW_MS - 1000)
    admin.revoke_sdk_key(signed.access_key)                                    # a change drops it at once
    assert authority.cached_signed(value, signed.date_time) is None


def test_a_key_revoked_or_a_user_deleted_by_another_process_is_refused_after_refresh(store, tmp_path):
    clock = FakeClock(DATE_MS)
    kek = Kek(tmp_path / "auth.kek", create=True)
    authority = Authority(store, kek=kek, clock=clock)
    elsewhere = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    try:
        other = AccessAdmin(elsewhere, kek=kek)   # another server: this authority's caches are not dropped
        other.create_user("erin", access.NORMAL, "erin-secret-1")
        first, second = other.create_sdk_key("erin"), other.create_sdk_key("erin")
        for created in (first, second):
            authority.authenticate_signed(signed_now(clock, created.key.access_key, created.secret_key))
        other.revoke_sdk_key(first.key.access_key)
        assert authority.refresh()
        with pytest.raises(Unauthenticated):
            authority.authenticate_signed(signed_now(clock, first.key.access_key, first.secret_key))
        other.delete_user("erin")
        assert authority.refresh()
        with pytest.raises(Unauthenticated):
            authority.authenticate_signed(signed_now(clock, second.key.access_key, second.secret_key))
    finally:
        elsewhere.close()


def test_a_signed_request_verified_for_the_gateway_is_not_taken_from_the_cache_by_another_port(store, tmp_path):
    """The commit log's process serves the gateway (signed requests) and its other ports with one authority:
    what a grpc.aio port finds cached on its loop must be what that port would accept."""
    from mqstore_rpc.auth import METADATA_KEY, AuthInterceptor

    _, authority, _, signed, value = _user_signing_now(store, tmp_path, "erin")
    metadata = ((METADATA_KEY, value), (signature.DATE_HEADER, signed.date_time))
    port = AuthInterceptor(authority, Registry())
    gateway = port.taking_signed_requests()
    assert gateway._cached(metadata) is None
    erin = authority.authenticate_signed(signed, value)  # the gateway's first call
    assert gateway._cached(metadata) is erin
    assert port._cached(metadata) is None  # refused as the synchronous path refuses it (UNAUTHENTICATED)
