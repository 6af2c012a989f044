"""The partition run again, with a sender that writes as a stock producer does: to every
replica's address in turn, so two sends in three reach a follower that forwards them to the
leader.  The history checker must find nothing: a forwarded send is an ordinary request to the
leader of the moment, fenced like any other, and a follower that cannot forward refuses
without storing.  Needs root (namespaces, iptables); skipped otherwise."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cluster import BrokerCluster
from tests.support.history import History
from tests.support.netns import Network
from tests.support.partitions import (
    GROUP,
    TOPIC,
    Workload,
    built_network,
    nemesis_run,
)
from tests.support.raw import RawClient
from txmq.protocol.codes import ResponseCode
from txmq.protocol.errors import TxmqError

pytestmark = pytest.mark.slow


@pytest.fixture
def net() -> Iterator[Network]:
    with built_network("w") as n:
        yield n


@dataclass
class ForwardingWorkload(Workload):
    """The usual workload plus one sender that round-robins over the replicas' addresses."""

    addresses: tuple[str, ...] = ()

    async def start(self) -> None:
        await super().start()
        self.tasks.append(asyncio.get_running_loop().create_task(self._replica_send_loop()))

    async def _replica_send_loop(self) -> None:
        clients: dict[str, RawClient] = {}
        try:
            for i in itertools.count():
                if self.stop.is_set():
                    return
                addr = self.addresses[i % len(self.addresses)]
                mid = f"f-{i}"
                inv = self.history.invoke("f0", "send", mid)
                try:
                    c = clients.get(addr)
                    if c is None or c.conn.closed:
                        c = clients[addr] = await RawClient.connect(addr)
                    resp = await c.send(TOPIC, mid.encode(), queue_id=i % 4)
                except (TxmqError, OSError) as exc:
                    # no answer: the request may have been stored
                    self.history.info(inv, f"{type(exc).__name__}: {exc}")
                    clients.pop(addr, None)
                    await asyncio.sleep(0.1)
                    continue
                if resp.code == ResponseCode.SUCCESS:
                    self.history.ok(inv)
                    await asyncio.sleep(self.pace)
                elif "is a follower" in (resp.remark or ""):
                    # refused before anything reached a leader: certainly not stored
                    self.history.complete(inv, "fail", error=resp.remark or "")
                    await asyncio.sleep(0.1)
                else:
                    self.history.info(inv, f"{resp.code}: {resp.remark}")
                    await asyncio.sleep(0.1)
        finally:
            for c in clients.values():
                c.conn.close()


async def test_forwarded_sends_under_partitions_kills_and_pauses_lose_nothing(
    net: Network, tmp_path: Path
) -> None:
    t0 = time.monotonic()

    def workload(h: History, bc: BrokerCluster) -> Workload:
        addresses = tuple(r.addr for r in bc.replicas.values())
        return ForwardingWorkload(h, bc.seeds(GROUP), addresses=addresses)

    history, work, result, _events = await nemesis_run(net, tmp_path, workload)
    forwarded_ok = sum(
        1 for op in history.ops if op.type == "ok" and op.f == "send" and op.process == "f0"
    )
    print(f"{time.monotonic() - t0:.0f}s: {result.stats}, replica sender ok: {forwarded_ok}")
    where = f"history: {tmp_path / 'history.jsonl'}, logs: {tmp_path / 'logs'}"
    assert result.valid, f"{result.report()}\n{where}"
    assert not work.errors, work.errors
    st = result.stats
    assert st["sends_ok"] >= 200 and st["consumed"] > 0, st
    # two thirds of the replica sender's sends went through a follower
    assert forwarded_ok >= 60, f"only {forwarded_ok} sends through the replicas were acknowledged"
