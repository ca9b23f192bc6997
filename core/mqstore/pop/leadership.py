"""Pop consumption in a replication group: it runs on the leader only, and each leadership starts it afresh.

The in-flight set, the pop offsets not yet stored and the revive duty are the leader's memory; the durable
facts (CK and ACK records in rmq_sys_REVIVE_LOG, copies in retry and dead-letter topics) are records of
the commit log, so every replica holds them too, and so do the stored offsets (records of the offsets
topic, mqstore.consumer_offsets, SYNC-replicated as well). So:

  this node                    PopLeadership does
  ---------------------------- ------------------------------------------------------------------------
  a replica (or candidate)     no PopService; every call answers NotLeader naming the leader (as Append)
  elected leader               waits until the copied log is visible (the revive queue holds every record
                               it copied), then builds a new PopService: replay of the revive log from the
                               stored checkpoint, the revive duty started; calls answer Unavailable until then
  stops leading (deposed,      halts the PopService: its revive duty stops, no final flush (another node
  lease lost, switchover)      may lead already; what it did not store is in the revive log, replayed by
                               the next leader)
  stops (the process)          a leader stores its offsets once more (PopService.stop); others just halt

Nothing acknowledged comes back and nothing in flight is lost across a failover because every pop record
is appended with SYNC replication (``POP_REPLICATION``; Kafka commits its consumer offsets with acks=all
likewise): an acknowledged CK or ACK is on every in-sync node, the new leader among them, and its replay
reaches it. A record that timed out was never acknowledged: the receive or ack failed, and either outcome
after a failover (the record kept or cut) is one the client was told may happen.

A single node (no replication) starts its PopService at once, as before (:meth:`start_now`).

Thread-safety: ``current()`` may be called from any thread (it reads one reference); the role changes run
on the duty's thread ("pop-leadership") or before it starts.
"""

from __future__ import annotations

from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.errors import Unavailable
from mqstore.pop.config import PopConfig
from mqstore.pop.service import PopService

log = structlog.get_logger("mqstore.pop.leadership")


class PopLeadership(Duty):
    def __init__(self, store, config: PopConfig, *, leading_epoch: Callable[[], int], ready: Callable[[], bool],
                 interval_s: float = 0.05):
        """``store``: the started MessageStore (its ``gate`` refuses writes on a replica); ``leading_epoch()``:
        the epoch this node leads now, 0 when it does not lead; ``ready()``: a new leader's log is visible as
        far as it copied it."""
        super().__init__("pop-leadership", interval_s=interval_s, backoff_initial_s=0.05, backoff_max_s=1.0)
        self.store = store
        self.config = config
        self.leading_epoch = leading_epoch
        self.ready = ready
        self._pop: PopService | None = None
        self._epoch = 0  # the leadership the running PopService belongs to
        self.leaderships = 0  # PopServices started (tests)

    # ---- what the Consumer servicer calls --------------------------------------------------------------
    def current(self) -> PopService:
        """The running PopService; NotLeader (naming the leader) on a replica, Unavailable while a new
        leader rebuilds its in-flight set."""
        pop = self._pop
        if pop is not None and pop.started:
            return pop
        self.store.gate.check_writable()  # a replica or a fenced leader says so here
        raise Unavailable("pop consumption is starting on this new leader (rebuilding its in-flight set from the "
                          "revive log); retry shortly")

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start_now(self) -> PopService:
        """A single node: the PopService starts before the server serves; the caller runs its revive duty
        (``pop.reviver``) and stops the PopService (:meth:`close`)."""
        self._pop = self._new(run_duty=False)
        return self._pop

    def step(self) -> None:
        epoch = self.leading_epoch()
        if self._pop is not None and epoch != self._epoch:
            self._stop_leading()
        if epoch and self._pop is None and self.ready():
            self._pop, self._epoch = self._new(run_duty=True), epoch
            log.info("pop.leading", epoch=epoch, in_flight=len(self._pop.inflight),
                     revive_offset=self._pop.reviver.revive_offset)

    def _stop_leading(self) -> None:
        pop, self._pop = self._pop, None
        pop.halt()
        log.warning("pop.stopped_leading", epoch=self._epoch, in_flight_dropped=len(pop.inflight),
                    why="this node no longer leads that epoch; the next leader rebuilds the in-flight set from the "
                        "revive log")

    def _new(self, run_duty: bool) -> PopService:
        pop = PopService(self.store, self.config)
        pop.start(run_duty=run_duty)
        self.leaderships += 1
        return pop

    def close(self, timeout_s: float = 10.0) -> None:
        """The process stops (after the duty has): a leader stores its offsets once more; others only halt."""
        pop, self._pop = self._pop, None
        if pop is None:
            return
        if self.leading_epoch() == self._epoch:
            pop.stop(timeout_s)
        else:
            pop.halt()

    def problem(self) -> str:
        """This duty's, or the running revive duty's (a bug that killed either turns health NOT_SERVING)."""
        pop = self._pop
        return super().problem() or (pop.reviver.problem() if pop is not None else "")

    def on_died(self, exc: BaseException) -> None:
        if self._pop is not None:
            self._stop_leading()
