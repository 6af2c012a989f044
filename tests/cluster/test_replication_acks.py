"""How a leader releases the writes waiting for its followers, and how its followers' fetches wait
for new writes: a write is answered once every in-sync follower confirmed it (writes confirmed
together are released together, in any order they waited), one no follower confirms in time is
answered FLUSH_SLAVE_TIMEOUT, a follower's fetch returns as soon as something is appended and
otherwise waits at the leader's end instead of asking again at once."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster, Replica
from tests.support.waiting import wait_until
from txmq.client import AsyncProducer, Message, SendStatus

pytestmark = pytest.mark.slow

TOPIC = "acks"


async def fetch_count(bc: BrokerCluster, r: Replica) -> int:
    st = await bc.status(r.addr)
    assert st is not None, f"replica {r.replica} does not answer its status"
    assert st["self"]["role"] == "follower", st["self"]
    return int(st["self"]["fetches"])


def commit_log_bytes(r: Replica) -> bytes:
    files = sorted((r.store / "commitlog").iterdir())
    return b"".join(f.read_bytes() for f in files).rstrip(b"\0")


async def test_concurrent_sync_sends_are_each_answered_once_replicated(make_cluster: Any) -> None:
    """Under SYNC_FLUSH a write waits for its fsync and then for its followers, so writes reach
    the replication wait out of their log order; every one is answered SEND_OK and the three
    logs end identical."""
    bc: BrokerCluster = make_cluster(flush="SYNC_FLUSH")
    leader = await bc.start_group("g1")
    producers = [AsyncProducer(f"acks-{i}", bc.seeds("g1"), request_timeout=15.0) for i in range(4)]
    for p in producers:
        await p.start()
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(producers[i % 4].send(Message(TOPIC, f"m{i}".encode())) for i in range(400))
            ),
            60,
        )
    finally:
        for p in producers:
            await p.shutdown()
    statuses = {r.status for r in results}
    assert statuses == {SendStatus.SEND_OK}, statuses
    replicas = [r for r in bc.replicas.values()]

    async def same() -> bool:
        return len({commit_log_bytes(r) for r in replicas}) == 1

    await bc.wait(same, 30, "the three commit logs never became identical")
    # Both followers were served, some fetches with the bytes read for the other's: the logs
    # above are identical whichever way a fetch was answered.
    st = await bc.status(leader.addr)
    assert st is not None and st["self"]["role"] == "leader", st
    served, shared = st["self"]["fetchesServed"], st["self"]["chunksShared"]
    assert 0 < shared < served, (served, shared)


async def test_a_write_no_follower_confirms_in_time_is_answered_flush_slave_timeout(
    make_cluster: Any,
) -> None:
    # The follower stays in the in-sync set while paused (its lag limit is longer than the
    # write's wait), so the write waits for it until syncFlushTimeout.
    bc: BrokerCluster = make_cluster(
        groups={"g1": 2},
        settings={"syncFlushTimeout": 1000, "haMaxTimeSlaveNotCatchup": 8000, "etcdLeaseTtl": 10},
    )
    leader = await bc.start_group("g1")
    follower = next(r for r in bc.replicas.values() if r is not leader)
    p = AsyncProducer("acks-timeout", bc.seeds("g1"), retry_times_when_send_failed=0)
    await p.start()
    try:
        ok = await p.send(Message(TOPIC, b"before"), timeout=10.0)
        assert ok.status is SendStatus.SEND_OK
        bc.pause("g1", follower.replica)
        try:
            t0 = time.monotonic()
            late = await p.send(Message(TOPIC, b"unconfirmed"), timeout=10.0)
            took = time.monotonic() - t0
        finally:
            bc.resume("g1", follower.replica)
        assert late.status is SendStatus.FLUSH_SLAVE_TIMEOUT, late
        assert 0.9 <= took < 4.0, f"answered after {took:.2f}s, syncFlushTimeout is 1s"
        again = await p.send(Message(TOPIC, b"after"), timeout=10.0)
        assert again.status is SendStatus.SEND_OK, again
    finally:
        await p.shutdown()


async def test_fetches_wait_at_the_leaders_end_and_wake_on_an_append(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    followers = [r for r in bc.replicas.values() if r is not leader]
    p = AsyncProducer("acks-wake", bc.seeds("g1"), request_timeout=15.0)
    await p.start()
    try:
        await p.send(Message(TOPIC, b"warm-up"))
        # Idle: each fetch waits up to 0.5 s at the leader's end (2 a second, not a spin):
        # two more fetches of each follower take at least one full wait.
        before = [await fetch_count(bc, f) for f in followers]
        t0 = time.monotonic()

        async def two_more_each() -> list[int]:
            now = [await fetch_count(bc, f) for f in followers]
            idle = [a - b for a, b in zip(now, before, strict=True)]
            return idle if all(n >= 2 for n in idle) else []

        idle = await wait_until(two_more_each, 30, "two idle fetches of each follower")
        waited = time.monotonic() - t0
        assert all(n <= 4 * waited + 4 for n in idle), f"fetches in {waited:.2f} s idle: {idle}"
        assert waited >= 0.4, f"{idle} idle fetches in {waited:.2f} s: the fetches spin"
        # An append wakes the parked fetches at once: a send is not answered after the
        # fetch's wait but well before it.
        took = []
        for i in range(15):
            t0 = time.monotonic()
            r = await p.send(Message(TOPIC, f"w{i}".encode()))
            took.append(time.monotonic() - t0)
            assert r.status is SendStatus.SEND_OK
        assert statistics.median(took) < 0.25, f"send latencies (s): {took}"
    finally:
        await p.shutdown()
