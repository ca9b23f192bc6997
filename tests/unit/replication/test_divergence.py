"""The truncation point (mqstore.replication.divergence) against a model: logs built as lists of
(epoch, byte) per offset by a random history of elections and appends; the point must be the length of
the longest common prefix of the two logs, computed from the epoch histories alone."""

from __future__ import annotations

import random

import pytest

from mqstore.replication.divergence import truncation_point
from mqstore.replication.epochs import EpochHistory


def _history(log: list[tuple[int, int]]) -> EpochHistory:
    h = EpochHistory()
    for offset, (epoch, _) in enumerate(log):
        if epoch and (offset == 0 or log[offset - 1][0] != epoch):
            h = h.with_entry(epoch, offset)
    return h


def _common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _simulate(rng: random.Random, nodes: int, steps: int):
    """Every node's log after random elections (a new epoch each time, the leader chosen among the nodes
    holding the longest log of the newest epoch they share, as an in-sync election does, or any node for
    an unclean one) and appends (a leader writes bytes; some replicas copy a prefix of the leader)."""
    logs = [[] for _ in range(nodes)]
    leader, epoch = 0, 0
    for _ in range(steps):
        if rng.random() < 0.3:
            epoch += 1
            leader = rng.randrange(nodes)
            for i in range(nodes):  # replicas truncate to the shared prefix, then copy (maybe not all)
                if i != leader:
                    keep = _common_prefix(logs[i], logs[leader])
                    logs[i] = logs[i][:keep]
        new = [(epoch, rng.randrange(256)) for _ in range(rng.randrange(1, 5))]
        logs[leader].extend(new)
        for i in range(nodes):
            if i != leader and rng.random() < 0.6 and _common_prefix(logs[i], logs[leader]) == len(logs[i]):
                logs[i] = list(logs[leader][:rng.randrange(len(logs[i]), len(logs[leader]) + 1)])
    return logs


@pytest.mark.parametrize("seed", range(300))
def test_truncation_point_is_the_common_prefix(seed):
    print("seed", seed)
    rng = random.Random(seed)
    logs = _simulate(rng, rng.randrange(2, 5), rng.randrange(1, 30))
    for a in logs:
        for b in logs:
            point = truncation_point(_history(a), len(a), _history(b), len(b))
            assert point == _common_prefix(a, b), (a, b)


def test_fresh_replica_and_pre_epoch_bytes():
    leader = EpochHistory().with_entry(1, 100)
    assert truncation_point(EpochHistory(), 0, leader, 500) == 0
    assert truncation_point(EpochHistory(), 150, leader, 500) == 100  # epoch-0 bytes end where epoch 1 began
    assert truncation_point(EpochHistory(), 80, leader, 500) == 80
