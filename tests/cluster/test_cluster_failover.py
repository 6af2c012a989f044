"""A broker group of three replicas over three etcd members: leader kills during SYNC sends and
transactions, a paused leader, an empty follower, etcd member kills.  Every process is real."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sized
from pathlib import Path
from typing import Any

import pytest

from tests.support.acl_files import write_acl
from tests.support.cluster import CLUSTER_ACL_FILE, BrokerCluster, Replica, enforced_tls
from tests.support.etcd import EtcdCluster, etcd_binary
from tests.support.raw import RawClient, connected
from txmq.client import (
    AsyncProducer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionListener,
)
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import TxmqError

pytestmark = pytest.mark.slow

TOPIC = "orders"


async def stored_bodies(addr: str, topic: str = TOPIC, queues: int = 4) -> list[bytes]:
    async with connected(addr) as c:
        return [m.body for m in await c.pull_all(topic, queues)]


def grew(items: Sized, by: int) -> Callable[[], Awaitable[bool]]:
    """A predicate: ``items`` has grown by ``by`` since now."""
    target = len(items) + by

    async def check() -> bool:
        return len(items) >= target

    return check


def same_logs(*replicas: Replica) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len({commit_log_bytes(r) for r in replicas}) == 1

    return check


async def send_range(p: AsyncProducer, prefix: str, ids: range) -> None:
    """Send ``<prefix>-<i>`` for each ``i``, each acknowledged before the next."""
    for i in ids:
        await p.send(Message(TOPIC, f"{prefix}-{i}".encode()))


def text(body: bytes | str) -> str:
    return body.decode() if isinstance(body, bytes) else body


def commit_log_bytes(r: Replica) -> bytes:
    files = sorted((r.store / "commitlog").iterdir())
    return b"".join(f.read_bytes() for f in files).rstrip(b"\0")


async def send_load(
    seeds: str, acked: list[bytes], stop: asyncio.Event, worker: int, failures: list[str]
) -> None:
    """SYNC sends, each body sent once (no SDK retries: a retried send could store a body that
    was not acknowledged twice); a failed send is counted and the next body tried."""
    p = AsyncProducer(f"load-{worker}", seeds, retry_times_when_send_failed=0, request_timeout=8.0)
    await p.start()
    try:
        i = 0
        while not stop.is_set():
            body = f"w{worker}-{i}".encode()
            i += 1
            try:
                await p.send(Message(TOPIC, body))
            except TxmqError as exc:
                failures.append(str(exc))
                await asyncio.sleep(0.05)
                continue
            acked.append(body)
    finally:
        await p.shutdown()


async def test_sync_sends_survive_leader_kills(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    acked: list[bytes] = []
    failures: list[str] = []
    stop = asyncio.Event()
    workers = [
        asyncio.ensure_future(send_load(bc.seeds("g1"), acked, stop, w, failures)) for w in range(3)
    ]
    try:
        failovers = []
        for _round in range(2):
            await bc.wait(grew(acked, 100), 60, "sends go on")
            t0 = time.monotonic()
            resumed = grew(acked, 5)
            bc.kill("g1", leader.replica)
            await bc.wait(resumed, 30, "sends resume")
            failovers.append(time.monotonic() - t0)
            old = leader
            leader = await bc.wait_leader("g1", not_replica=old.replica)
            bc.start("g1", old.replica)  # back as a follower
            await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    assert max(failovers) < 10.0, f"a new leader took {failovers} s to acknowledge a write"
    got = await stored_bodies(leader.addr)
    dupes = {b for b in got if got.count(b) > 1}
    assert not dupes, f"{len(dupes)} messages stored twice"
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"
    # Every replica holds the same bytes at the same offsets.
    await bc.wait(same_logs(*bc.replicas.values()), 30, "replica commit logs identical")


class Oracle(TransactionListener):
    """Decides each transaction at random, remembers it, answers check-backs from memory."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.decided: dict[str, LocalTransactionState] = {}
        self.checks = 0

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        key = text(message.body)
        outcome = self.rnd.choice(
            [LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE]
        )
        self.decided[key] = outcome
        if self.rnd.random() < 0.3:
            return LocalTransactionState.UNKNOW  # left to the check-back
        return outcome

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checks += 1
        return self.decided.get(text(message.body), LocalTransactionState.ROLLBACK_MESSAGE)


async def test_transactions_survive_leader_kills(make_cluster: Any) -> None:
    """Halves pending, decisions in flight, check-backs due: the leader is killed twice; in the
    end every transaction the producer decided is resolved exactly as decided, once."""
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    oracle = Oracle(7)
    producer = AsyncTransactionProducer(
        "tx-oracle", oracle, bc.seeds("g1"), retry_times_when_send_failed=0, request_timeout=8.0
    )
    await producer.start()
    sent = 0
    stop = asyncio.Event()

    async def load() -> None:
        nonlocal sent
        while not stop.is_set():
            body = f"tx-{sent}".encode()
            sent += 1
            try:
                await producer.send_message_in_transaction(Message(TOPIC, body))
            except TxmqError:
                await asyncio.sleep(0.05)  # the half or the decision failed: checks resolve it

    task = asyncio.ensure_future(load())
    try:
        for _round in range(2):
            await bc.wait(grew(oracle.decided, 60), 60, "transactions")
            bc.kill("g1", leader.replica)
            old = leader
            leader = await bc.wait_leader("g1", not_replica=old.replica)
            bc.start("g1", old.replica)
        await bc.wait(grew(oracle.decided, 30), 60, "transactions after")
    finally:
        stop.set()
        await task

    async def resolved() -> bool:
        st = await bc.status(leader.addr)
        if st is None:
            return False
        async with connected(leader.addr) as c:
            resp = await c.call(RequestCode.TXMQ_LIST_TRANSACTIONS, {"state": "PENDING"})
        return resp.code == ResponseCode.SUCCESS and resp.body in (b"[]", b"")

    await bc.wait(resolved, 60, "every pending transaction resolved by check-back")
    got = await stored_bodies(leader.addr)
    committed = {k for k, v in oracle.decided.items() if v is LocalTransactionState.COMMIT_MESSAGE}
    bodies = [b.decode() for b in got]
    dupes = {b for b in bodies if bodies.count(b) > 1}
    assert not dupes, f"{len(dupes)} committed messages delivered twice"
    contradicted = set(bodies) - committed
    assert not contradicted, f"{len(contradicted)} rolled-back transactions delivered"
    # A transaction whose half was never acknowledged may be missing; every other commit is
    # there.  Halves that failed are rare: most commits must be found.
    assert len(set(bodies)) >= 0.8 * len(committed), (len(bodies), len(committed))
    assert oracle.checks > 0, "no transaction was resolved by a check-back"
    await producer.shutdown()


async def test_paused_leader_is_fenced_and_rejoins_as_follower(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    old = await bc.start_group("g1")
    p = AsyncProducer("fence", bc.seeds("g1"), request_timeout=8.0)
    await p.start()
    await send_range(p, "before", range(20))
    stale = await RawClient.connect(old.addr)  # a client that still talks to the old leader
    bc.pause("g1", old.replica)
    try:
        new = await bc.wait_leader("g1", not_replica=old.replica)
        await send_range(p, "after", range(20))
    finally:
        bc.resume("g1", old.replica)
    # The old leader's first write after it wakes up is refused, never acknowledged.
    try:
        resp = await stale.send(TOPIC, b"stale-write")
        refused = resp.code != ResponseCode.SUCCESS
    except TxmqError:
        refused = True
    assert refused, "a deposed leader acknowledged a write"
    await stale.close()
    await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
    st = await bc.status(old.addr)
    assert st is not None and st["self"]["role"] == "follower"
    got = await stored_bodies(new.addr)
    assert b"stale-write" not in got
    assert {f"after-{i}".encode() for i in range(20)} <= set(got)
    await bc.wait(
        same_logs(*bc.replicas.values()),
        30,
        "the deposed leader's log equals the new leader's (unacknowledged tail cut)",
    )
    await p.shutdown()


async def test_follower_with_an_empty_disk_catches_up(make_cluster: Any) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    p = AsyncProducer("wipe", bc.seeds("g1"), request_timeout=8.0)
    await p.start()
    for i in range(200):
        await p.send(Message(TOPIC, f"m-{i}".encode() * 50))
    follower = next(r for r in bc.replicas.values() if r.replica != leader.replica)
    bc.kill("g1", follower.replica)
    await bc.wait_in_sync(
        "g1", sorted(r.replica for r in bc.replicas.values() if r is not follower)
    )
    bc.wipe("g1", follower.replica)
    await send_range(p, "n", range(50))
    bc.start("g1", follower.replica)
    await bc.wait_in_sync("g1", [0, 1, 2])
    await bc.wait(same_logs(follower, leader), 30, "the wiped follower holds the leader's log")
    await p.shutdown()


async def test_follower_with_a_damaged_epoch_history_fetches_its_log_again(
    make_cluster: Any,
) -> None:
    """A follower whose ``ha/epochs.json`` fails its checksum cannot tell where its log
    diverged from the leader's: it sets the file aside, names it (ERROR), cuts its log back to
    the start of the leader's history and fetches it all again."""
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    p = AsyncProducer("epochs", bc.seeds("g1"), request_timeout=8.0)
    await p.start()
    await send_range(p, "m", range(50))
    follower = next(r for r in bc.replicas.values() if r.replica != leader.replica)
    await bc.wait(same_logs(follower, leader), 30, "the follower holds the leader's log")
    bc.kill("g1", follower.replica)
    path = follower.store / "ha" / "epochs.json"
    doc = json.loads(path.read_bytes())
    assert "txmqCrc32" in doc and doc["epochs"], doc
    data = bytearray(path.read_bytes())
    at = data.index(b"[[") + 2  # the first epoch number: another number, still JSON
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    json.loads(bytes(data))
    await send_range(p, "n", range(20))
    bc.start("g1", follower.replica)
    await bc.wait_in_sync("g1", [0, 1, 2])
    await bc.wait(same_logs(follower, leader), 30, "the follower holds the leader's log again")
    log_text = follower.log.read_text(errors="replace")
    assert "epoch_history_damaged" in log_text and str(path) in log_text
    assert "replica_truncating" in log_text
    assert list(path.parent.glob("epochs.json.damaged-*"))
    assert "txmqCrc32" in json.loads(path.read_bytes())  # written again, from the leader's
    await p.shutdown()


async def test_etcd_member_kills_do_not_stop_the_cluster(
    make_cluster: Any, etcd: EtcdCluster
) -> None:
    bc: BrokerCluster = make_cluster(settings={"etcdLeaseTtl": 6})
    leader = await bc.start_group("g1")
    p = AsyncProducer("etcd-kill", bc.seeds("g1"), request_timeout=10.0)
    await p.start()
    try:
        for victim in (etcd.leader_index(), None):
            i = (
                victim
                if victim is not None
                else next(k for k, m in enumerate(etcd.members) if m.proc and m.proc.poll() is None)
            )
            etcd.kill(i)
            try:
                for n in range(30):
                    await p.send(Message(TOPIC, f"e{i}-{n}".encode()))
            finally:
                etcd.restart(i)
        st = await bc.status(leader.addr)
        assert st is not None and st["self"]["role"] == "leader", "the leader changed"
    finally:
        await p.shutdown()


def txmq_cli(*args: str) -> str:
    """The ``txmq`` command line, as an operator runs it."""
    r = subprocess.run(
        [sys.executable, "-m", "txmq", *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, f"txmq {' '.join(args)} exited {r.returncode}: {r.stderr}"
    return r.stdout


async def test_routes_cover_every_group(make_cluster: Any) -> None:
    """`txmq cluster place` gives a topic queues in each group (asking any broker where the
    group's leader is) and returns once every broker's route answer names the group (the
    first lookups after it must not answer "no such topic"), and `txmq cluster status` lists
    them."""
    bc: BrokerCluster = make_cluster(groups={"g1": 1, "g2": 1}, settings={"minInSyncReplicas": 1})
    bc.start_all()
    l1 = await bc.wait_leader("g1")
    l2 = await bc.wait_leader("g2")
    place = ("cluster", "place", "wide", "--queues", "2", "--broker", l1.addr, "--group")
    out = await asyncio.to_thread(txmq_cli, *place, "g1")
    assert "2 queues in group g1" in out
    # -o json: what was placed where, once every broker routes it
    placed = json.loads(await asyncio.to_thread(txmq_cli, *place, "g2", "-o", "json"))
    assert placed == {
        "topic": "wide",
        "group": "g2",
        "leader": l2.addr,
        "queues": 2,
        "perm": 6,
        "readOnly": False,
        "routedEverywhere": True,
    }

    async def both() -> bool:
        for r in (l1, l2):
            async with connected(r.addr) as c:
                resp = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "wide"})
            if resp.code != ResponseCode.SUCCESS:
                return False
            route = json.loads(resp.body)
            names = {q["brokerName"] for q in route["queueDatas"]}
            leaders = {b["brokerName"]: b["brokerAddrs"].get("0") for b in route["brokerDatas"]}
            if names != {"g1", "g2"} or leaders != {"g1": l1.addr, "g2": l2.addr}:
                return False
        return True

    # `cluster place` returned: the placement is in effect on every broker, no retry needed
    assert await both(), "a broker's route of 'wide' lacks a group right after cluster place"
    status = await asyncio.to_thread(txmq_cli, "cluster", "status", "--broker", l2.addr)
    assert f"group g1: leader replica 0 at {l1.addr}" in status
    assert f"group g2: leader replica 0 at {l2.addr}" in status
    assert "wide" in status
    listed = json.loads(
        await asyncio.to_thread(txmq_cli, "cluster", "list", "--broker", l1.addr, "-o", "json")
    )
    leaders = {(r["group"], r["addr"]) for r in listed if r["role"] == "leader"}
    assert leaders == {("g1", l1.addr), ("g2", l2.addr)}, listed
    route = json.loads(
        await asyncio.to_thread(
            txmq_cli, "topic", "route", "wide", "--broker", l1.addr, "-o", "json"
        )
    )
    assert {(r["group"], r["leader"]) for r in route} == {("g1", l1.addr), ("g2", l2.addr)}, route
    # Changes to a topic or a consumer group reach every broker group holding it.
    reset = json.loads(
        await asyncio.to_thread(
            txmq_cli, "group", "reset-offset", "billing", "-t", "wide", "--to-earliest",
            "--broker", l2.addr, "--json",
        )
    )  # fmt: skip
    assert {r["group"] for r in reset} == {"g1", "g2"}, reset
    forgotten = await asyncio.to_thread(
        txmq_cli, "group", "delete", "billing", "--yes", "--broker", l2.addr, "-o", "json"
    )
    assert json.loads(forgotten) == {
        "group": "billing",
        "deleted": True,
        "brokerGroups": ["g1", "g2"],
    }
    deleted = await asyncio.to_thread(
        txmq_cli, "topic", "delete", "wide", "--yes", "--broker", l1.addr
    )
    assert "deleted in group g1" in deleted and "deleted in group g2" in deleted, deleted

    async def gone_everywhere() -> bool:
        for leader in (l1, l2):
            async with connected(leader.addr) as c:
                resp = await c.call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "wide"})
            if resp.code != ResponseCode.TOPIC_NOT_EXIST:
                return False
        return True

    await bc.wait(gone_everywhere, 30, "topic 'wide' deleted in both groups")


async def test_batch_decision_across_groups_survives_a_leader_death(make_cluster: Any) -> None:
    """A batch with halves in two groups, decided through g1 while g2's leader is stopped; that
    leader is then killed before it applied anything.  g2's next leader applies the decision
    recorded in etcd by itself: the batch is committed in both groups, its other member rolled
    back, with no second decide call."""
    bc: BrokerCluster = make_cluster(groups={"g1": 1, "g2": 3}, settings={"minInSyncReplicas": 1})
    bc.start_all()
    l1 = await bc.wait_leader("g1")
    l2 = await bc.wait_leader("g2")
    await bc.wait_in_sync("g2", [0, 1, 2])
    group, batch = "spark-sink", "query-1:7"
    halves = {"a1": l1, "a2": l1, "b1": l2, "b2": l2}
    for txid, leader in halves.items():
        async with connected(leader.addr) as c:
            resp = await c.send(
                "sunk",
                f"row-{txid}".encode(),
                group=group,
                transactional=True,
                props={"TXMQ_BATCH_KEY": batch, "UNIQ_KEY": txid},
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
    bc.pause("g2", l2.replica)
    async with connected(l1.addr) as c:
        resp = await c.call(
            RequestCode.TXMQ_DECIDE_BATCH,
            {"producerGroup": group, "batchKey": batch},
            json.dumps({"commit": ["a1", "b1", "b2"]}).encode(),
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    bc.kill("g2", l2.replica)
    new2 = await bc.wait_leader("g2", not_replica=l2.replica)

    async def committed_in_both() -> bool:
        g1 = sorted(text(b) for b in await stored_bodies(l1.addr, "sunk"))
        g2 = sorted(text(b) for b in await stored_bodies(new2.addr, "sunk"))
        return g1 == ["row-a1"] and g2 == ["row-b1", "row-b2"]

    await bc.wait(committed_in_both, 40, "the batch is committed in both groups")
    applied = bc.events("g2", new2.replica, "batch_applied_from_commit_point")
    assert applied and applied[0]["batch_key"] == batch


async def test_cluster_with_acl(make_cluster: Any, tmp_path: Any) -> None:
    """With aclEnable, replicas replicate with the file's admin account, anonymous clients get
    neither log bytes nor routes, and a producer with its account follows a failover."""
    acl = write_acl(tmp_path, CLUSTER_ACL_FILE)
    bc: BrokerCluster = make_cluster(settings={"aclEnable": "true", "plainAclFile": str(acl)})
    bc.signer = Credentials("operator", "secret-op-123").sign
    leader = await bc.start_group("g1")
    follower = next(r for r in bc.replicas.values() if r.replica != leader.replica)
    async with connected(leader.addr) as anonymous:
        resp = await anonymous.call(
            RequestCode.TXMQ_HA_FETCH, {"brokerName": "g1", "replicaId": 9, "offset": 0}
        )
        assert resp.code == ResponseCode.NO_PERMISSION, resp
    async with connected(follower.addr) as anonymous:
        resp = await anonymous.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
        assert resp.code == ResponseCode.NO_PERMISSION, resp
    p = AsyncProducer(
        "groupA",
        bc.seeds("g1"),
        access_key="producerA",
        secret_key="secret-a-123",
        request_timeout=10.0,
    )
    await p.start()
    try:
        await send_range(p, "acl", range(10))
        bc.kill("g1", leader.replica)
        await send_range(p, "acl", range(10, 20))
    finally:
        await p.shutdown()


async def test_cluster_with_tls_enforced(make_cluster: Any, tmp_path: Any) -> None:
    """With tls.server.mode enforcing, followers replicate over TLS (checking the leader's
    certificate against tls.server.trustCertPath) and the SDK follows a failover over TLS."""
    from tests.support.certs import make_certs

    certs = make_certs(tmp_path / "certs")
    bc: BrokerCluster = make_cluster(settings=enforced_tls(certs))
    bc.ssl = certs.client_context()
    leader = await bc.start_group("g1")
    # Every replica's broker port is TLS-only, followers' too.
    for r in bc.replicas.values():
        st = await bc.status(r.addr)
        assert st is not None, f"replica {r.replica} does not answer over TLS"
        async with connected(r.addr) as plain:
            with pytest.raises(TxmqError):
                await plain.call(RequestCode.TXMQ_CLUSTER_STATUS, {}, timeout=5.0)
    p = AsyncProducer("tls", bc.seeds("g1"), tls=certs.client_context(), request_timeout=10.0)
    await p.start()
    try:
        await send_range(p, "tls", range(10))
        bc.kill("g1", leader.replica)
        await send_range(p, "tls", range(10, 20))
    finally:
        await p.shutdown()


def _log_events(log: Path) -> list[str]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line).get("event", ""))
        except ValueError:
            continue
    return out


async def _leader_key(bc: BrokerCluster, group: str) -> str:
    return await _etcd_value(bc, f"leader/{group}")


async def _etcd_value(bc: BrokerCluster, key: str) -> str:
    """The value of the cluster's etcd key ``key`` (under its root), as etcdctl prints it."""
    ctl = Path(etcd_binary()).with_name("etcdctl")
    r = await asyncio.to_thread(
        subprocess.run,
        [str(ctl), "--endpoints", bc.etcd, "get", f"/txmq/{bc.name}/{key}"]
        + ["--print-value-only"],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("obstacle", ["store locked", "port taken"])
async def test_a_replica_that_cannot_serve_never_campaigns(
    make_cluster: Any, obstacle: str
) -> None:
    """Replica 0, alone in its group, cannot serve: another process holds its store's lock, or
    another socket its port.  It says so and never campaigns (it would win and leave the group
    leaderless); once the obstacle is gone it leads and serves."""
    import fcntl
    import socket

    bc: BrokerCluster = make_cluster(groups={"g1": 1}, settings={"minInSyncReplicas": 1})
    broken = bc.replicas[("g1", 0)]
    broken.store.mkdir(parents=True)
    fd = os.open(broken.store / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if obstacle == "store locked":
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", broken.port))
        squatter.listen()
    try:
        bc.start("g1", 0)

        async def said_why() -> bool:
            return bool(bc.events("g1", 0, "replica_cannot_serve"))

        await bc.wait(said_why, 30, "replica 0 says why it cannot serve")
        (event,) = bc.events("g1", 0, "replica_cannot_serve")
        expected = "is locked by another process" if obstacle == "store locked" else "is taken"
        assert expected in event["why"], event
        assert await _leader_key(bc, "g1") == "", "a replica that cannot serve holds the lead"

        # its member key says why (what `txmq cluster status` shows as NOT SERVING)
        async def member_says_why() -> bool:
            value = await _etcd_value(bc, "members/g1/0")
            return bool(value) and expected in str(json.loads(value).get("obstacle", ""))

        await bc.wait(member_says_why, 30, "replica 0's member key naming the obstacle")
    finally:
        os.close(fd)  # releases the flock
        squatter.close()
    leader = await bc.wait_leader("g1", timeout=60)
    assert leader.replica == 0

    async def member_clear() -> bool:
        return "obstacle" not in json.loads(await _etcd_value(bc, "members/g1/0"))

    await bc.wait(member_clear, 30, "replica 0's member key without the obstacle")
    # its log, in order: no election won before it could serve (over the whole obstacle)
    watched = ("replica_cannot_serve", "replica_can_serve", "leader_elected")
    events = [e for e in _log_events(bc.replicas[("g1", 0)].log) if e in watched]
    assert events[:2] == ["replica_cannot_serve", "replica_can_serve"], events
    assert "leader_elected" in events, events
    p = AsyncProducer("after-obstacle", bc.seeds("g1"), request_timeout=8.0)
    await p.start()
    try:
        await send_range(p, "served", range(3))
    finally:
        await p.shutdown()
