"""The Transaction service's follower holds the commit log's retention below its position and stops at a
gap (records deleted before they were applied: a COMMIT record missed would let a transaction be committed
twice), never skipping it as it did."""

from __future__ import annotations

from mqstore.errors import OutOfRange
from mqstore.follow import FollowConfig, GapPolicy
from mqstore.txn.table import TxnTable
from tests.support.waiting import wait_until
from txn_service.main import HOLD_NAME, RemoteTxnLog, txn_follower


class GoneLog:
    """A commit log whose retention deleted [500, 4096) before the service applied it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def tail(self, start, *, max_frame_bytes, heartbeat_ms, topics=(), tx_types=(), linger_ms=0,
             hold_retention_as=""):
        self.calls.append((start, hold_retention_as))
        raise OutOfRange("gone", min_value=4096, max_value=9000)


def test_the_follower_holds_retention_and_stops_at_a_gap():
    table = TxnTable(resolved_keep=10)
    table.set_applied(500, 500)
    log = GoneLog()
    follower = txn_follower(table, RemoteTxnLog(log, "", linger_ms=0), FollowConfig(backoff_initial_ms=5,
                                                                                 backoff_max_ms=20))
    assert follower.gap_policy is GapPolicy.STOP
    follower.start()
    try:
        wait_until(lambda: follower.state().gap is not None, "the follower to stop at the gap")
        assert "cannot be rebuilt" in follower.problem()  # health NOT_SERVING, Stats' problem
        assert table.applied == 500 and log.calls[0] == (500, HOLD_NAME)  # not moved past the gap
    finally:
        follower.stop()
