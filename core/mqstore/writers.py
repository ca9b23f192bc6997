"""System writers: who may write the store's own topics, registered from outside the store.

A system writer is a part of mqstore that appends through MessageStore.append's ``system_writer`` (the
internal way into the log: the gRPC Append never sets it): pop consumption (mqstore.pop.copies), the
gateway (mqstore.relayed), the Transaction service and the delayed-message scheduler
(mqstore.system_writers), and the store itself (its topic events: mqstore.store). Each registers a
:class:`WriterRules` at its composition: its name, the system topics it alone writes, the name prefixes of
the ordinary topics it alone writes, and its check of a batch. The store asks :meth:`Writers.check` and
knows none of them; a new system writer registers its rules and leaves the store as it is.

Which names are system topics is not the registry's: mqstore.topics reserves them in every process,
whether or not their writer is registered there (a client may never create or write one); a registered
topic must be one of them. ``mqstore.system_writers`` registers every writer of mqstore: a process that
takes appends from other services (the commit log) imports it.

Thread-safety: :meth:`Writers.register` serialises on a lock and replaces the lookup tables whole;
:meth:`Writers.check` reads them without a lock (one attribute read each).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Sequence

from mqstore import topics as topic_rules
from mqstore.errors import FailedPrecondition, InvalidArgument, invariant, shown
from mqstore.model import KIND_SYSTEM, MessageIn, TopicRecord


def _no_check(topic: TopicRecord, messages: Sequence[MessageIn]) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class WriterRules:
    """One system writer. ``owner``: the name it gives as ``system_writer`` ("" for the store itself: no
    writer may name it); ``description``: who it is, in refusals; ``topics``: the system topics only it
    writes; ``prefixes``: ordinary topics whose names start so are written by it alone (``prefixed_what``
    names them in refusals); ``check(topic, messages)``: what it may write, raised before the owner check."""
    owner: str
    description: str
    topics: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    prefixed_what: str = ""
    check: Callable[[TopicRecord, Sequence[MessageIn]], None] = _no_check


class Writers:
    """The registry of system writers: owner -> :class:`WriterRules`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_owner: dict[str, WriterRules] = {}
        self._by_topic: dict[str, WriterRules] = {}
        self._by_prefix: dict[str, WriterRules] = {}
        self._prefixes: tuple[str, ...] = ()

    def register(self, rules: WriterRules) -> WriterRules:
        """Add ``rules`` (the same rules again: nothing). A second writer of the same name, or of a topic or
        prefix another writer has, is a bug of the composition: InvariantViolation."""
        with self._lock:
            known = self._by_owner.get(rules.owner)
            if known == rules:
                return rules
            invariant(known is None, f"system writer {rules.owner!r} is registered twice, with other rules")
            for name in rules.topics:
                invariant(topic_rules.is_system_topic(name), f"{name!r} is not a system topic (mqstore.topics)")
                invariant(name not in self._by_topic, f"system topic {name!r} has two writers")
            for prefix in rules.prefixes:
                invariant(bool(prefix) and prefix not in self._by_prefix, f"topic prefix {prefix!r} has two writers")
            self._by_owner = {**self._by_owner, rules.owner: rules}
            self._by_topic = {**self._by_topic, **dict.fromkeys(rules.topics, rules)}
            self._by_prefix = {**self._by_prefix, **dict.fromkeys(rules.prefixes, rules)}
            self._prefixes = tuple(self._by_prefix)
            return rules

    def owners(self) -> list[str]:
        """The names writers may give, sorted (the store's own "" left out)."""
        return sorted(owner for owner in self._by_owner if owner)

    def owner_of(self, topic: str) -> WriterRules | None:
        """The rules of the writer that alone writes ``topic`` (a system topic or a prefixed one); None."""
        rules = self._by_topic.get(topic)
        if rules is None and self._prefixes and topic.startswith(self._prefixes):
            rules = next(r for p, r in self._by_prefix.items() if topic.startswith(p))
        return rules

    def check(self, topic: TopicRecord, messages: Sequence[MessageIn], writer: str | None) -> None:
        """Raise unless ``writer`` (None or "": a client) may append ``messages`` to ``topic``: first the
        writer's own check, then the owner rule: a system topic is written only by its registered owner,
        a prefixed topic only by the writer of its prefix, any other topic by anybody."""
        if writer:
            rules = self._by_owner.get(writer)
            if rules is None:
                raise InvalidArgument(f"writer {shown(writer)} is not one of the store's internal writers; known: "
                                      f"{self.owners()}")
            rules.check(topic, messages)
        if topic.kind != KIND_SYSTEM:
            if self._prefixes and topic.name.startswith(self._prefixes):
                owner = self.owner_of(topic.name)
                if writer != owner.owner:
                    raise FailedPrecondition(f"topic {topic.name!r} is {owner.prefixed_what}: only {owner.description} "
                                             f"writes it; append to a topic of your own")
            return
        owner = self._by_topic.get(topic.name)
        if owner is None:
            raise FailedPrecondition(f"topic {topic.name!r} is a system topic that no writer of this process may "
                                     f"write (none is registered for it: mqstore.system_writers); append to a "
                                     f"topic of your own")
        if not owner.owner or writer != owner.owner:
            raise FailedPrecondition(f"topic {topic.name!r} is a system topic: only {owner.description} writes it; "
                                     f"append to a topic of your own")


# The registry of this process: features register into it at their composition; a MessageStore uses it
# unless it is given another.
SYSTEM_WRITERS = Writers()
