"""FileTable (mqstore.index.table): the index's files and quarantined ranges behind public methods, as
IndexStore.files() hands it to the lifecycle and query modules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mqstore.index import files as F
from mqstore.index.table import FileTable
from mqstore.errors import InvariantViolation, NotFound


@dataclass
class FakeHandle:
    first_phy_offset: int
    end_phy_offset: int
    sealed: bool = True

    def info(self) -> F.FileInfo:  # store time: one second per 100 bytes of log
        return F.FileInfo(self.first_phy_offset, F.UNSEALED, F.LOCAL, self.first_phy_offset * 10,
                          self.end_phy_offset * 10, self.first_phy_offset, self.end_phy_offset, 1)


def table() -> FileTable:
    return FileTable({0: FakeHandle(0, 90), 100: FakeHandle(100, 190), 400: FakeHandle(400, 450)}, {200: 400})


def test_maintenance_never_picks_the_newest_file():
    t = table()
    assert t.oldest_matching(lambda h: h.sealed).first_phy_offset == 0
    assert t.oldest_matching(lambda h: h.first_phy_offset >= 400) is None
    replacement = FakeHandle(0, 90)
    t.replace(t.get(0), replacement)
    assert t.get(0) is replacement
    with pytest.raises(InvariantViolation):
        t.replace(FakeHandle(100, 190), replacement)  # not the handle the table holds: changed meanwhile


def test_retention_stops_at_the_first_file_still_needed_and_drops_ranges_gone():
    t = table()
    victims, expired = t.remove_before(150)
    assert [h.first_phy_offset for h in victims] == [0] and expired == [] and len(t) == 2
    victims, expired = t.remove_before(10_000)
    assert [h.first_phy_offset for h in victims] == [100] and expired == [(200, 400)]
    assert [h.first_phy_offset for h in t.newest_first()] == [400]  # the newest stays


def test_a_rebuild_installs_its_files_and_closes_the_range():
    t = table()
    [rng] = t.rebuild_ranges()
    assert (rng.start_physical_offset, rng.end_physical_offset) == (200, 400)
    assert (rng.begin_timestamp_ms, rng.end_timestamp_ms) == (1900, 4000)  # the neighbours' times
    assert t.blocking_range(3000, 3500, None) == rng and t.blocking_range(4100, 5000, None) is None
    assert t.blocking_range(3000, 3500, before_phy=200) is None  # the page is past it already
    rebuilt = FakeHandle(200, 390)
    t.add_rebuild_file(200, rebuilt)
    assert t.rebuild_files(200) == [rebuilt] and t.get(200) is None
    assert t.install_rebuilt(200) == [rebuilt]
    assert t.get(200) is rebuilt and t.rebuild_ranges() == []
    with pytest.raises(NotFound):
        t.damaged_end(200)
    assert len(t.take_all()) == 4 and len(t) == 0
