"""mqstore_rpc.executor.HandlerPool: the gRPC servers' handler threads (the Executor contract grpc uses,
last-idle-first waking, growth up to max_workers, then waiting in order, shutdown)."""

from __future__ import annotations

import queue
import threading
from concurrent import futures

import grpc
import pytest

from mqstore import waits
from mqstore_rpc.executor import HandlerPool
from tests.support.threads import os_thread_name

WAIT_S = 30  # every wait below is for an event that must come; the bound only stops a broken run
NEVER = 10**9  # stall_ticks: the monitor never finds a waiting thread (the tests of the cap and the hints)


@pytest.fixture
def pool():
    executor = HandlerPool(3, thread_name_prefix="test-handler", stall_ticks=NEVER)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def test_results_exceptions_and_done_callbacks(pool):
    done = []
    ok = pool.submit(lambda a, *, b: a + b, 2, b=3)
    ok.add_done_callback(lambda f: done.append(f.result()))
    assert ok.result(WAIT_S) == 5
    failed = pool.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(WAIT_S)
    assert done == [5]
    assert isinstance(failed.exception(WAIT_S), ZeroDivisionError)


def test_calls_one_after_another_run_on_the_same_thread(pool):
    """The thread that went idle last takes the next call: sequential calls never spread over threads (each
    submitted once the thread is back on the stack: a call's result is out just before its thread is)."""
    names = []
    for _ in range(50):
        names.append(pool.submit(lambda: threading.current_thread().name).result(WAIT_S))
        _wait_idle(pool, 1)
    assert set(names) == {"test-handler_0"}
    assert _threads_idle(pool) == (1, 1)


def test_last_idle_first():
    """Two threads idle: the one that finished last runs the next call."""
    pool = HandlerPool(2, stall_ticks=NEVER)
    try:
        release_first = threading.Event()
        first = pool.submit(lambda: (release_first.wait(WAIT_S), threading.current_thread().name)[1])
        second = pool.submit(lambda: threading.current_thread().name)
        second_name = second.result(WAIT_S)
        _wait_idle(pool, 1)  # idle first (a result is out just before its thread is back on the stack)
        release_first.set()
        first_name = first.result(WAIT_S)    # idle last
        assert first_name != second_name
        _wait_idle(pool, 2)
        assert pool.submit(lambda: threading.current_thread().name).result(WAIT_S) == first_name
    finally:
        pool.shutdown()


def test_grows_to_max_workers_then_queues_in_order(pool):
    """Three calls hold the three threads; four more wait. One thread freed takes the four in arrival order
    (only one is freed: two threads taking queued calls at once may finish them in either order)."""
    gates = [threading.Event() for _ in range(3)]
    started = threading.Semaphore(0)
    order = []

    def blocking(i):
        started.release()
        gates[i].wait(WAIT_S)
        return i

    held = [pool.submit(blocking, i) for i in range(3)]
    for _ in range(3):
        assert started.acquire(timeout=WAIT_S)
    queued = [pool.submit(order.append, f"q{i}") for i in range(4)]
    assert _threads_idle(pool) == (3, 0)
    assert not any(f.done() for f in queued)
    gates[0].set()
    assert held[0].result(WAIT_S) == 0
    done, _ = futures.wait(queued, timeout=WAIT_S)
    assert len(done) == 4 and order == ["q0", "q1", "q2", "q3"]
    assert not held[1].done() and not held[2].done()
    for gate in gates[1:]:
        gate.set()
    assert [f.result(WAIT_S) for f in held] == [0, 1, 2]
    assert pool.counts()["threads"] == 3  # never more than max_workers


def test_at_most_max_running_calls_run_the_others_wait_in_order():
    """max_running 2 of 8 threads: two calls that run (use CPU) hold both places; the next ones wait, in
    arrival order, and the threads that finish take them without more threads being made."""
    pool = HandlerPool(8, max_running=2, stall_ticks=NEVER)
    try:
        stop = threading.Event()
        started = threading.Semaphore(0)

        def spin():
            started.release()
            while not stop.is_set():
                pass
            return threading.current_thread().name

        spinners = [pool.submit(spin) for _ in range(2)]
        for _ in range(2):
            assert started.acquire(timeout=WAIT_S)
        order = []
        queued = [pool.submit(order.append, i) for i in range(5)]
        assert pool.counts() == {"threads": 2, "idle": 0, "running": 2, "waiting": 0, "queued": 5, "resuming": 0}
        stop.set()
        futures.wait(queued + spinners, timeout=WAIT_S)
        assert order == [0, 1, 2, 3, 4]
        assert pool.counts()["threads"] == 2
    finally:
        pool.shutdown(cancel_futures=True)


def test_a_wait_that_says_so_frees_its_place_at_once():
    """max_running 1: a call inside waits.waiting() does not count, so the next call starts at once (the
    monitor is off here); after the wait it counts again."""
    pool = HandlerPool(4, max_running=1, stall_ticks=NEVER)
    try:
        gate, inside = threading.Event(), threading.Event()

        def waits_for_gate():
            with waits.waiting():
                inside.set()
                gate.wait(WAIT_S)
            return "waited"

        waiter = pool.submit(waits_for_gate)
        assert inside.wait(WAIT_S)
        assert pool.submit(lambda: "ran").result(WAIT_S) == "ran"
        assert pool.counts()["waiting"] == 1
        gate.set()
        assert waiter.result(WAIT_S) == "waited"
        _wait_idle(pool, pool.counts()["threads"])
        assert pool.counts()["waiting"] == 0 and pool.counts()["running"] == 0
    finally:
        pool.shutdown(cancel_futures=True)


def test_a_request_stream_waits_for_each_item_as_a_wait():
    """waits.iterate (the error wrapper takes every request stream through it): while the handler waits for
    its client's next message, its place is free."""
    pool = HandlerPool(4, max_running=1, stall_ticks=NEVER)
    try:
        items: queue.Queue = queue.Queue()
        seen = []

        def stream_handler():
            for item in waits.iterate(iter(items.get, None)):
                seen.append(item)
            return seen

        handler = pool.submit(stream_handler)
        _wait_for(lambda: pool.counts()["waiting"] == 1)
        assert pool.submit(lambda: "ran").result(WAIT_S) == "ran"  # while the stream waits for its next item
        for item in ("a", "b", None):
            items.put(item)
        assert handler.result(WAIT_S) == ["a", "b"]
        assert list(waits.iterate([1, 2])) == [1, 2]  # outside a pool: the items as they are
    finally:
        pool.shutdown(cancel_futures=True)


def test_a_stream_handles_its_next_message_once_a_place_is_free_in_arrival_order():
    """max_running 1: a stream handler that got its next message while the place is taken waits for it (it
    still counts as waiting), in line with the calls queued: one queued before the message came runs before
    it, one queued after runs after it."""
    pool = HandlerPool(4, max_running=1, stall_ticks=NEVER)
    try:
        items: queue.Queue = queue.Queue()
        order: list[str] = []
        stop, spinning = threading.Event(), threading.Event()

        def stream_handler():
            for item in waits.iterate(iter(items.get, None)):
                order.append(item)

        def spin():
            spinning.set()
            while not stop.is_set():
                pass

        handler = pool.submit(stream_handler)
        _wait_for(lambda: pool.counts()["waiting"] == 1)
        spinner = pool.submit(spin)
        assert spinning.wait(WAIT_S)
        first = pool.submit(order.append, "queued before")
        items.put("the stream's message")
        _wait_for(lambda: pool.counts()["resuming"] == 1)
        second = pool.submit(order.append, "queued after")
        assert pool.counts() == {"threads": 2, "idle": 0, "running": 2, "waiting": 1, "queued": 2, "resuming": 1}
        assert order == []  # nothing runs while the spinner holds the place
        stop.set()
        futures.wait([spinner, first, second], timeout=WAIT_S)
        _wait_for(lambda: len(order) == 3)
        assert order == ["queued before", "the stream's message", "queued after"]
        items.put(None)
        handler.result(WAIT_S)
        _wait_idle(pool, pool.counts()["threads"])
        assert pool.counts()["resuming"] == 0 and pool.counts()["waiting"] == 0
    finally:
        stop.set()
        items.put(None)
        pool.shutdown(cancel_futures=True)


def test_a_stream_resuming_at_shutdown_goes_on():
    """Shutdown lets a stream thread that waits for a place go on (its call ends as its client ends it)."""
    pool = HandlerPool(4, max_running=1, stall_ticks=NEVER)
    items: queue.Queue = queue.Queue()
    stop, spinning = threading.Event(), threading.Event()
    seen: list[str] = []

    def spin():
        spinning.set()
        while not stop.is_set():
            pass

    handler = pool.submit(lambda: [seen.append(i) for i in waits.iterate(iter(items.get, None))])
    _wait_for(lambda: pool.counts()["waiting"] == 1)
    pool.submit(spin)
    assert spinning.wait(WAIT_S)
    items.put("a")
    _wait_for(lambda: pool.counts()["resuming"] == 1)
    pool.shutdown(wait=False)
    _wait_for(lambda: seen == ["a"])  # went on although the spinner still holds the place
    items.put(None)
    handler.result(WAIT_S)
    stop.set()
    pool.shutdown()


def test_the_monitor_finds_calls_that_wait_without_saying_so():
    """max_running 2: two calls blocked on an event (no CPU, no hint) hold both places; the monitor sees their
    CPU clocks stand still and starts the queued call anyway. Liveness: nothing waits for good behind waits."""
    pool = HandlerPool(8, max_running=2, tick_s=0.005, stall_ticks=2)
    try:
        gate = threading.Event()
        started = threading.Semaphore(0)
        blocked = [pool.submit(lambda: (started.release(), gate.wait(WAIT_S))) for _ in range(2)]
        for _ in range(2):
            assert started.acquire(timeout=WAIT_S)
        assert pool.submit(lambda: "ran").result(WAIT_S) == "ran"
        gate.set()
        futures.wait(blocked, timeout=WAIT_S)
    finally:
        pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("cancel", [False, True])
def test_shutdown_runs_what_is_queued_unless_cancelled(cancel):
    pool = HandlerPool(1, stall_ticks=NEVER)
    gate = threading.Event()
    running = threading.Event()
    first = pool.submit(lambda: (running.set(), gate.wait(WAIT_S)))
    assert running.wait(WAIT_S)
    queued = pool.submit(lambda: "ran")
    stopper = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "cancel_futures": cancel})
    stopper.start()
    with pytest.raises(RuntimeError, match="after shutdown"):
        _submit_when_shut(pool)
    gate.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert first.result(WAIT_S)
    if cancel:
        assert queued.cancelled()
    else:
        assert queued.result(WAIT_S) == "ran"


def test_idle_threads_end_at_shutdown():
    pool = HandlerPool(4)
    for f in [pool.submit(lambda: None) for _ in range(4)]:
        f.result(WAIT_S)
    threads = list(pool._threads)
    pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in threads)


def test_serves_grpc_calls():
    """grpc's sync server runs on it: unary calls answer, and the server stops."""
    pool = HandlerPool(4)
    server = grpc.server(pool)
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request[::-1])})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/test.Echo/Echo")
            for i in range(20):
                assert echo(f"abc{i}".encode(), timeout=WAIT_S) == f"abc{i}".encode()[::-1]
    finally:
        server.stop(None).wait(WAIT_S)
        pool.shutdown(wait=True)


def _wait_for(condition) -> None:
    pause = threading.Event()
    for _ in range(WAIT_S * 100):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError("the condition never held")


def _submit_when_shut(pool: HandlerPool) -> None:
    """Submit once shutdown has begun (the stopper thread sets the flag first)."""
    deadline = threading.Event()
    for _ in range(WAIT_S * 100):
        with pool._lock:
            if pool._shutdown:
                break
        deadline.wait(0.01)
    pool.submit(lambda: None)


def _wait_idle(pool: HandlerPool, idle: int) -> None:
    pause = threading.Event()
    for _ in range(WAIT_S * 100):
        if pool.counts()["idle"] == idle:
            return
        pause.wait(0.01)
    raise AssertionError(f"{pool.counts()} never had {idle} idle")


def _threads_idle(pool: HandlerPool) -> tuple[int, int]:
    counts = pool.counts()
    return counts["threads"], counts["idle"]


def test_a_handler_thread_carries_its_name_as_its_os_thread_name(pool):
    """A thread inherits its creator's OS name (the grpc.aio loop's, which starts the pool's threads): each worker
    names itself, so /proc and top -H tell the handlers' CPU from the loop's (bench/README.md's per-thread split)."""
    assert pool.submit(os_thread_name).result(WAIT_S) == "test-handler_0"
