"""SDK signing secrets encrypted at rest under a key-encryption key (kek) that is not in the database.

Why not a hash, as for bearer secrets (mqstore.auth.secrets): the RocketMQ 5 SDKs sign each request with
HMAC-SHA1(secret key, x-mq-date-time) (mqstore.auth.signature), so the server must recompute that HMAC and
hold the secret itself, as RocketMQ does. Kept sealed: a stolen auth database alone yields nothing usable
(ciphertexts and tags under a key it does not hold); the database and the kek file together yield every
SDK secret key (not the users' bearer secrets, which stay scrypt hashes).

The construction (standard library only: HMAC-SHA256 as a PRF; encrypt-then-MAC):

  enc_key = HMAC-SHA256(kek, "mqstore sdk-key encryption")     mac_key = HMAC-SHA256(kek, "mqstore sdk-key mac")
  keystream block i = HMAC-SHA256(enc_key, nonce || i as uint32 big-endian), i = 0, 1, ...
  ciphertext = secret XOR keystream
  tag = HMAC-SHA256(mac_key, header || ciphertext || associated data)      (the access key is the
                                                                            associated data: a sealed
                                                                            secret moved to another row
                                                                            does not open)

Sealed layout (bytes; stored base64 in auth_sdk_keys.sealed_secret, mqstore.meta.auth):

  offset  size  field
  0       1     version (1)
  1       16    nonce (random)
  17      n     ciphertext (n = length of the UTF-8 secret, 8..256)
  17+n    32    tag

The kek file (``<data-dir>/auth.kek`` or MQSTORE_AUTH_KEK_FILE): exactly 32 random bytes, no header,
created 0600 on first use (the first ``mqstore user sdk-key create``) with the creation rule (fsync of
the file and its directory) and never replaced: two processes creating it at once both end up with the
one that was linked first. A temporary file that a crash left beside it is removed by the next process
that may create it. Every process that seals or opens (the CommitLog server's Access service,
the gateway) must be given the same file.

Thread-safe: :class:`Kek` loads the key once under a lock; sealing and opening are pure.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pathlib
import secrets as random
import struct
import threading

from mqstore import fs
from mqstore.errors import FailedPrecondition

VERSION = 1
NONCE_BYTES = 16
TAG_BYTES = 32
KEK_BYTES = 32
HEADER = struct.Struct(">B16s")    # version, nonce
_ENC_LABEL = b"mqstore sdk-key encryption"
_MAC_LABEL = b"mqstore sdk-key mac"


class SealError(FailedPrecondition):
    """A sealed secret that does not open: tampered with, cut, or sealed under another kek."""


def _subkeys(kek: bytes) -> tuple[bytes, bytes]:
    return (hmac.digest(kek, _ENC_LABEL, hashlib.sha256), hmac.digest(kek, _MAC_LABEL, hashlib.sha256))


def _keystream(enc_key: bytes, nonce: bytes, length: int) -> bytes:
    blocks = (hmac.digest(enc_key, nonce + i.to_bytes(4, "big"), hashlib.sha256) for i in range(-(-length // 32)))
    return b"".join(blocks)[:length]


def _xor(data: bytes, stream: bytes) -> bytes:
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


def seal(kek: bytes, secret: str, associated: str, *, nonce: bytes | None = None) -> bytes:
    """The sealed form of ``secret`` bound to ``associated`` (``nonce`` for golden tests only)."""
    enc_key, mac_key = _subkeys(kek)
    nonce = random.token_bytes(NONCE_BYTES) if nonce is None else nonce
    header = HEADER.pack(VERSION, nonce)
    plain = secret.encode("utf-8")
    ciphertext = _xor(plain, _keystream(enc_key, nonce, len(plain)))
    tag = hmac.digest(mac_key, header + ciphertext + associated.encode("utf-8"), hashlib.sha256)
    return header + ciphertext + tag


def open_sealed(kek: bytes, sealed: bytes, associated: str) -> str:
    """The secret; SealError when the tag does not match (checked in constant time, before decrypting)."""
    if len(sealed) < HEADER.size + TAG_BYTES:
        raise SealError(f"a sealed SDK secret is at least {HEADER.size + TAG_BYTES} bytes, this one {len(sealed)}")
    version, nonce = HEADER.unpack_from(sealed)
    if version != VERSION:
        raise SealError(f"sealed SDK secret of version {version}; this mqstore reads version {VERSION}")
    enc_key, mac_key = _subkeys(kek)
    body, tag = sealed[:-TAG_BYTES], sealed[-TAG_BYTES:]
    expected = hmac.digest(mac_key, body + associated.encode("utf-8"), hashlib.sha256)
    if not hmac.compare_digest(tag, expected):
        raise SealError("a sealed SDK secret does not open under this key-encryption key (another kek file, or "
                        "the stored value was altered)")
    ciphertext = body[HEADER.size:]
    return _xor(ciphertext, _keystream(enc_key, nonce, len(ciphertext))).decode("utf-8")


def to_text(sealed: bytes) -> str:
    return base64.b64encode(sealed).decode("ascii")


def from_text(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SealError("a stored sealed SDK secret is not base64") from None


class Kek:
    """The key-encryption key in its file, read once. ``create``: make the file on first use when it is
    missing (the Access service); without it a missing file is an error (the gateway only opens)."""

    def __init__(self, path: pathlib.Path, *, create: bool):
        self.path = path
        self._create = create
        self._lock = threading.Lock()
        self._key: bytes | None = None

    def key(self) -> bytes:
        key = self._key
        if key is not None:
            return key
        with self._lock:
            if self._key is None:
                self._key = self._load()
            return self._key

    def seal(self, secret: str, associated: str) -> str:
        return to_text(seal(self.key(), secret, associated))

    def open(self, text: str, associated: str) -> str:
        return open_sealed(self.key(), from_text(text), associated)

    def _load(self) -> bytes:
        if self._create:
            _remove_stale_temps(self.path)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            if not self._create:
                raise FailedPrecondition(f"the key-encryption key {self.path} does not exist: give this service the "
                                         f"same file as the CommitLog server (--auth-kek-file, "
                                         f"MQSTORE_AUTH_KEK_FILE)") from None
            data = _create(self.path)
        except OSError as exc:
            raise FailedPrecondition(f"cannot read the key-encryption key {self.path}: {exc.strerror}") from None
        if len(data) != KEK_BYTES:
            raise FailedPrecondition(f"the key-encryption key {self.path} holds {len(data)} bytes, not {KEK_BYTES}: "
                                     f"not a kek file mqstore made")
        return data


def _remove_stale_temps(path: pathlib.Path) -> None:
    """Delete the temporary files of :func:`_create` left by a process that died before unlinking its own
    (key material that nothing will ever use). A file whose process still runs is left to it; a reused pid
    only keeps a stray file a while longer."""
    for temp in path.parent.glob(f"{path.name}.*.*.tmp"):
        pid = temp.name[len(path.name) + 1:].split(".", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            temp.unlink()
        except FileNotFoundError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _create(path: pathlib.Path) -> bytes:
    """Write 32 random bytes to a temporary file (0600, fsynced), link it to ``path`` unless a file is
    there already (then that one wins), fsync the directory."""
    fs.make_dirs(path.parent)
    temp = path.with_name(f"{path.name}.{os.getpid()}.{random.token_hex(4)}.tmp")  # unique per process
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, random.token_bytes(KEK_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)
    except FileExistsError:
        pass  # another process made it first: use its key
    finally:
        os.unlink(temp)
    fs.fsync_dir(path.parent)
    return path.read_bytes()
