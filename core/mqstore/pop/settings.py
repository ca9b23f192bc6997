"""Settings of a consumer group for pop consumption: whether it is ordered (mqstore.pop.ordered; shown to
RocketMQ 5 clients as ``subscription.fifo`` by the gateway). RocketMQ keeps this as the subscription
group's attribute ``consumeMessageOrderly`` in a JSON file of the broker; here it is a row of the consumer
offsets map (mqstore.consumer_offsets) under a reserved key that no topic can take:

  (group, "RMQ_SYS_POP_GROUP_SETTINGS", 0) -> flags (bit 0: ordered)

so it is stored, replicated (SYNC, as every pop record), kept through retention (the map's rewrite) and
found by a new leader exactly as pop's offsets are, without a store of its own. A group never set is
unordered.

Thread-safe: a lock guards the cache; only the leader's PopService writes (it is the only one running),
so its cache is the truth until the next start, which begins empty.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mqstore import store_offsets
from mqstore import topics as topic_rules

SETTINGS_KEY = "RMQ_SYS_POP_GROUP_SETTINGS"  # a reserved name (RMQ_SYS_*): never a topic
FLAG_ORDERED = 1


@dataclass(frozen=True, slots=True)
class GroupSettings:
    group: str
    ordered: bool = False


class GroupSettingsTable:
    def __init__(self, store, replication: str):
        self.store, self.replication = store, replication
        self._lock = threading.Lock()
        self._cache: dict[str, GroupSettings] = {}

    def get(self, group: str) -> GroupSettings:
        topic_rules.validate_group_name(group)
        with self._lock:
            found = self._cache.get(group)
        if found is not None:
            return found
        flags = store_offsets.query_key(self.store, group, SETTINGS_KEY, 0) or 0
        settings = GroupSettings(group, bool(flags & FLAG_ORDERED))
        with self._lock:
            return self._cache.setdefault(group, settings)

    def peek(self, group: str) -> GroupSettings | None:
        """The group's settings if known here, without reading them (None: not yet read)."""
        with self._lock:
            return self._cache.get(group)

    def set(self, group: str, *, ordered: bool) -> GroupSettings:
        topic_rules.validate_group_name(group)
        settings = GroupSettings(group, ordered)
        with self._lock:  # one writer at a time: the cache follows the order of the records
            store_offsets.commit_keys(self.store, [(group, SETTINGS_KEY, 0, FLAG_ORDERED if ordered else 0)],
                                      self.replication)
            self._cache[group] = settings
        return settings
