"""Network partitions, kills and pauses under load, checked over the whole history.

Three etcd members and a broker group of three replicas, each in its own network namespace on
a private bridge, the clients in another.  Producers send and transact, a consumer reads, while
a nemesis cuts the leader off from its followers (not from etcd), from etcd (not from its
followers), cuts a follower off, flaps, drops and delays one way, kills and pauses the leader.
After the last heal everything stored is read back and the checker
(:mod:`tests.support.history`) looks for lost acknowledged writes, messages read that were
never sent or rolled back, partly visible transactions, duplicates and two leaders in one
epoch.  Needs root (namespaces, iptables); skipped otherwise."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import netns
from tests.support.cluster import first_send_after, send_before
from tests.support.netns import Network
from tests.support.partitions import (
    BROKERS,
    CLIENT,
    ETCD,
    GROUP,
    TOPIC,
    Workload,
    build,
    built_network,
    commit_log_bytes,
    group_in_namespaces,
    nemesis_run,
)
from tests.support.raw import connected
from tests.support.waiting import wait_until
from txmq.client import AsyncProducer
from txmq.protocol.codes import ResponseCode

pytestmark = pytest.mark.slow


@pytest.fixture
def net() -> Iterator[Network]:
    with built_network("p") as n:
        yield n


def reaches(n: Network, src: str, dst: str) -> bool:
    """A TCP connection from ``src`` to port 7000 of ``dst`` opens within a second."""
    with netns.entered(n.nodes[src].ns):
        try:
            socket.create_connection((n.ip(dst), 7000), timeout=1.0).close()
        except OSError:
            return False
    return True


def test_leftovers_of_a_dead_run_are_removed() -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"network partition tests need namespaces: {why}")
    dead = f"{netns.NAME_PREFIX}z999999999-hub"  # above any pid_max: that run is gone
    netns.run("ip", "netns", "add", dead)
    try:
        assert dead in netns.remove_leftovers()
        assert dead not in netns.run("ip", "netns", "list").split()
    finally:
        netns.run("ip", "netns", "del", dead, check=False)


def test_network_is_private_and_torn_down(tmp_path: Path) -> None:
    """The namespaces exist only during the run, and the host keeps its own interfaces."""
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"network partition tests need namespaces: {why}")

    def host_links() -> set[str]:
        return {
            line.split(":")[1].strip().split("@")[0]
            for line in netns.run("ip", "-o", "link").splitlines()
        }

    before = host_links()
    with netns.network("u") as n:
        build(n)
        names = set(netns.run("ip", "netns", "list").split())
        assert {node.ns for node in n.nodes.values()} | {n.hub} <= names
        ours = {"br0", "eth0"} | {f"v-{name}" for name in n.nodes}
        assert not (host_links() - before) & ours, "an interface was made on the host"
        with netns.entered(n.nodes["b1"].ns):
            server = socket.create_server((n.ip("b1"), 7000))
        try:
            assert reaches(n, "b0", "b1")
            n.cut("b0", "b1")
            assert "-s 10.213.0.21/32 -j DROP" in n.rules("b0")
            assert not reaches(n, "b0", "b1") and reaches(n, "b2", "b1")
            n.heal()
            assert "DROP" not in n.rules("b0") and reaches(n, "b0", "b1")
            n.one_way_cut("b1", "b0")  # b0's SYN arrives, the answer does not
            assert not reaches(n, "b0", "b1")
            n.heal()
        finally:
            server.close()
    left = [x for x in netns.run("ip", "netns", "list").split() if x.startswith(n.prefix)]
    assert not left, f"namespaces left after teardown: {left}"
    assert not (host_links() - before) & ours, "an interface was left on the host"


async def test_partitions_kills_and_pauses_lose_nothing(net: Network, tmp_path: Path) -> None:
    t0 = time.monotonic()
    _history, work, result, events = await nemesis_run(
        net, tmp_path, lambda h, bc: Workload(h, bc.seeds(GROUP))
    )
    print(f"{time.monotonic() - t0:.0f}s: {result.stats}")
    where = f"history: {tmp_path / 'history.jsonl'}, logs: {tmp_path / 'logs'}"
    assert result.valid, f"{result.report()}\n{where}"
    assert not work.errors, work.errors
    # The run did something: a checker over an empty history cannot fail.
    st = result.stats
    assert st["sends_ok"] >= 200 and st["txns_committed_ok"] >= 20, st
    assert st["consumed"] > 0 and st["stored"] >= st["sends_ok"], st
    assert len({e["epoch"] for e in events}) >= 4, "too few elections for the faults"


async def test_a_message_a_consumer_read_survives_its_leaders_fall(
    net: Network, tmp_path: Path
) -> None:
    """The leader is cut off from its followers and from etcd, not from the clients: a send is
    stored on it but never acknowledged; a consumer pulling from it must not be handed that
    message unless the group keeps it."""
    async with group_in_namespaces(net, tmp_path) as (_etcd, bc):
        old = await bc.wait_leader(GROUP)
        async with connected(old.addr) as c:
            assert (await c.send(TOPIC, b"before")).code == ResponseCode.SUCCESS
            for n in ETCD + BROKERS:
                if n != bc.node(old.replica):
                    net.cut(bc.node(old.replica), n)
            sending = asyncio.ensure_future(c.send(TOPIC, b"unreplicated"))
            stored_on = next(r for r in bc.replicas.values() if r.replica == old.replica)
            await wait_until(
                lambda: b"unreplicated" in commit_log_bytes(stored_on),
                10,
                "the old leader storing the send it cannot replicate",
            )
            _, msgs = await c.pull(TOPIC, 0, 0)
            served = b"unreplicated" in [m.body for m in msgs]
            await bc.wait_leader(GROUP, not_replica=old.replica, timeout=30)
            net.heal()
            try:
                acked = (await asyncio.wait_for(sending, 15)).code == ResponseCode.SUCCESS
            except Exception:
                acked = False
        assert not acked, "a leader cut off from its followers and etcd acknowledged a write"
        await bc.wait_in_sync(GROUP, [0, 1, 2], timeout=60)
        leader = await bc.wait_leader(GROUP)
        async with connected(leader.addr) as reader:
            bodies = [m.body for m in await reader.pull_all(TOPIC)]
        assert b"before" in bodies
        assert not served, (
            "the old leader handed a consumer a message none of its in-sync replicas had"
        )


#: Seconds from a leader's host losing its link to the first send the SDK has acknowledged by
#: the new leader.  The goal is 2 s (``bench/failover.py --fault stop`` measures the same path,
#: a silent leader, at about 1.5 s); the bound leaves room for a loaded CI machine, and stays
#: well below the lease: only the followers' revocation of a silent leader's lease can meet it.
CUT_BOUND_S = 4.5
#: The lease of this test, longer than the bound.
CUT_LEASE_TTL = 10


async def test_a_leader_cut_off_from_everything_is_replaced_within_seconds(
    net: Network, tmp_path: Path
) -> None:
    """The leader's host loses its link (cut from etcd, its followers and the clients): its
    followers' probes time out, they say so in etcd and revoke its lease once etcd shows it
    unrenewed for a second; the SDK, its send unanswered, asks the other replicas, finds the
    new leader and sends there.  After the heal the old leader rejoins as a follower and
    every acknowledged send is on the new leader."""
    settings = {"etcdLeaseTtl": CUT_LEASE_TTL}
    async with group_in_namespaces(net, tmp_path, settings) as (_etcd, bc):
        old = await bc.wait_leader(GROUP)
        node = bc.node(old.replica)
        p = AsyncProducer("cut-off", bc.seeds(GROUP), request_timeout=30.0)
        await p.start()
        acked: list[bytes] = []
        errors: list[str] = []
        try:
            acked += await send_before(p, TOPIC)
            t0 = time.monotonic()
            net.isolate(node, [*ETCD, *BROKERS, CLIENT])
            took = await first_send_after(p, TOPIC, t0, errors)
            acked.append(b"after")
        finally:
            await p.shutdown()
        print(f"leader cut off: first acknowledged send {took:.2f} s after the cut")
        assert took < CUT_BOUND_S, (
            f"first acknowledged send {took:.2f} s after the leader was cut off (bound "
            f"{CUT_BOUND_S} s); errors meanwhile: {errors[-3:]}\n{bc.log_tail()}"
        )
        new = await bc.wait_leader(GROUP, not_replica=old.replica, timeout=10)
        revoked = [
            e
            for r in bc.replicas.values()
            if r.replica != old.replica
            for e in bc.events(GROUP, r.replica, "leader_lease_revoked")
        ]
        assert revoked and all(e["silent"] for e in revoked), revoked
        net.heal()
        await bc.wait_rejoined(GROUP, new.replica, old.replica, timeout=90)
        async with connected(new.addr) as reader:
            bodies = {m.body for m in await reader.pull_all(TOPIC)}
        missing = [b for b in acked if b not in bodies]
        assert not missing, f"acknowledged sends missing on the new leader: {missing}"
