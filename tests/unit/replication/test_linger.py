"""The leader's replication stream coalesces concurrent SYNC appends (mqstore.replication.leader, module
docstring's *Coalescing*): a caught-up stream woken by new bytes lingers ``replication_linger_us`` while a
SYNC append waits and the last data message gathered two appends or more (or as a probe every PROBE_EVERY
data messages), so the appends written meanwhile go in one data message; a lone producer (one SYNC append
waiting) is never delayed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from mqstore.clock import SystemClock
from mqstore.errors import InvalidArgument
from mqstore.replication import leader
from mqstore.replication.config import MAX_LINGER_US, ReplicationConfig
from mqstore.replication.node import LogGrowth

LONG_S = 30.0  # a wait that must end by a wake long before this
APPEND_BYTES = 10


class FakeLog:
    """The leader's log as the stream reads it: bytes up to ``end``; ``append`` grows it as an append does."""

    def __init__(self, growth: LogGrowth):
        self.end = 0
        self.growth = growth

    def log_end(self) -> int:
        return self.end

    def append(self) -> None:
        self.end += APPEND_BYTES
        self.growth.grew()

    def chunk(self, offset: int) -> tuple[bytes, int]:
        return b"x" * (self.end - offset), self.end


def _session(linger_us: int, waiting: int = 2, peak: int = 1_000):
    """A ReplicaSession on a fake log and in-sync set (the handshake is other tests' business); ``waiting``:
    how many SYNC appends the in-sync set says wait; ``peak``: how many waited at once lately (a linger ends
    once that many wait)."""
    growth = LogGrowth()
    store = FakeLog(growth)
    in_sync = SimpleNamespace(connected=lambda *a: None, disconnected=lambda *a: None, committed=lambda: 0,
                              waiting=lambda: waiting)
    in_sync.waiting_and_peak = lambda: (in_sync.waiting(), peak)
    node = SimpleNamespace(growth=growth, is_leader=True, leadership=SimpleNamespace(epoch=1), in_sync=in_sync,
                           clock=SystemClock(), config=SimpleNamespace(replication_heartbeat_ms=LONG_S * 1000,
                                                                       replication_linger_us=linger_us))
    session = object.__new__(leader.ReplicaSession)
    session.store, session.node, session.position, session.epoch = store, node, 0, 1
    session._gathered, session._unlingered = 0, 0
    session._chunk = lambda: store.chunk(session.position)
    session.hello = SimpleNamespace(replica_id="r", address="a")
    return session, store


def test_a_lone_producer_is_sent_at_once_but_for_a_probe_and_a_gathering_stream_keeps_lingering():
    session, _ = _session(linger_us=1_000)
    decisions = []
    for _ in range(2 * leader.PROBE_EVERY):
        decisions.append(session._linger_s())
        session._gathered = 1  # each data message carried one append
    lingered = [i for i, d in enumerate(decisions) if d]
    assert lingered == [leader.PROBE_EVERY - 1, 2 * leader.PROBE_EVERY - 1]  # the probes only
    assert decisions[lingered[0]] == pytest.approx(0.001)
    session._gathered = 2  # the probe gathered two appends: linger at every wake while that holds
    assert all(session._linger_s() == pytest.approx(0.001) for _ in range(5))


def test_a_lone_producers_append_never_waits_for_a_probe():
    """One waiting SYNC append is a lone producer's: no probe delays it (it used to, every PROBE_EVERY data
    messages); once two wait, the next wake probes."""
    session, _ = _session(linger_us=1_000, waiting=1)
    session._gathered = 1
    assert all(session._linger_s() == 0 for _ in range(3 * leader.PROBE_EVERY))
    session.node.in_sync.waiting = lambda: 2
    assert session._linger_s() == pytest.approx(0.001)


@pytest.mark.parametrize("linger_us, waiting", [(0, 5), (1_000, 0)])
def test_no_linger_when_turned_off_or_when_no_sync_append_waits(linger_us, waiting):
    session, _ = _session(linger_us, waiting)
    session._gathered = 5
    assert all(session._linger_s() == 0 for _ in range(2 * leader.PROBE_EVERY))


def test_appends_written_while_the_stream_lingers_go_in_one_data_message():
    session, log = _session(linger_us=50_000)
    session._unlingered = leader.PROBE_EVERY - 1  # the next wake is a probe
    decide = session._linger_s

    async def main():
        lingering = asyncio.Event()

        def linger_s():
            wait_s = decide()
            if wait_s:
                lingering.set()
            return wait_s

        session._linger_s = linger_s
        stream = session.data_async()
        try:
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # parked on the log's growth
            log.append()
            await asyncio.wait_for(lingering.wait(), LONG_S)
            log.append()  # a second producer's append, written during the linger
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset, len(sent.data)) == (0, 2 * APPEND_BYTES, 2 * APPEND_BYTES)
            assert session._gathered == 2
            lingering.clear()  # it paid: the next wake lingers again
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)
            log.append()
            await asyncio.wait_for(lingering.wait(), LONG_S)
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset) == (2 * APPEND_BYTES, 3 * APPEND_BYTES)
            assert session._gathered == 1  # alone this time: the next wakes send at once until a probe
            assert decide() == 0
        finally:
            await stream.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("linger_us", [-1, MAX_LINGER_US + 1])
def test_a_linger_out_of_bounds_is_refused_naming_the_setting(linger_us):
    with pytest.raises(InvalidArgument, match="replication_linger_us"):
        ReplicationConfig(replication_linger_us=linger_us)


def test_the_flag_and_its_environment_variable_set_the_linger_and_the_help_says_what_it_does():
    from commitlog_service.main import build_arg_parser, parse_config

    assert ReplicationConfig().replication_linger_us == 3_000
    flagged = parse_config(["--data-dir", "d", "--node-id", "n1", "--replication-linger-us", "250"], {})
    assert flagged.replication.replication_linger_us == 250
    from_env = parse_config(["--data-dir", "d", "--node-id", "n1"], {"MQSTORE_REPLICATION_LINGER_US": "0"})
    assert from_env.replication.replication_linger_us == 0
    assert "one data message and one acknowledgement per replica" in " ".join(build_arg_parser().format_help().split())


def test_a_linger_ends_once_as_many_appends_wait_as_waited_at_once_lately():
    """Every producer seen lately has appended: nothing more to gather, the data message goes before the
    setting's time is up (here far longer than the test waits)."""
    session, log = _session(linger_us=int(10 * LONG_S * 1e6), peak=2)
    waiting = [1]
    session.node.in_sync.waiting = lambda: waiting[0]
    session._unlingered = leader.PROBE_EVERY - 1
    session._gathered = 2

    async def main():
        stream = session.data_async()
        try:
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # parked on the log's growth
            waiting[0] = 2
            log.append()  # the first producer's append wakes the stream: two wait, as many as lately at once
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset) == (0, APPEND_BYTES)
            assert session.lingered == 1  # it lingered, and the wait ended on the count, not the time
            waiting[0] = 1
            session._gathered = 2  # as if it had gathered two: the next wake lingers again
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)
            log.append()  # one waits of two lately: the linger waits for the other producer's append
            for _ in range(5):
                await asyncio.sleep(0)
            assert not frame.done()
            waiting[0] = 2
            log.append()
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset) == (APPEND_BYTES, 3 * APPEND_BYTES)
        finally:
            await stream.aclose()

    asyncio.run(main())


# ---- pacing: while no SYNC append waits (the module docstring's *Pacing*) ----------------------------------------

class FakeClock:
    """The stream's monotonic clock, moved by the test only (a pause's timer is asyncio's: LONG_S and more away)."""

    def __init__(self, now_s: float = 1_000.0):
        self.now_s = now_s

    def monotonic_s(self) -> float:
        return self.now_s


def _paced_session(linger_us: int, waiting: int = 0):
    session, log = _session(linger_us, waiting)
    session.node.clock = FakeClock()
    return session, log


@pytest.mark.parametrize("linger_us, waiting, sent_ago_s, paced", [
    (3_000, 0, 0.0012, True),    # sent 1.2 ms ago: wait to the end of the 3 ms slot
    (3_000, 0, 0.003, False),    # quiet for a linger: send at once
    (3_000, 1, 0.001, False),    # a SYNC append waits: the SYNC rule decides, never a pause
    (0, 0, 0.001, False),        # turned off
    (3_000, 0, None, False),     # nothing sent yet
])
def test_a_stream_paces_only_while_no_sync_append_waits_and_it_sent_within_a_linger(linger_us, waiting, sent_ago_s,
                                                                                    paced):
    session, _ = _paced_session(linger_us, waiting)
    clock = session.node.clock
    session._sent_at_s = None if sent_ago_s is None else clock.now_s - sent_ago_s
    pause_s = session._pace_s()
    if paced:
        slot_s = linger_us / 1e6
        assert 0 < pause_s <= slot_s
        slots = (clock.now_s + pause_s) / slot_s
        assert abs(slots - round(slots)) < 1e-6  # it ends at a slot's end
    else:
        assert pause_s == 0


def test_every_replicas_stream_woken_by_one_append_pauses_to_the_same_instant():
    """Slots of the clock, not a linger from each stream's own send: streams that sent at different moments of
    the last slot read at the same end, the same range (the second sends the first's bytes)."""
    first, _ = _paced_session(3_000)
    second, _ = _paced_session(3_000)
    second.node.clock = first.node.clock
    now = first.node.clock.now_s
    first._sent_at_s, second._sent_at_s = now - 0.0025, now - 0.0004
    assert first._pace_s() == pytest.approx(second._pace_s())
    assert first._pace_s() > 0


def test_an_async_stream_under_load_gathers_the_appends_of_a_pause_and_a_sync_append_ends_it():
    session, log = _paced_session(linger_us=int(10 * LONG_S * 1e6))  # a slot far longer than the test waits
    session.node.clock.now_s = 10 * LONG_S * 5 + 1.0  # 1 s into a slot: LONG_S and more to its end
    waiting = [0]
    session.node.in_sync.waiting = lambda: waiting[0]

    async def main():
        stream = session.data_async()
        try:
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # parked on the log's growth
            log.append()  # nothing sent before: at once
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset, session.paced) == (0, APPEND_BYTES, 0)
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)
            log.append()  # within the slot of the last send: a pause
            log.append()
            for _ in range(5):
                await asyncio.sleep(0)
            assert not frame.done() and session.paced == 1
            waiting[0] = 1  # a SYNC append's: it ends the pause, and goes with the two before it
            log.append()
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset) == (APPEND_BYTES, 4 * APPEND_BYTES)
            waiting[0] = 0
            session.node.clock.now_s += 10 * LONG_S  # a linger's quiet: the next append goes at once
            frame = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)
            log.append()
            sent = await asyncio.wait_for(frame, LONG_S)
            assert (sent.offset, sent.next_offset, session.paced) == (4 * APPEND_BYTES, 5 * APPEND_BYTES, 1)
        finally:
            await stream.aclose()

    asyncio.run(main())
