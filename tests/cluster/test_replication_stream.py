"""The leader pushes its appends to each follower over one connection: concurrent writes share
pushes, a follower that stops reading (SIGSTOP) is not flooded (a window of pushes waits for its
acknowledgements) and takes up the stream where it stopped once it runs again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster, Replica
from txmq.client import AsyncProducer, Message, SendStatus

pytestmark = pytest.mark.slow

TOPIC = "stream"


def commit_log_bytes(r: Replica) -> bytes:
    files = sorted((r.store / "commitlog").iterdir())
    return b"".join(f.read_bytes() for f in files).rstrip(b"\0")


async def follower_state(bc: BrokerCluster, r: Replica) -> dict[str, Any]:
    st = await bc.status(r.addr)
    assert st is not None, f"replica {r.replica} does not answer its status"
    assert st["self"]["role"] == "follower", st["self"]
    return dict(st["self"])


async def send_many(p: AsyncProducer, n: int, tag: str) -> None:
    results = await asyncio.wait_for(
        asyncio.gather(*(p.send(Message(TOPIC, f"{tag}{i}".encode())) for i in range(n))), 60
    )
    assert {r.status for r in results} == {SendStatus.SEND_OK}, [r.status for r in results]


async def test_followers_stream_and_concurrent_writes_share_pushes(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    followers = [r for r in bc.replicas.values() if r is not leader]
    p = AsyncProducer("stream-many", bc.seeds("g1"), request_timeout=15.0)
    await p.start()
    try:
        await p.send(Message(TOPIC, b"warm-up"))
        before = [(await follower_state(bc, f))["fetches"] for f in followers]
        await send_many(p, 400, "m")
        after = [await follower_state(bc, f) for f in followers]
    finally:
        await p.shutdown()
    for f, st in zip(followers, after, strict=True):
        assert st["streaming"] is True, f"replica {f.replica} does not stream: {st}"
    transfers = [st["fetches"] - b for st, b in zip(after, before, strict=True)]
    # 400 writes in flight together: each push carries the appends of a turn of the leader's
    # loop, so there are fewer pushes than writes (idle probes add about 2 a second).
    assert all(0 < t < 400 for t in transfers), (
        f"transfers per follower for 400 writes: {transfers}"
    )

    async def same() -> bool:
        return len({commit_log_bytes(r) for r in bc.replicas.values()}) == 1

    await bc.wait(same, 30, "the three commit logs never became identical")


async def test_a_stopped_follower_takes_up_its_stream_where_it_stopped(make_cluster: Any) -> None:
    # The paused follower stays in the in-sync set for a while (its lag limit is 4 s): the
    # writes made meanwhile wait for it, and are answered once it runs again.
    bc: BrokerCluster = make_cluster(
        settings={"haMaxTimeSlaveNotCatchup": 4000, "syncFlushTimeout": 20000, "etcdLeaseTtl": 10}
    )
    leader = await bc.start_group("g1")
    paused = next(r for r in bc.replicas.values() if r is not leader)
    p = AsyncProducer("stream-paused", bc.seeds("g1"), request_timeout=30.0)
    await p.start()
    try:
        await send_many(p, 50, "a")
        bc.pause("g1", paused.replica)
        try:
            # Writes while it does not read: the leader pushes at most its window and waits.
            pending = asyncio.ensure_future(send_many(p, 200, "b"))
            done, _ = await asyncio.wait({pending}, timeout=1.0)
            assert not done, "writes were acknowledged while an in-sync follower was stopped"
        finally:
            bc.resume("g1", paused.replica)
        await asyncio.wait_for(pending, 30)
        st = await follower_state(bc, paused)
        assert st["streaming"] is True, st
        await send_many(p, 50, "c")
    finally:
        await p.shutdown()
    await bc.wait_in_sync("g1", [0, 1, 2])

    async def same() -> bool:
        return len({commit_log_bytes(r) for r in bc.replicas.values()}) == 1

    await bc.wait(same, 30, "the three commit logs never became identical")
