"""Putting the keys of commit log records into a run of unsealed index files.

Used for the live tail (files ``<offset>.idx``) and for rebuilding a quarantined range (files
``<offset>.rebuild``). Rules, as RocketMQ's CommitLogDispatcherBuildIndex plus two fixes:

* a record below the last indexed physical offset is skipped (idempotent re-feed);
* the record AT the last indexed offset is the one a crash may have left half indexed: its torn put
  is finished in place, and only keys still missing are put (RocketMQ re-puts all of them and so
  indexes duplicates);
* a message's keys never straddle two files: when the current file has fewer free entries than the
  message has keys, the next file starts at once (named by this message's physical offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore.errors import invariant
from mqstore.format.index_file import key_hashes
from mqstore.javahash import java_hash_continue, java_hash_prefix

from .files import UnsealedHandle
from .records import IndexRecord, index_keys, query_key

log = structlog.get_logger("index.writer")
_PREFIX_CACHE_LIMIT = 10_000
_UNIQ_TAIL = 4


@dataclass
class PutOutcome:
    applied: int = 0
    skipped: int = 0
    dropped_keys: int = 0


class Writer:
    """Not thread-safe: the IndexStore's lock is held for every call.

    ``new_file(first_phy_offset, previous)`` creates and registers the next file; ``on_sealed(handle)``
    is told when a full file is left behind (it is flushed before the next file gets entries).
    """

    def __init__(self, max_keys: int, new_file: Callable[[int, UnsealedHandle | None], UnsealedHandle],
                 on_sealed: Callable[[UnsealedHandle], None], current: UnsealedHandle | None = None,
                 end_phy_offset: int | None = None):
        self.max_keys = max_keys
        self.current = current
        self.end_phy_offset = end_phy_offset  # physical offset of the last message indexed, if any
        self._new_file = new_file
        self._prefixes: dict[str, int] = {}  # topic -> Java hash state of "topic#"
        self._uniq_head, self._uniq_prefix, self._uniq_state = "", -1, 0
        self._on_sealed = on_sealed

    def put(self, record: IndexRecord, outcome: PutOutcome) -> None:
        phy = record.physical_offset
        if self.end_phy_offset is not None and phy < self.end_phy_offset:
            outcome.skipped += 1
            return
        keys = index_keys(record, self.max_keys)
        if keys.dropped:
            log.warning("index.keys_dropped", physical_offset=phy, topic=record.topic,
                        indexed=len(keys.keys), dropped=keys.dropped)
            outcome.dropped_keys += keys.dropped
        prefix = self._prefixes.get(record.topic)
        if prefix is None:
            if len(self._prefixes) >= _PREFIX_CACHE_LIMIT:
                self._prefixes.clear()
            prefix = self._prefixes[record.topic] = java_hash_prefix(query_key(record.topic, ""))
        hashes = self._hashes(record, prefix, keys.keys)
        if phy == self.end_phy_offset:
            hashes = self._missing(hashes, phy)
        self._place(phy, record.store_timestamp_ms, hashes, outcome)

    def _place(self, phy: int, store_timestamp_ms: int, hashes: list[int], outcome: PutOutcome) -> None:
        if not hashes:
            outcome.skipped += 1
            return
        file = self._file_for(phy, len(hashes))
        file.file.put_hashes(hashes, phy, store_timestamp_ms)
        self.end_phy_offset = phy
        outcome.applied += 1

    def put_columns(self, columns, outcome: PutOutcome) -> None:
        """:meth:`put` of every record of compiled IndexColumns (mqstore.codec), in log order: the same
        rules, files and outcome. The current file takes runs of messages in one compiled call; the few
        records that need more (the one at the last indexed offset, the one that starts the next file)
        go through the Python steps above."""
        count, end, i = len(columns), self.end_phy_offset, 0
        if end is not None:
            i = columns.first_at_or_after(end)
            outcome.skipped += i
        self._count_dropped(columns, i, outcome)
        if i < count and columns.physical_offset(i) == end:
            self._place(end, columns.store_timestamp_ms(i), self._missing(columns.hashes_of(i), end), outcome)
            i += 1
        while i < count:
            if self.current is not None:
                i = self._put_run(columns, i, outcome)
                if i == count:
                    break
            # record i does not fit the current file (or there is none yet): _file_for starts the next
            self._place(columns.physical_offset(i), columns.store_timestamp_ms(i), columns.hashes_of(i), outcome)
            i += 1

    def _put_run(self, columns, start: int, outcome: PutOutcome) -> int:
        file = self.current.file
        entries = file.header.entries
        try:
            stop, applied, skipped = file.put_columns(columns, start)
        finally:  # also when a bad slot stopped the run: the messages put before it are indexed
            if file.header.entries != entries:
                self.end_phy_offset = file.header.end_phy_offset
        outcome.applied += applied
        outcome.skipped += skipped
        return stop

    def _count_dropped(self, columns, start: int, outcome: PutOutcome) -> None:
        for index, (dropped, topic) in columns.dropped.items():
            if index >= start:
                log.warning("index.keys_dropped", physical_offset=columns.physical_offset(index), topic=topic,
                            indexed=len(columns.hashes_of(index)), dropped=dropped)
                outcome.dropped_keys += dropped

    def _hashes(self, record: IndexRecord, prefix: int, keys: tuple[str, ...]) -> list[int]:
        """Hashes of topic#key for the message's keys. UNIQ_KEYs of one batch differ only in their last
        four characters (a counter after the producer's address and the time), so the hash state of
        everything before them is kept from one message to the next."""
        uniq = record.uniq_key
        if not (uniq and len(uniq) > _UNIQ_TAIL and keys and keys[0] == uniq):
            return key_hashes(prefix, keys)
        head = uniq[:-_UNIQ_TAIL]
        if head != self._uniq_head or prefix != self._uniq_prefix:
            self._uniq_state = java_hash_continue(prefix, head) & 0xFFFF_FFFF
            self._uniq_head, self._uniq_prefix = head, prefix
        return key_hashes(self._uniq_state, (uniq[-_UNIQ_TAIL:],)) + key_hashes(prefix, keys[1:])

    def _missing(self, hashes: list[int], phy: int) -> list[int]:
        """Keys of the message at the last indexed offset that a crash may have left out. They are
        in the current file unless it has no entries (then the message is whole in the previous).
        A put torn between its header and its slots is finished in place first (its entries are all
        there, counted; only slots are missing): no duplicate entries, and no roll, which for a full
        file holding only this message would need a second file of the same name. Keys still missing
        after that (entries lost, or a put from before this write order) are put again."""
        file = self.current
        if file is None or file.file.header.entries == 0 or file.file.header.end_phy_offset != phy:
            return []
        relinked = file.file.relink_last_message()
        if relinked:
            log.info("index.torn_put_finished", physical_offset=phy, slots_written=relinked, file=file.file.path.name)
        return [h for h in dict.fromkeys(hashes) if not file.file.contains(h, phy)]

    def _file_for(self, phy: int, key_count: int) -> UnsealedHandle:
        current = self.current
        if current is not None and current.file.free_entries >= key_count:
            return current
        invariant(current is None or current.file.header.entries > 0,
                  f"{key_count} keys do not fit an empty index file")
        if current is not None:
            current.file.flush()
        # Create the next file before sealing the current one: on a full disk the creation fails
        # (ResourceExhausted) and the current file must stay the writer's, unsealed, so that nothing
        # converts and closes it before the follower retries.
        new = self._new_file(phy, current)
        if current is not None:
            current.sealed = True
            self._on_sealed(current)
        self.current = new
        return new
