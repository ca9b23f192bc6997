"""Secrets hashed at rest: scrypt (hashlib) with a random salt per user.

Stored form (one string, in the users table): ``scrypt$<n>$<r>$<p>$<salt, base64>$<hash, base64>``
with n = 2^14, r = 8, p = 1 and a 32-byte hash (about 16 MiB of memory and tens of milliseconds per
hash: slow on purpose, so a stolen table is slow to attack). That cost is paid once per user and
secret, not per call: mqstore.auth.authority caches a successful check.

A secret is 8 to 256 characters; ``generate()`` makes one of 32 URL-safe characters (192 bits).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as random

from mqstore.errors import InvalidArgument

SCHEME = "scrypt"
N, R, P, DKLEN = 1 << 14, 8, 1, 32
SALT_BYTES = 16
MIN_SECRET_CHARS, MAX_SECRET_CHARS = 8, 256


def check_secret(secret: str) -> str:
    if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
        raise InvalidArgument(f"secret: {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters "
                              f"(leave it out to have one generated)")
    if any(c in secret for c in "\r\n"):
        raise InvalidArgument("secret: no line breaks")
    return secret


def generate() -> str:
    return random.token_urlsafe(24)


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    return hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=dklen, maxmem=64 << 20)


def hash_secret(secret: str) -> str:
    check_secret(secret)
    salt = random.token_bytes(SALT_BYTES)
    digest = _scrypt(secret, salt, N, R, P, DKLEN)
    encoded = (base64.b64encode(salt).decode(), base64.b64encode(digest).decode())
    return "$".join((SCHEME, str(N), str(R), str(P), *encoded))


def verify_secret(secret: str, stored: str) -> bool:
    """True when ``secret`` hashes to ``stored`` (compared in constant time). A stored value this code
    cannot read verifies nothing."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        return False
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = base64.b64decode(parts[4]), base64.b64decode(parts[5])
    except ValueError:
        return False
    if len(secret) > MAX_SECRET_CHARS:
        return False
    return hmac.compare_digest(_scrypt(secret, salt, n, r, p, len(expected)), expected)


def fingerprint(secret: str) -> bytes:
    """A fast one-way digest of a presented secret: the key of the verification cache (the secret
    itself is never kept)."""
    return hashlib.sha256(secret.encode("utf-8")).digest()
