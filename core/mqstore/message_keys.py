"""The compaction key, defined once: the commit log routes by it and the compactor keeps the latest
value per it.

The compaction key of a message is its **first key** (the first space-separated entry of the KEYS
property; the ``keys`` field and the KEYS property are the same thing). Its queue is the Java
``String.hashCode`` of the key, floor-modulo the topic's queue count, so one key always lands in one
queue. On a COMPACTION topic:

* a message without a key is refused (INVALID_ARGUMENT): RocketMQ drops keyless messages from the
  compaction log silently, which loses them;
* an explicit ``queue_id`` must be the key's queue, and a ``sharding_key`` must hash to the key's queue;
  otherwise INVALID_ARGUMENT (an override would put one key in two queues, and a queue only compacts
  against itself).

A message is a tombstone (deletes its key) when its body is empty or it carries the property
:data:`PROPERTY_DELETE` with the value ``true``.
"""

from __future__ import annotations

from mqstore.errors import InvalidArgument, shown
from mqstore.format.record import PROPERTY_DELETE, PROPERTY_KEYS
from mqstore.format.record_reader import find_property
from mqstore.javahash import java_string_hash


_DELETE_ENTRY = PROPERTY_DELETE.encode() + b"\x01"  # a cheap test before the exact one (most records have none)


def first_key(keys_property: str | None) -> str | None:
    """The compaction key from a stored KEYS property value ("a b" -> "a"); None without keys."""
    if not keys_property:
        return None
    key = keys_property.split(" ", 1)[0]
    return key or None


def message_key(keys, properties: dict | None) -> str | None:
    """The compaction key of a message to append: its first key, from the field or the KEYS property."""
    if keys:
        return keys[0]
    return first_key((properties or {}).get(PROPERTY_KEYS))


def key_queue(key: str, queue_count: int) -> int:
    """The queue of ``key`` in a topic of ``queue_count`` queues."""
    return java_string_hash(key) % queue_count


def is_tombstone(body_length: int, properties_raw) -> bool:
    """An empty body, or PROPERTY_DELETE=true in the raw properties bytes."""
    return body_length == 0 or (_DELETE_ENTRY in properties_raw and find_property(properties_raw, PROPERTY_DELETE)
                                == "true")


def compaction_queue(index: int, topic: str, queue_count: int, key: str | None, queue_id: int | None,
                     sharding_key: str) -> int:
    """The queue of message ``index`` of a COMPACTION topic, or InvalidArgument naming the field."""
    if key is None:
        raise InvalidArgument(f"messages[{index}]: topic {topic} is a COMPACTION topic: every message needs a key "
                              f"(keys, or the KEYS property); its first key is the compaction key")
    queue = key_queue(key, queue_count)
    if queue_id is not None and queue_id != queue:
        raise InvalidArgument(f"messages[{index}].queue_id {queue_id} disagrees with the queue of its key {shown(key)} "
                              f"({queue}) on COMPACTION topic {topic}; leave queue_id out (a key lives in one queue)")
    if sharding_key and key_queue(sharding_key, queue_count) != queue:
        raise InvalidArgument(f"messages[{index}].sharding_key {shown(sharding_key)} routes to queue "
                              f"{key_queue(sharding_key, queue_count)}, but its key {shown(key)} lives in queue "
                              f"{queue} on COMPACTION topic {topic}; leave sharding_key out")
    return queue
