"""Background duties of the store, one named duty ("store-maintenance", mqstore.background):

- every ``checkpoint_interval_ms``: ``write_checkpoint`` (flush consume queues, then write the
  checkpoint through the atomic replace protocol), then ``follow_offsets`` (the consumer offsets' map
  caught up with its topic: a replica's stays warm without readers, mqstore.consumer_offsets);
- every ``clean_interval_ms``: ``check_disk`` (the disk check that puts the store into read-only mode
  and back), ``delete_expired_segments`` (retention of whole segments) and ``apply_topic_retention``
  (per-topic logical retention).

It is given those as callables, not the store: what each does is the store's business. A store
or OS error is retried with backoff (a checkpoint that fails now may be written next time); a bug ends
the duty and makes the store unhealthy (mqstore.background).
"""

from __future__ import annotations

from typing import Callable

from mqstore.background import Duty
from mqstore.config import StoreConfig


class Maintenance(Duty):
    def __init__(self, config: StoreConfig, clock, *, write_checkpoint: Callable[[], object],
                 check_disk: Callable[[], None], delete_expired_segments: Callable[[], int],
                 apply_topic_retention: Callable[[], None], follow_offsets: Callable[[], None] = lambda: None):
        super().__init__("store-maintenance", interval_s=config.checkpoint_interval_ms / 1000)
        self.clock = clock
        self.clean_interval_s = config.clean_interval_ms / 1000
        self._write_checkpoint = write_checkpoint
        self._check_disk = check_disk
        self._delete_expired_segments = delete_expired_segments
        self._apply_topic_retention = apply_topic_retention
        self._follow_offsets = follow_offsets
        self._last_clean_s = clock.monotonic_s()

    def step(self) -> None:
        self._write_checkpoint()
        self._follow_offsets()
        now = self.clock.monotonic_s()
        if now - self._last_clean_s >= self.clean_interval_s:
            self._last_clean_s = now
            self.clean()

    def clean(self) -> None:
        self._check_disk()
        self._delete_expired_segments()
        self._apply_topic_retention()
