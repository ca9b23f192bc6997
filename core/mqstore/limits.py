"""The numeric fields of requests, checked where the domain takes them: one rule for every RPC.

  field                                   0                    negative            above its maximum
  --------------------------------------- -------------------- ------------------- --------------------------
  a limit (max_messages, max_bytes,       the documented       InvalidArgument     clamped to the maximum
  long_poll_ms, heartbeat_ms, max_num...) default              naming the field    (the proto says to what)
                                                               and the range
  an offset, queue id, time, count        itself               InvalidArgument     the RPC's own answer
                                                               naming the field    (OUT_OF_RANGE, NOT_FOUND)
  a bounded value (batch_size,            the documented       InvalidArgument     InvalidArgument
  invisible_duration_ms, max_attempts)    default, or refused  naming the field    (the proto gives the range)
                                          when it has none     and the range

A negative value is malformed whatever the state of the store, so it is INVALID_ARGUMENT, never read as
"nothing" or "everything": a Pull that took max_messages -1 as "no messages" answered OK at the queue's
end and reported the unread range as compacted, and a consumer following it lost every value.
"""

from __future__ import annotations

from mqstore.errors import InvalidArgument

MAX_GET_MESSAGES = 1000  # GetMessages: physical offsets per call (MessageStore.get_messages; its callers chunk by it)


def limit(field: str, value: int, *, default: int, maximum: int, minimum: int = 1) -> int:
    """A limit: 0 = ``default``; otherwise clamped into [minimum, maximum]; negative is InvalidArgument."""
    if value < 0:
        raise InvalidArgument(f"{field} is {value}; give 0 (the default, {default}) or {minimum} to {maximum} "
                              f"(a larger value is taken as {maximum})")
    return default if value == 0 else min(max(value, minimum), maximum)


def at_least_zero(field: str, value: int, meaning: str = "") -> int:
    """An offset, id, time or count: InvalidArgument when negative (``meaning`` says what 0 and up are)."""
    if value < 0:
        raise InvalidArgument(f"{field} is {value}; it must be 0 or more{f' ({meaning})' if meaning else ''}")
    return value


def within(field: str, value: int, low: int, high: int, *, default: int | None = None) -> int:
    """A value the proto bounds on both sides: 0 = ``default`` when it has one; anything outside [low, high]
    (negative included) is InvalidArgument naming the field and the range."""
    if value == 0 and default is not None:
        return default
    if not low <= value <= high:
        zero = f"0 (the default, {default}) or " if default is not None else ""
        raise InvalidArgument(f"{field} is {value}; give {zero}{low} to {high}")
    return value
