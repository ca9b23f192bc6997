"""The tier's upload quota (mqstore.tier.quota, ``--tier-upload-max-bytes-per-second``) on a fake clock (the waits
move it, nothing sleeps): the bytes granted over any window stay under the quota, time without uploads earns no
burst, the floor lifts the rate with the lag, a stop cuts a wait; and the uploader (mqstore.tier.uploader) on a
real store with a file:// tier: its puts never exceed the quota over a window, and with the log growing four times
faster than the quota the upload lag stays bounded (at about the floor's horizon of growth) where a quota without
the floor lets it grow with the run."""

from __future__ import annotations

import random
import threading

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import InvalidArgument, Unavailable
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.tier.config import TierConfig
from mqstore.tier.ledger import Ledger
from mqstore.tier.quota import UploadQuota
from mqstore.tier.sealed import sealed_segments
from mqstore.tier.uploader import Uploader
from mqstore.tier.urls import open_store
from tests.support.waiting import wait_until

SEGMENT = 16 * 1024


class Timeline:
    """A fake clock the quota's waits move, and every grant as (time it was granted, bytes)."""

    def __init__(self):
        self.clock = FakeClock()
        self.grants: list[tuple[float, int]] = []
        self.moved = lambda: None  # called after each wait (a test's log grows with the time)

    def sleep(self, seconds: float) -> bool:
        self.clock.advance(round(seconds * 1000 + 0.5))  # whole ms, rounded up: never before the start it waits for
        self.moved()
        return False

    def quota(self, bytes_per_second: int, **kwargs) -> UploadQuota:
        quota = UploadQuota(bytes_per_second, clock=self.clock, sleep=self.sleep, **kwargs)
        take = quota.take

        def recorded(size: int) -> None:
            take(size)
            self.grants.append((self.clock.monotonic_s(), size))
        quota.take = recorded
        return quota


def _never_above(grants: list[tuple[float, int]], rate: float) -> None:
    """Every window from one grant to a later one: the bytes granted before its end at most rate x its length (plus
    a ms of it: the fake clock moves in whole ms, so a grant is recorded up to a ms after its start)."""
    for i in range(len(grants)):
        sent = 0
        for j in range(i + 1, len(grants)):
            sent += grants[j - 1][1]
            assert sent <= rate * (grants[j][0] - grants[i][0]) + rate / 1000, (i, j, sent, grants[i], grants[j])


def test_the_bytes_granted_over_any_window_stay_under_the_quota():
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    timeline = Timeline()
    quota = timeline.quota(100_000)
    for _ in range(200):
        if rng.random() < 0.2:
            timeline.clock.advance(rng.randrange(1, 3000))  # a pause between uploads: it earns no burst
        quota.take(rng.randrange(1, 50_000))
    _never_above(timeline.grants, 100_000)
    assert quota.waited_s > 0, f"seed {seed}"


def test_no_quota_never_waits_and_the_floor_lifts_the_rate_with_the_lag():
    timeline = Timeline()
    unlimited = timeline.quota(0)
    for _ in range(10):
        unlimited.take(1 << 30)
    assert timeline.clock.monotonic_s() == 1000.0 and unlimited.longest_s(1 << 30) == 0
    quota = timeline.quota(1000, catch_up_s=10)
    assert quota.rate() == 1000 and quota.longest_s(5000) == 5
    quota.lag_bytes = 50_000  # more than 10 s of the quota behind: the floor, lag / 10 s
    assert quota.rate() == 5000
    quota.take(5000)
    start = timeline.clock.monotonic_s()
    quota.take(5000)
    assert timeline.clock.monotonic_s() - start == pytest.approx(1.0, abs=0.002)  # at the floor's rate, not 5 s


def test_a_stop_cuts_a_wait_for_the_quota():
    quota = UploadQuota(1)  # a byte a second: the second take waits ~1000 s unless stopped
    quota.take(1000)
    failed: list[BaseException] = []

    def second() -> None:
        try:
            quota.take(1)
        except Unavailable as exc:
            failed.append(exc)
    waiting = threading.Thread(target=second)
    waiting.start()
    wait_until(lambda: quota.waited_s > 0, "the second take waiting")
    quota.stop()
    waiting.join(timeout=30)
    assert not waiting.is_alive() and failed and "stopping" in str(failed[0])


def test_the_flag_is_zero_or_more():
    assert TierConfig().tier_upload_max_bytes_per_second == 64 << 20
    with pytest.raises(InvalidArgument, match="tier_upload_max_bytes_per_second"):
        TierConfig(tier_upload_max_bytes_per_second=-1)


# ---- the uploader on a real store ----------------------------------------------------------------------------

@pytest.fixture
def rig(small_config, tmp_path):
    made = []

    def make(quota: UploadQuota):
        # every flush step flushes what was written (no minimum of dirty pages): a segment is sealed soon after its end
        store = build_store(small_config(segment_size_bytes=SEGMENT, flush_min_dirty_pages=0))
        store.start()
        (tmp_path / "tier").mkdir(exist_ok=True)
        tier = open_store(f"file://{tmp_path}/tier", timeout_ms=10_000)
        uploader = Uploader(tier, Ledger.of_store(store), lambda: sealed_segments(store), leader_epoch=lambda: 0,
                            ready=store.replica_view.promoted_visible, log_min=store.log_min, interval_ms=10_000,
                            quota=quota)
        made.append((store, tier))
        return store, uploader
    yield make
    for store, tier in made:
        tier.close()
        store.stop()


def _grow(store, segments: int) -> None:
    """Append until ``segments`` segments are sealed."""
    if "t" not in {t.name for t in store.topic_admin.list()}:
        store.topic_admin.create("t", 1)
    for batch in range(100_000):  # bounded: 4 records of ~1 KiB a batch
        if store.log_end() > segments * SEGMENT:
            break
        store.append("t", [MessageIn(body=bytes([batch % 256]) * 900)] * 4)
    wait_until(lambda: len(sealed_segments(store)) >= segments, f"{segments} segments sealed (flushed on roll)")


def _lag(store, uploader) -> int:
    finished, _ = uploader.ledger.snapshot()
    return sum(s.size for s in sealed_segments(store) if s.base not in finished)


def test_the_uploaders_puts_never_exceed_the_quota_over_a_window(rig):
    timeline = Timeline()
    rate = SEGMENT // 4  # a segment every 4 s
    store, uploader = rig(timeline.quota(rate))
    _grow(store, 6)
    uploader.step()
    sealed = sealed_segments(store)
    assert len(timeline.grants) >= len(sealed) and uploader.uploaded == len(sealed)  # all uploaded, each paced
    assert sum(size for _, size in timeline.grants) == sum(s.size for s in sealed)
    _never_above(timeline.grants, rate)
    elapsed = timeline.grants[-1][0] - timeline.grants[0][0]
    assert elapsed >= (len(sealed) - 1) * SEGMENT / rate - 0.01  # the first goes at once, each next a segment later


@pytest.mark.parametrize("floor", [True, False])
def test_the_upload_lag_stays_bounded_when_the_log_grows_faster_than_the_quota(rig, floor):
    """The log grows a segment a (fake) second, the quota allows a quarter of that: with the floor (lag over
    4 s) the uploads rise to the growth and the lag settles near 4 s of it; without it (a horizon no lag reaches)
    the lag grows with the run. The log grows as the quota's waits move the clock, and between steps."""
    timeline = Timeline()
    horizon_s = 4.0
    quota = timeline.quota(SEGMENT // 4, catch_up_s=horizon_s if floor else 1e12)
    store, uploader = rig(quota)
    began, lags = timeline.clock.monotonic_s(), []

    def grow() -> None:
        _grow(store, 1 + int(timeline.clock.monotonic_s() - began))  # a segment a second
        lags.append(_lag(store, uploader))
    timeline.moved = grow
    while timeline.clock.monotonic_s() - began < 40:
        grow()
        before = timeline.clock.monotonic_s()
        uploader.step()
        if timeline.clock.monotonic_s() == before:
            timeline.clock.advance(1000)  # nothing to wait for: the log's next second
    bound = (horizon_s + 2) * SEGMENT  # the horizon's growth, the segment in flight and the one sealed meanwhile
    if floor:
        assert max(lags) <= bound, lags
        assert uploader.uploaded >= 30  # the uploads kept pace with the 40 segments, not the quota's 10
    else:
        assert lags[-1] > 2 * bound, lags  # the same run without the floor: the lag grows with the run
