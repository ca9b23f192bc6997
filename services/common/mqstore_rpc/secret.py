"""A value that must never reach a log line: secrets (the internal token, a user's secret) and PEM
payloads (a private key). Config dataclasses hold them as :class:`Secret`, so that
``dataclasses.asdict(config)`` in the ``server.started`` event, a ``repr`` or an exception message
shows ``<secret>`` instead (asdict deep-copies a non-dataclass value, and the JSON log renders it by
repr). Only :meth:`Secret.reveal` gives the value, at the point of use.

Immutable, so thread-safe.
"""

from __future__ import annotations


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str | bytes = ""):
        object.__setattr__(self, "_value", value)

    def __setattr__(self, name, value):
        raise AttributeError("Secret is immutable")

    def reveal(self) -> str | bytes:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "<secret>" if self._value else "<none>"

    __str__ = __repr__

    def __deepcopy__(self, memo) -> "Secret":
        return self

    def __reduce__(self):
        raise TypeError("a Secret is not pickled")
