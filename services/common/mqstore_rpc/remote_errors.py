"""The way back: a gRPC status from another mqstore service -> the mqstore exception it came from.

``mqstore_rpc.errors`` maps exceptions to status codes on the server; a service calling another one
(the index calling the commit log) uses :func:`from_rpc_error` so that its own domain code sees the
same exception tree and never imports grpc. The table is the inverse of ``STATUS_BY_ERROR``. Codes
with no mqstore exception (a connection that failed, a deadline, a cancelled call, an INTERNAL error
of the peer) become :class:`Unavailable`: the other service could not answer, try again later. The
trailing metadata ``mqstore-min-value`` / ``mqstore-max-value`` of an OUT_OF_RANGE come back as the
range of the :class:`OutOfRange`; a FAILED_PRECONDITION whose ``mqstore-error`` trailer is
``NotLeader`` comes back as :class:`NotLeader` with the ``mqstore-leader`` address (a replica answered), an
INVALID_ARGUMENT whose trailer is ``IllegalDeliveryTime`` (the timer's limit) as :class:`IllegalDeliveryTime`, an
UNAVAILABLE whose trailer is ``NotWritten`` or ``NotEnoughReplicas`` (a leader refused before writing) as that class.

A call that never reached the peer is :class:`NotWritten` too: UNAVAILABLE with no ``mqstore-error`` trailer and
the details gRPC gives a call it failed before sending, because no connection could be made (``failed to connect
to all addresses``: every address refused or unreachable; ``errors resolving`` / ``DNS resolution failed``: the
name did not resolve, as a stopped container's; ``empty address list``). Any other transport failure ("Stream
removed", "Socket closed", a deadline) may have been sent and even done, and stays plain :class:`Unavailable`.
"""

from __future__ import annotations

import grpc
from mqstore import errors

from mqstore_rpc.errors import STATUS_BY_ERROR

ERROR_BY_STATUS: dict[grpc.StatusCode, type[errors.MqStoreError]] = {
    code: cls for cls, code in STATUS_BY_ERROR.items()}


def _metadata(exc: grpc.RpcError, name: str) -> str | None:
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return next((value for key, value in trailing or () if key == name), None)


def _metadata_int(exc: grpc.RpcError, name: str) -> int | None:
    value = _metadata(exc, name)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def from_rpc_error(exc: grpc.RpcError, peer: str) -> errors.MqStoreError:
    """The mqstore exception for a failed call to ``peer`` (an address, named in the message)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    message = f"{peer} answered {code.name}: {details}"
    cls = ERROR_BY_STATUS.get(code)
    if cls is errors.OutOfRange:
        return errors.OutOfRange(message, min_value=_metadata_int(exc, "mqstore-min-value"),
                                 max_value=_metadata_int(exc, "mqstore-max-value"))
    if cls is errors.FailedPrecondition and _metadata(exc, "mqstore-error") == errors.NotLeader.__name__:
        return errors.NotLeader(message, leader_address=_metadata(exc, "mqstore-leader") or "")
    if cls is errors.InvalidArgument and _metadata(exc, "mqstore-error") == errors.IllegalDeliveryTime.__name__:
        return errors.IllegalDeliveryTime(message)  # the gateway answers ILLEGAL_DELIVERY_TIME
    if cls is errors.Unavailable:
        named = _NOT_WRITTEN.get(_metadata(exc, "mqstore-error") or "")
        if named is not None:
            return named(message)
        if not _metadata(exc, "mqstore-error") and (details or "").startswith(_NEVER_SENT):
            return errors.NotWritten(f"{peer} could not be reached, the request was never sent: {details}")
    if cls is None:
        return errors.Unavailable(message)
    return cls(message)


_NOT_WRITTEN = {cls.__name__: cls for cls in (errors.NotWritten, errors.NotEnoughReplicas)}
# The details of a call gRPC failed before sending it (the module docstring)
_NEVER_SENT = ("failed to connect to all addresses", "errors resolving", "DNS resolution failed", "empty address list")


def never_done(exc: grpc.RpcError) -> bool:
    """Whether the failed call certainly did nothing: a NotWritten (a refusal before doing anything, or a call gRPC
    could not send) or a replica's NotLeader."""
    return isinstance(from_rpc_error(exc, ""), (errors.NotWritten, errors.NotLeader))


def from_batch_error(error, peer: str) -> errors.MqStoreError:
    """The mqstore exception of one batch that CommitLogInternal.AppendBatches refused (a BatchError):
    the class its ``error`` names, else the one of its code, as :func:`from_rpc_error` would give."""
    code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
    message = f"{peer} answered {code.name}: {error.message}"
    named = getattr(errors, error.error, None) if error.error else None
    cls = named if isinstance(named, type) and issubclass(named, errors.MqStoreError) else ERROR_BY_STATUS.get(code)
    if cls is None:
        return errors.Unavailable(message)
    if issubclass(cls, errors.NotLeader):
        return errors.NotLeader(message, leader_address="")
    if issubclass(cls, errors.OutOfRange):
        return errors.OutOfRange(message)
    return cls(message)


_CODES = {code.value[0]: code for code in grpc.StatusCode}
