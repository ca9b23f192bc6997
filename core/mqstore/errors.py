"""The one exception tree of mqstore.

Every error a caller can cause or observe is a subclass of :class:`MqStoreError`, carries a message a
person can act on (the field, the limit, the file and position), and maps to exactly one gRPC status
code in ``mqstore_rpc.errors``. Domain code raises these; it never returns sentinels.
"""

from __future__ import annotations


class MqStoreError(Exception):
    """Base of all mqstore errors."""

    retriable = False


class InvalidArgument(MqStoreError):
    """The request is malformed: a field is missing, too large or has the wrong shape."""


class NotFound(MqStoreError):
    """The topic, queue, message or offset asked for does not exist."""


class AlreadyExists(MqStoreError):
    """The thing to create exists already."""


class OutOfRange(MqStoreError):
    """An offset or position outside the valid range; the message states the range."""

    def __init__(self, message: str, *, min_value: int | None = None, max_value: int | None = None):
        super().__init__(message)
        self.min_value = min_value
        self.max_value = max_value


class FailedPrecondition(MqStoreError):
    """The store is not in a state that allows the operation (protected topic, needs repair...)."""


class PermissionDenied(MqStoreError):
    """The caller may not do this: a service-to-service door called without the shared secret, or an
    authenticated user without the permission the call needs (the message names it)."""


class Unauthenticated(MqStoreError):
    """The call carries no credentials, or credentials that are not accepted (mqstore.auth)."""


class ResourceExhausted(MqStoreError):
    """A resource ran out: disk full (read-only mode), too many waiters."""


class Unavailable(MqStoreError):
    """Try again later: starting, stopping, or an fsync did not confirm in time."""

    retriable = True


class FlushTimeout(Unavailable):
    """A SYNC append was written but no fsync covered it within the timeout."""


class OutcomeUnknown(Unavailable):
    """A write to another service failed in a way that does not prove nothing was written (the
    connection dropped, a deadline passed, the peer died or timed out its fsync): it may have landed.
    The caller must find out from the log before deciding again (the Transaction service's
    "outcome unknown" state); retrying the same write blindly could apply it twice."""


class DataLoss(MqStoreError):
    """Stored bytes fail their checks (CRC, length); nothing from them is served. When one stored
    record is known to be bad, ``physical_offset`` (and for a queue read ``queue_offset``) say which,
    so that a reader can skip it deliberately."""

    def __init__(self, message: str, *, physical_offset: int | None = None, queue_offset: int | None = None):
        super().__init__(message)
        self.physical_offset = physical_offset
        self.queue_offset = queue_offset


class CorruptLog(DataLoss):
    """Corruption before the tail of the commit log; start refuses until `mqstore repair` is run."""

    def __init__(self, message: str, *, path: str, position: int, physical_offset: int):
        super().__init__(message, physical_offset=physical_offset)
        self.path = path
        self.position = position


class InvariantViolation(AssertionError):
    """A bug: an internal invariant does not hold. Never caused by bad input."""


def invariant(condition: bool, message: str) -> None:
    """Check an internal invariant; unlike ``assert`` this survives ``python -O``."""
    if not condition:
        raise InvariantViolation(message)
