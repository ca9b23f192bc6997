"""The handler threads of every gRPC server (mqstore_rpc.server): an Executor that wakes the thread that went
idle last and, where the service asks for it, runs at most a few calls at a time.

Every port (mqstore_rpc.aio) submits each synchronous handler's call to this executor. With the standard
ThreadPoolExecutor every call goes to a thread of its own as long as one is free (up to max_workers, 64): under
a steady load of short calls a dozen threads take turns, each woken for one call, each then waiting for the GIL that the
others hold, each found cold (its stack and objects out of the CPU caches). One GIL runs one of them at a
time anyway. Here at most ``max_running`` calls run at once (the server setting max_running_handlers:
RUNNING, 4, for the CommitLog service and its Local-mode Transaction port; 0, no cap, for the others, where
a cap measured no gain: the Cluster-mode Transaction service's cost is elsewhere); a call submitted beyond
that waits in a queue, in arrival order, and the thread that finishes a call takes the next one without
going to sleep. A stream is handled under the same cap, message by message: after its wait for the
client's next message, a stream's thread handles it once a place is free, in line with the queued calls
(_resumes_in_line); 32 producers' Transact streams cost a transaction ~25% less CPU that way than all
running at once. Idle threads wait on a stack, each on a lock of its own, and a call goes to the one on
top. bench/README.md, *Which gRPC server for single messages*, has the figures.

A call that waits (a long poll, a Tail stream between frames, a stream waiting for its client's next
message, a SYNC append waiting for its fsync) must not hold a place while it waits, or four of them would
stop the server. Two ways out:

  - the wait says so (mqstore.waits.waiting(): the SYNC flush, the SYNC replication acknowledgement, long
    polls, Tail and replica streams between frames, every request stream's wait for its next message,
    taken through mqstore.waits.iterate by mqstore_rpc.aio, a synchronous response stream's wait for the
    loop to ask for its next response (mqstore_rpc.aio's driven stream), and, for the services that may be capped by
    their setting, every call through CommitLogClient, the txn appender's and OP waits and check-back
    streams): its place is free at once, taken back after;
  - any other wait is found by a monitor thread, which runs only while calls are queued: every TICK_S it
    reads the CPU clock of each running thread, and a thread whose clock did not move for STALL_TICKS
    readings does not count until it moves again. A queued call then waits at most about
    (STALL_TICKS + 1) x TICK_S, 40 ms, for a place that such a call holds.

So the server never does less than before (a thread per call when calls wait), and does it with fewer
threads when they do not. The contract is concurrent.futures.Executor's, as grpc uses it: ``submit``
returns a Future that the call's completion resolves (grpc adds a done callback to count the call as
ended); threads are made on demand, up to ``max_workers``; ``shutdown`` lets the threads finish what they
run and what is queued (``cancel_futures`` drops the queued).

Thread-safe: ``_lock`` guards the pool's fields and its workers' (``item``, ``running``, ``stalled``), but for
what the wait hooks touch without it, on their own thread: ``_hinted`` (a deque: append and pop are atomic)
and the worker's ``hinted``, ``sample`` and ``still`` (the monitor reading them a moment late makes it count
a thread once too often or too few, for one tick: a call more or less runs, nothing waits for good). A
worker's ``item`` is written before its wake lock is released.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent import futures
from typing import Any, Callable

from mqstore import profiling, waits

RUNNING = 4       # the CommitLog service's max_running_handlers: calls that run at once, waits not counted
TICK_S = 0.01     # the monitor's period while calls are queued...
STALL_TICKS = 3   # ...and a running thread whose CPU clock did not move for this many is waiting (a thread
                  # that waits for the GIL does not move either, but gets it within a switch interval, 5 ms,
                  # per thread ahead of it)

_Item = tuple[futures.Future, Callable[..., Any], tuple, dict]
_Resumer = tuple[int, threading.Lock, "_Worker"]  # (ticket, its gate, held until it may go on; its worker)


class _Worker:
    __slots__ = ("item", "wake", "clock", "sample", "still", "stalled", "running", "hinted")

    def __init__(self) -> None:
        self.item: _Item | None = None
        self.wake = threading.Lock()  # held while the worker sleeps on the stack; released to wake it
        self.wake.acquire()
        self.clock: int | None = None  # its thread's CPU clock id (set by the thread itself)
        self.sample: int | None = None  # the monitor's last reading of that clock (ns), None = none yet
        self.still = 0                  # readings in a row that found it where it was
        self.stalled = False            # waiting: not counted against max_running
        self.running = False            # in a call
        self.hinted = False             # in a wait that said so (mqstore.waits): the monitor leaves it be


class HandlerPool(futures.Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str = "grpc-handler", *, max_running: int = RUNNING,
                 tick_s: float = TICK_S, stall_ticks: int = STALL_TICKS):
        if max_workers <= 0 or max_running <= 0:
            raise ValueError(f"max_workers and max_running must be positive, not {max_workers}, {max_running}")
        self.max_workers, self.max_running = max_workers, min(max_running, max_workers)
        self.tick_s, self.stall_ticks = tick_s, stall_ticks
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)  # the monitor sleeps on it while nothing is queued
        self._idle: list[_Worker] = []                   # the top (end) went idle last
        self._queue: collections.deque[tuple[int, _Item]] = collections.deque()  # (ticket, call)
        self._resumers: collections.deque[_Resumer] = collections.deque()  # stream threads waiting for a place
        self._tickets = itertools.count()  # arrival order, shared by queued calls and resumers
        self._threads: list[threading.Thread] = []
        self._running = 0                                # workers in a call...
        self._stalled = 0                                # ...of which found waiting by the monitor
        self._hinted: collections.deque[None] = collections.deque()  # ...or in a wait that said so
        self._workers: list[_Worker] = []
        self._monitor: threading.Thread | None = None
        self._shutdown = False

    # ---- the Executor contract
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        item = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._resumers or not (self._place() and self._dispatch(item)):
                self._queue.append((next(self._tickets), item))
                self._wake_monitor()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[1][0].cancel()
            else:  # what is queued runs now, on as many threads as it takes
                while self._queue and self._dispatch(self._queue[0][1]):
                    self._queue.popleft()
            while self._resumers:  # and the streams go on
                self._resume(self._resumers.popleft())
            idle, self._idle = self._idle, []
            threads = list(self._threads)
            self._queued.notify_all()
        for worker in idle:
            worker.item = None
            worker.wake.release()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def counts(self) -> dict[str, int]:
        """Threads made, idle, running a call, of those waiting, calls queued: for tests and diagnostics."""
        with self._lock:
            return {"threads": len(self._threads), "idle": len(self._idle), "running": self._running,
                    "waiting": self._stalled + len(self._hinted), "queued": len(self._queue),
                    "resuming": len(self._resumers)}

    # ---- under _lock
    def _dispatch(self, item: _Item) -> bool:
        """Hand ``item`` to the idle thread on top, or to a new thread; False if neither is possible."""
        if self._idle:
            worker = self._idle.pop()
        elif len(self._threads) < self.max_workers:
            worker = _Worker()
            thread = threading.Thread(target=self._work, args=(worker,), daemon=True,
                                      name=f"{self._prefix}_{len(self._threads)}")
            self._threads.append(thread)
            self._workers.append(worker)
            self._begin(worker, item)
            thread.start()
            return True
        else:
            return False
        self._begin(worker, item)
        worker.wake.release()
        return True

    def _place(self) -> bool:
        """A call may start: fewer than max_running calls run that are not waiting."""
        return self._running - self._stalled - len(self._hinted) < self.max_running

    def _begin(self, worker: _Worker, item: _Item) -> None:
        worker.item, worker.running, worker.stalled, worker.sample, worker.still = item, True, False, None, 0
        self._running += 1

    def _end(self, worker: _Worker) -> None:
        if worker.stalled:
            self._stalled -= 1
        worker.item, worker.running, worker.stalled = None, False, False
        self._running -= 1

    def _fill(self) -> None:
        """Give the free places, in arrival order, to stream threads resuming and to queued calls."""
        while self._place():
            if self._resumer_first():
                self._resume(self._resumers.popleft())
            elif self._queue and self._dispatch(self._queue[0][1]):
                self._queue.popleft()
            else:
                return

    def _resumer_first(self) -> bool:
        """A stream thread is waiting for a place, and arrived before the first queued call."""
        return bool(self._resumers) and (not self._queue or self._resumers[0][0] < self._queue[0][0])

    def _resume(self, resumer: _Resumer) -> None:
        _, gate, worker = resumer
        self._resumes(worker)  # counted as running from now on
        gate.release()

    def _wake_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._watch, daemon=True, name=f"{self._prefix}-monitor")
            self._monitor.start()
        else:
            self._queued.notify()

    # ---- the threads
    def _work(self, worker: _Worker) -> None:
        profiling.name_os_thread()  # (else /proc and top show the loop's name: a thread inherits its creator's)
        with self._lock:
            worker.clock = time.pthread_getcpuclockid(threading.get_ident())
            item = worker.item
        if self.max_running < self.max_workers:  # uncapped, a wait frees nothing: no hook on the hot path
            waits.set_hooks(lambda: self._waits(worker), lambda: self._resumes(worker),
                            resume=lambda: self._resumes_in_line(worker))
        while item is not None:
            _run(item)
            with self._lock:
                self._end(worker)
                while self._resumer_first() and self._place():
                    self._resume(self._resumers.popleft())
                if self._queue and self._place():
                    self._begin(worker, self._queue.popleft()[1])
                    item = worker.item
                    continue
                if self._shutdown:
                    return
                self._idle.append(worker)
            worker.wake.acquire()
            with self._lock:
                item = worker.item

    # The two hooks run on every wait that says so (a stream's every frame): without the lock when nothing is
    # queued. ``_hinted`` counts the threads inside such a wait (a deque's append and pop are atomic).
    def _waits(self, worker: _Worker) -> None:
        worker.hinted = True
        self._hinted.append(None)
        if self._queue or self._resumers:
            with self._lock:
                self._fill()

    def _resumes(self, worker: _Worker) -> None:
        self._hinted.pop()
        worker.hinted, worker.sample, worker.still = False, None, 0

    def _resumes_in_line(self, worker: _Worker) -> None:
        """After a request stream's wait (mqstore.waits.iterate): the thread handles the message it got once a
        place is free, in line with queued calls (a stream's every message is a new piece of work: 32
        producers' streams running at once cost a transaction 40% more CPU than 4 at a time, bench/txn.py);
        until then it still counts as waiting. The thread holds nothing of the service's there."""
        if not self._resumers and not self._queue and self._place():
            self._resumes(worker)  # the common case, without the lock (a race lets one call more run, once)
            return
        gate = threading.Lock()
        gate.acquire()
        with self._lock:
            if self._shutdown or (not self._resumers and not self._queue and self._place()):
                self._resumes(worker)
                return
            self._resumers.append((next(self._tickets), gate, worker))
            self._fill()  # a place may have come free meanwhile
            self._wake_monitor()
        gate.acquire()  # released by _resume, under the lock

    def _watch(self) -> None:
        """While calls are queued: every tick_s, mark the running threads whose CPU clock did not move for
        stall_ticks readings as waiting (and those whose clock moved as running again), then start queued calls
        in the places freed."""
        while True:
            with self._lock:
                while not self._queue and not self._resumers and not self._shutdown:
                    self._queued.wait()
                if self._shutdown:
                    return
            time.sleep(self.tick_s)
            with self._lock:
                for worker in self._workers:
                    if not worker.running or worker.hinted or worker.clock is None:
                        continue
                    try:
                        now = time.clock_gettime_ns(worker.clock)
                    except OSError:  # the thread is gone (shutdown)
                        continue
                    moved = worker.sample is None or now != worker.sample
                    worker.sample = now
                    worker.still = 0 if moved else worker.still + 1
                    if moved and worker.stalled:
                        worker.stalled = False
                        self._stalled -= 1
                    elif worker.still >= self.stall_ticks and not worker.stalled:
                        worker.stalled = True
                        self._stalled += 1
                self._fill()


def _run(item: _Item) -> None:
    future, fn, args, kwargs = item
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the Future carries it, as ThreadPoolExecutor's workers do
        future.set_exception(exc)
    else:
        future.set_result(result)
