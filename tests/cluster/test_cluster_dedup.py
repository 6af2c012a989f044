"""Idempotent sends in a replicated group: the duplicate window is part of what is replicated
(it is a view of the commit log), so a resend after a failover, or a retry of a send a leader
stored but could not acknowledge while its etcd lease was in doubt, is stored once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster
from tests.support.etcd import EtcdCluster
from tests.support.raw import RawClient, connected
from txmq.client import AsyncProducer, Message
from txmq.protocol.errors import TxmqError
from txmq.protocol.message import MessageConst

pytestmark = pytest.mark.slow

TOPIC = "orders"


async def _bodies(addr: str) -> list[bytes]:
    async with connected(addr) as c:
        return [m.body for m in await c.pull_all(TOPIC, 4)]


async def test_a_resend_after_a_failover_is_answered_by_the_new_leader(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    old = await bc.start_group("g1")
    props = {MessageConst.UNIQ_KEY: "0A00000100002222000000000000ABCD"}
    c = await RawClient.connect(old.addr)
    first = RawClient.send_header(await c.send(TOPIC, b"once", props=props))
    await c.close()
    bc.kill("g1", old.replica)
    new = await bc.wait_leader("g1", not_replica=old.replica)
    async with connected(new.addr) as c:
        again = RawClient.send_header(await c.send(TOPIC, b"once", props=props, queue_id=3))
    assert (again.msg_id, again.queue_id, again.queue_offset) == (
        first.msg_id,
        first.queue_id,
        first.queue_offset,
    ), "the new leader did not answer the resend with the first send's result"
    assert await _bodies(new.addr) == [b"once"]


async def test_retries_while_the_leaders_lease_is_in_doubt_store_each_message_once(
    make_cluster: Any, etcd: EtcdCluster
) -> None:
    """etcd stops answering (every member SIGSTOPped) longer than the lease: the leader stores
    and replicates sends it may not acknowledge (code 14), then loses its lease; the SDK's
    retries of those sends -- to it or to the next leader -- must find the stored copies."""
    bc: BrokerCluster = make_cluster()
    await bc.start_group("g1")
    p = AsyncProducer("doubt", bc.seeds("g1"), request_timeout=8.0)
    await p.start()
    acked: list[bytes] = []
    failed: list[str] = []
    stop = asyncio.Event()

    async def load() -> None:
        i = 0
        while not stop.is_set():
            body = f"d-{i}".encode()
            i += 1
            try:
                await p.send(Message(TOPIC, body))
                acked.append(body)
            except TxmqError as exc:
                failed.append(f"{body.decode()}: {exc}")
                await asyncio.sleep(0.05)

    task = asyncio.ensure_future(load())
    try:
        await bc.wait(lambda: _true(len(acked) >= 20), 30, "20 sends before etcd stops")
        live = [m for m in etcd.members if m.proc is not None and m.proc.poll() is None]
        for m in live:
            assert m.proc is not None
            os.kill(m.proc.pid, signal.SIGSTOP)
        try:
            # etcd unreachable for longer than the lease (etcdLeaseTtl 3 s): the leader's
            # lease is in doubt from 2.5 s on, while the load goes on.
            await asyncio.sleep(3.5)
        finally:
            for m in live:
                assert m.proc is not None
                os.kill(m.proc.pid, signal.SIGCONT)
        n = len(acked)
        await bc.wait(lambda: _true(len(acked) >= n + 20), 60, "20 more sends after etcd is back")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await p.shutdown()
    leader = await bc.wait_leader("g1")
    refused = [
        e
        for (g, rid) in bc.replicas
        for e in bc.events(g, rid, "request_failed")
        if e.get("response_code") == 14
    ]
    assert refused, "no send was refused for a lease in doubt: the test did not test the path"
    counts = Counter(await _bodies(leader.addr))
    twice = sorted(b.decode() for b, k in counts.items() if k > 1)
    assert not twice, f"stored more than once: {twice[:10]} (failed sends: {failed[:5]})"
    missing = [b for b in acked if b not in counts]
    assert not missing, f"{len(missing)} acknowledged sends lost: {missing[:5]}"


async def _true(value: bool) -> bool:
    return value
