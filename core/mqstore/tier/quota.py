"""The tier's upload quota (``--tier-upload-max-bytes-per-second``; Kafka's copy quota, KIP-956's
``remote.log.manager.copy.max.bytes.per.second``): the uploader's puts are paced so that the bytes it sends to the
object store stay under a rate, which bounds what the uploads take from the appends (the store's CPU: ~0.4-0.6 s
per GB; the NIC's bandwidth) whatever the lag.

**Pacing.** The backends (mqstore.tier.s3, mqstore.tier.local) call :meth:`UploadQuota.take` before each chunk
they send: an S3 part (``--tier-multipart-bytes``), a single PUT's whole object, a file:// copy's chunk. Chunk k
starts no earlier than chunk k-1's start plus its bytes over the rate (as it is when chunk k asks), so the bytes
sent in any window of W seconds are at most ``rate x W`` plus one chunk; time without uploads earns no credit (no
burst after a pause).

**The floor.** A quota below the log's growth would let the upload lag grow without end, and with it the local
disk (local retention deletes only uploaded segments). So the rate is never below the lag over CATCH_UP_S:
``rate = max(quota, lag bytes / CATCH_UP_S)`` (the lag: the sealed commit log segments not yet FINISHED, set by
the uploader before each upload). When the log grows faster than the quota, the lag settles where the uploads
keep pace, at about CATCH_UP_S of the log's growth plus one chunk's time at the quota (given a tier that can take
that rate), and does not grow past it.

Thread-safety: ``take`` may be called from any thread (the tier's executor); ``lag_bytes`` is set by the uploader's
thread; ``stop`` from any thread.
"""

from __future__ import annotations

import threading
from typing import Callable

from mqstore.clock import Clock, SystemClock
from mqstore.errors import Unavailable

CATCH_UP_S = 60.0  # the floor: the rate never lets the upload lag exceed this many seconds of uploads


class UploadQuota:
    def __init__(self, bytes_per_second: int, *, clock: Clock | None = None,
                 sleep: Callable[[float], bool] | None = None, catch_up_s: float = CATCH_UP_S):
        """``bytes_per_second``: the quota (0: no pacing at all); ``sleep(s)``: wait s seconds, True when the
        uploader stops meanwhile (default: a wait that :meth:`stop` ends)."""
        if bytes_per_second < 0:
            raise ValueError(f"bytes_per_second must be 0 or more, not {bytes_per_second}")
        self.bytes_per_second = bytes_per_second
        self.catch_up_s = catch_up_s
        self.lag_bytes = 0  # sealed segments not uploaded yet (the uploader's, before each upload)
        self.waited_s = 0.0  # time the puts waited for the quota (status, tests)
        self._clock = clock or SystemClock()
        self._stopped = threading.Event()
        self._sleep = sleep or self._stopped.wait
        self._lock = threading.Lock()
        self._last_start_s = 0.0  # the last chunk's start (monotonic seconds) and size
        self._last_bytes = 0

    @property
    def limited(self) -> bool:
        return self.bytes_per_second > 0

    def rate(self) -> float:
        """Bytes a second now: the quota, or the floor when the lag needs more."""
        return max(float(self.bytes_per_second), self.lag_bytes / self.catch_up_s)

    def longest_s(self, size: int) -> float:
        """The longest the pacing can stretch a put of ``size`` bytes (the quota alone): a call's deadline
        (mqstore.tier.objects) adds it to the store's own."""
        return size / self.bytes_per_second if self.limited else 0.0

    def take(self, size: int) -> None:
        """Wait until ``size`` more bytes may be sent (at once when no quota); Unavailable if stopped meanwhile."""
        if not self.limited or size <= 0:
            return
        with self._lock:
            now = self._clock.monotonic_s()
            start = max(now, self._last_start_s + self._last_bytes / self.rate())  # the rate as the lag is now
            self._last_start_s, self._last_bytes = start, size
            wait = start - now
            self.waited_s += max(wait, 0.0)
        if wait <= 0:
            return
        if self._sleep(wait):
            raise Unavailable("the tier's uploader is stopping: the upload paced by the quota is cut (the next "
                              "start resolves its attempt)")

    def stop(self) -> None:
        """End every wait now (the uploader stops)."""
        self._stopped.set()
