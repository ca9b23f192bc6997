"""The timer (mqstore.timer) under kill -9 of a real commit log process: delayed messages (some longer than the
wheel, so they roll) are sent while others come due, the process is killed at a random point of the deliveries,
once left down longer than the whole wheel, and restarted; in the end every acknowledged delayed message is in its
topic exactly once, none before its time. A small wheel (16 slots of 100 ms: 1.6 s) keeps it cheap;
MQSTORE_TIMER_KILL_CYCLES runs more cycles (hundreds for a long run), the seed is printed (MQSTORE_SEED)."""

from __future__ import annotations

import os
import random
import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]

TIMER = ("--timer-precision-ms", "100", "--timer-wheel-slots", "16", "--timer-checkpoint-interval-ms", "200")
SPAN_S = 1.6
T = 10


def _delivered(stub) -> list:
    out, offset = [], 0
    while True:
        got = stub.Pull(pb.PullRequest(topic="delayed", queue_id=0, offset=offset, max_messages=1000), timeout=T)
        if not got.messages:
            return out
        out.extend(got.messages)
        offset = got.next_offset


def _send(stub, rnd: random.Random, count: int) -> list[str]:
    """Delayed messages (0..4 s: longer than the wheel rolls); the uniq keys acknowledged."""
    keys = []
    for _ in range(count):
        batch = [common_pb2.MessageInput(body=b"d", delay_ms=rnd.randint(1, 4_000)) for _ in range(rnd.randint(1, 5))]
        try:
            keys += [r.uniq_key for r in stub.Append(pb.AppendRequest(topic="delayed", messages=batch),
                                                     timeout=T).results]
        except grpc.RpcError:  # the process is being killed: not acknowledged
            break
    return keys


def test_every_delayed_message_is_delivered_once_and_never_early_across_kill9(tmp_path):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    cycles = int(os.environ.get("MQSTORE_TIMER_KILL_CYCLES", "3"))
    print(f"seed {seed}")
    rnd = random.Random(seed)
    data = tmp_path / "data"
    sent: list[str] = []
    for cycle in range(cycles):
        with commitlog(data, *TIMER).started() as server, grpc.insecure_channel(server.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            if cycle == 0:
                stub.CreateTopic(pb.CreateTopicRequest(name="delayed", queue_count=1), timeout=T)
            sent += _send(stub, rnd, rnd.randint(20, 60))
            have = len(_delivered(stub))
            target = have + rnd.randint(1, max(1, (len(sent) - have) // 2))
            wait_until(lambda stub=stub, target=target: len(_delivered(stub)) >= target, "deliveries before the kill",
                       timeout_s=30)
            server.kill9()
        if cycle == 1:  # down longer than the whole wheel: nothing may be skipped
            down_until = time.monotonic() + 2 * SPAN_S
            wait_until(lambda until=down_until: time.monotonic() >= until, "the downtime", timeout_s=10)
    with commitlog(data, *TIMER).started() as server, grpc.insecure_channel(server.address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        wait_until(lambda: {m.uniq_key for m in _delivered(stub)} >= set(sent), "every delayed message delivered",
                   timeout_s=60)
        copies = _delivered(stub)
    keys = [m.uniq_key for m in copies]
    assert len(keys) == len(set(keys)), f"delivered twice: {sorted(k for k in set(keys) if keys.count(k) > 1)[:5]}"
    assert set(keys) == set(sent)
    for m in copies:
        due = int(m.properties["TIMER_DELIVER_MS"])
        assert m.store_timestamp_ms >= due and int(m.properties["TIMER_DEQUEUE_MS"]) >= due, f"{m.uniq_key} early"
