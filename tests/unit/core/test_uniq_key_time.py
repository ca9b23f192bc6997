"""The UNIQ_KEY's time part (ms since the start of the month, UTC) with its cached month bounds."""

from __future__ import annotations

import datetime as dt
import random

from mqstore.log import encoder


def _by_datetime(now_ms: int) -> int:
    now = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.timezone.utc)
    return now_ms - int(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)


def test_ms_since_month_start_across_month_boundaries_in_any_order():
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    boundaries = [int(dt.datetime(year, month, 1, tzinfo=dt.timezone.utc).timestamp() * 1000) + delta
                  for year in (1970, 2024, 2026, 2100) for month in range(1, 13) for delta in (-1, 0, 1)]
    times = [t for t in boundaries if t >= 0] + [rng.randrange(4_000_000_000_000) for _ in range(2000)]
    for now_ms in times + sorted(times) + times[::-1]:
        assert encoder._ms_since_month_start(now_ms) == _by_datetime(now_ms), f"{now_ms} (seed {seed})"
