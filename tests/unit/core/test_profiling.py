"""mqstore.profiling: MQSTORE_PROFILE_DIR profiles a background duty's thread (and the grpc.aio loop's,
mqstore_rpc.aio.LoopThread) into <dir>/<pid>-<thread>.prof when it ends; unset, nothing is written."""

from __future__ import annotations

import os
import pstats
import threading

from mqstore.background import Duty
from tests.support.threads import os_thread_name

LONG_S = 30.0


class Stepping(Duty):
    def __init__(self):
        super().__init__("profiled-duty", interval_s=0.0)
        self.stepped = threading.Event()

    def step(self) -> None:
        self.stepped.set()
        self.sleep(0.01)


def _run_duty() -> None:
    duty = Stepping()
    duty.start()
    assert duty.stepped.wait(LONG_S)
    assert duty.stop(timeout_s=LONG_S)


def test_a_duty_thread_is_profiled_into_the_directory_named_and_not_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("MQSTORE_PROFILE_DIR", raising=False)
    _run_duty()
    where = tmp_path / "profiles"
    assert not where.exists()

    monkeypatch.setenv("MQSTORE_PROFILE_DIR", str(where))
    _run_duty()
    written = where / f"{os.getpid()}-profiled-duty.prof"
    assert [p.name for p in where.iterdir()] == [written.name]
    functions = {name for (_file, _line, name) in pstats.Stats(str(written)).stats}
    assert "step" in functions



def test_the_cpu_clock_counts_a_threads_cpu_not_its_waits(tmp_path, monkeypatch):
    """MQSTORE_PROFILE_CLOCK=cpu: a thread that sleeps 20 ms (no CPU) shows almost nothing in ``naps``, where
    the wall clock charges it the 20 ms (bench/README.md, *Profiling a server*)."""
    import time

    from mqstore import profiling

    def naps() -> None:
        time.sleep(0.02)

    def naps_s(clock: str) -> float:
        where = tmp_path / clock
        monkeypatch.setenv("MQSTORE_PROFILE_DIR", str(where))
        monkeypatch.setenv("MQSTORE_PROFILE_CLOCK", clock)
        thread = threading.Thread(target=profiling.run, args=(naps,), name="napping")
        thread.start()
        thread.join(LONG_S)
        stats = pstats.Stats(str(where / f"{os.getpid()}-napping.prof")).stats
        return sum(cumtime for (_f, _l, name), (_cc, _nc, _tt, cumtime, _c) in stats.items() if name == "naps")
    assert naps_s("wall") >= 0.019
    assert naps_s("cpu") < 0.01


def test_a_duty_thread_carries_its_name_as_its_os_thread_name(monkeypatch):
    """top -H, /proc and bench/cpu_probe.py tell the store's threads apart (Python 3.11 names them all python)."""
    monkeypatch.delenv("MQSTORE_PROFILE_DIR", raising=False)
    seen: dict[str, str] = {}

    class Naming(Duty):
        def __init__(self, name: str):
            super().__init__(name, interval_s=0.0)
            self.stepped = threading.Event()

        def step(self) -> None:
            seen[self.name] = os_thread_name()
            self.stepped.set()
            self.sleep(0.01)

    for name in ("tier-uploader", "a-duty-named-longer-than-fifteen"):
        duty = Naming(name)
        duty.start()
        assert duty.stepped.wait(LONG_S)
        assert duty.stop(timeout_s=LONG_S)
    assert seen == {"tier-uploader": "tier-uploader", "a-duty-named-longer-than-fifteen": "a-duty-named-lo"}
    assert os_thread_name() != "tier-uploader"  # the caller's own name is left alone


def test_the_tier_executors_threads_carry_their_names():
    """The tier's calls (the uploader's puts: mqstore.tier.objects) run on threads named tier_N, in the OS too."""
    from mqstore.tier.objects import ObjectStore

    store = ObjectStore("file:///unused", _NameProbe(), timeout_ms=30_000, workers=2)
    try:
        assert store.size("k") is None
        assert _NameProbe.names == ["tier_0"]
    finally:
        store.close()


class _NameProbe:
    """A backend whose size() records the OS name of the thread it runs on."""

    names: list[str] = []

    def size(self, key: str) -> int | None:
        _NameProbe.names.append(os_thread_name())
        return None

    def close(self) -> None:
        pass
