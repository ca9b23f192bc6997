"""RocketMQ 5's signed requests (what the official SDKs send when given an AccessKey/SecretKey).

Every call of an SDK with credentials carries two metadata entries:

  x-mq-date-time: 20231013T063059Z                     (yyyyMMdd'T'HHmmss'Z', the client's clock)
  authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is HMAC-SHA1(secret key as UTF-8, the date-time string as UTF-8) in hexadecimal (the
Python SDK 5.1.2 writes lower case, the Node SDK 1.0.8 upper case: both are read). ``Credential`` may carry
more after a ``/`` (RocketMQ's server keeps the part before it; so do we).

What a signature proves: the caller holds the secret key and signed this date-time. The date-time is
the only signed input, so a captured header can be replayed while its date is inside the skew window
(:data:`MAX_SKEW_MS`, 15 minutes either way of the server's clock); TLS keeps headers from being
captured. (The Python SDK formats its local time with a ``Z``: a client in another time zone than UTC is
outside the window and refused, saying so.)

Pure functions, no state: thread-safe.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
from dataclasses import dataclass

from mqstore.errors import Unauthenticated

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
MAX_SKEW_MS = 15 * 60 * 1000
_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$")
_HEX = re.compile(r"^[0-9a-fA-F]{40}$")
_FORMAT = f"'{ALGORITHM} Credential=<access key>, SignedHeaders={DATE_HEADER}, Signature=<hex HMAC-SHA1>'"


@dataclass(frozen=True, slots=True)
class Signed:
    """A parsed signed request: who claims to sign, what was signed, and the signature (20 bytes)."""

    access_key: str
    date_time: str
    signature: bytes


def is_signed(authorization: str) -> bool:
    return authorization.startswith(ALGORITHM + " ")


def parse(authorization: str, date_time: str | None) -> Signed:
    """The request's claim; Unauthenticated when malformed (no header value is quoted: the message says
    what the form is)."""
    if not is_signed(authorization):
        raise Unauthenticated(f"the authorization metadata is not {_FORMAT}")
    fields: dict[str, str] = {}
    for part in authorization[len(ALGORITHM) + 1:].split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name in fields:
            raise Unauthenticated(f"the authorization metadata is not {_FORMAT}")
        fields[name] = value.strip()
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise Unauthenticated(f"the authorization metadata is not {_FORMAT}")
    if fields["SignedHeaders"].lower() != DATE_HEADER:
        raise Unauthenticated(f"SignedHeaders must be {DATE_HEADER}: the only header this server checks")
    access_key = fields["Credential"].split("/", 1)[0]
    if not access_key:
        raise Unauthenticated("the request is signed without an access key (Credential=): give the SDK the "
                              "credentials of an SDK key (`mqstore user sdk-key create USER` makes one)")
    if not _HEX.match(fields["Signature"]):
        raise Unauthenticated("Signature: 40 hexadecimal digits (HMAC-SHA1)")
    if date_time is None:
        raise Unauthenticated(f"a signed request needs the {DATE_HEADER} metadata (yyyyMMdd'T'HHmmss'Z')")
    return Signed(access_key, date_time, bytes.fromhex(fields["Signature"]))


def date_ms(date_time: str) -> int:
    """Milliseconds since the epoch of a yyyyMMdd'T'HHmmss'Z' value (UTC); Unauthenticated when malformed."""
    match = _DATE.match(date_time)
    if match is None:
        raise Unauthenticated(f"{DATE_HEADER}: yyyyMMdd'T'HHmmss'Z' (UTC), e.g. 20231013T063059Z")
    year, month, day, hour, minute, second = (int(g) for g in match.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise Unauthenticated(f"{DATE_HEADER}: not a valid date and time")
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) * 1000


def check_fresh(signed: Signed, now_ms: int, max_skew_ms: int = MAX_SKEW_MS) -> int:
    """The signed date-time in milliseconds; Unauthenticated unless it is within ``max_skew_ms`` of
    ``now_ms``."""
    signed_ms = date_ms(signed.date_time)
    skew = signed_ms - now_ms
    if abs(skew) > max_skew_ms:
        raise Unauthenticated(f"{DATE_HEADER} is {abs(skew) // 1000} s {'ahead of' if skew > 0 else 'behind'} the "
                              f"server's clock; at most {max_skew_ms // 1000} s are accepted (check the client's "
                              f"clock and that it signs in UTC)")
    return signed_ms


def sign(secret_key: str, date_time: str) -> bytes:
    return hmac.digest(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1)


def verify(secret_key: bytes, signed: Signed) -> bool:
    """True when ``signed`` carries HMAC-SHA1(secret_key, date-time) (compared in constant time)."""
    expected = hmac.digest(secret_key, signed.date_time.encode("utf-8"), hashlib.sha1)
    return hmac.compare_digest(expected, signed.signature)
