"""Routes that name the followers as write-only brokers, and followers that forward writes.

A stock producer (Apache rocketmq-client-cpp) re-reads routes only every 30 s and retries a
failed send on another queue of the route it has: with each follower listed as a write-only
broker of its own (``<group>@<replicaId>``), that retry reaches a follower, which forwards it to
the leader of the moment.  So the producer sends again within seconds of a leader SIGKILL or
SIGSTOP instead of at its next route refresh; consumers (which keep only readable queues) and the txmq
SDK (which leaves ``replicaOf`` entries out) read exactly what they read before.  A follower
stores nothing itself: with no leader to forward to it refuses at once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from tests.compat.stock import cpp_client
from tests.support.acl_files import write_acl
from tests.support.cluster import CLUSTER_ACL_FILE, BrokerCluster, enforced_tls
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until, wait_until_sync
from txmq.broker.cluster.etcd import Entry
from txmq.broker.cluster.forward import FORWARD_TIMEOUT_S, WriteForwarder
from txmq.broker.cluster.view import ClusterView, replica_entry
from txmq.client import AsyncPushConsumer, PullConsumer
from txmq.client.route import parse_route
from txmq.protocol.acl import Credentials
from txmq.protocol.aio import open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.message import MessageExt

pytestmark = pytest.mark.slow

#: Seconds from the leader's SIGKILL or SIGSTOP to the stock producer's first acknowledged send
#: after it (the goal is 10 s on a quiet machine; this leaves room for a loaded one).
CPP_BOUND_S = 15.0
#: The longest silence of the stock producer's output, a send a line (with --keep-going each
#: send ends within its 3 s timeout): longer means the client hangs.
LINE_TIMEOUT_S = 60.0
#: Sends of the stock producer: 20 before the fault, the rest after.  Until its route is next
#: refreshed (every 30 s, and not at all while the name server it asked is the paused leader)
#: the producer still picks the paused leader's queues now and then, and each such send waits
#: out its 3 s timeout before it is retried on a follower: a few dozen sends after the fault
#: show the failover and keep the test's time bounded on a loaded machine.
CPP_SENDS = 60


def view_of(perm: int = 6, leader: int | None = 0, *, write_replicas: bool = True) -> ClusterView:
    """Group g of replicas 0, 1, 2 (``leader`` leading) holding topic t with 4 queues."""
    v = ClusterView("c", write_replicas=write_replicas)
    k = v.keys
    table = {k.member("g", m): Entry({"addr": f"h:{m}"}, 1, 10 + m) for m in (0, 1, 2)}
    if leader is not None:
        table[k.leader("g")] = Entry(
            {"replicaId": leader, "addr": f"h:{leader}", "epoch": 3}, 2, 10 + leader
        )
    table[k.topic("g", "t")] = Entry({"read": 4, "write": 4, "perm": perm, "sysFlag": 0}, 3, 0)
    v.update(table)
    return v


def test_routes_name_each_follower_as_a_write_only_broker() -> None:
    route = view_of(leader=1).route("t")
    assert route is not None
    queues = {q["brokerName"]: q for q in route["queueDatas"]}
    brokers = {b["brokerName"]: b for b in route["brokerDatas"]}
    assert set(queues) == {"g", "g@0", "g@2"} == set(brokers)
    assert queues["g"]["perm"] == 6 and queues["g"]["readQueueNums"] == 4
    assert brokers["g"]["brokerAddrs"] == {"0": "h:1", "1": "h:0", "2": "h:2"}
    for rid in (0, 2):
        name = replica_entry("g", rid)
        # write only, no queue to read: consumers keep readable queues and never see it
        assert queues[name] == {
            "brokerName": name,
            "readQueueNums": 0,
            "writeQueueNums": 4,
            "perm": 2,
            "topicSysFlag": 0,
        }
        assert brokers[name]["brokerAddrs"] == {"0": f"h:{rid}"}
        assert brokers[name]["replicaOf"] == "g"


def test_the_default_topics_route_gives_each_follower_queues_to_send_on() -> None:
    """A stock producer with no route for a topic builds its queues from TBW102's route, each
    writable entry's min(defaultTopicQueueNums, readQueueNums): the followers' entries must
    count there too, or it retries only on the leader (a SIGSTOPped one: every send times
    out) until a later route refresh."""
    v = view_of(leader=1)
    tbw = Entry({"read": 8, "write": 8, "perm": 7, "sysFlag": 0}, 4, 0)
    v.update({**v.table, v.keys.topic("g", "TBW102"): tbw})
    route = v.route("TBW102")
    assert route is not None
    queues = {q["brokerName"]: q for q in route["queueDatas"]}
    for name in (replica_entry("g", 0), replica_entry("g", 2)):
        assert queues[name]["perm"] == 2  # write only: nobody reads them
        assert min(4, queues[name]["readQueueNums"]) == 4
    # Any other topic's follower entries stay without read queues.
    other = v.route("t")
    assert other is not None
    assert {q["readQueueNums"] for q in other["queueDatas"][1:]} == {0}


def test_no_write_entries_when_off_or_for_a_read_only_topic() -> None:
    for v in (view_of(write_replicas=False), view_of(perm=4)):
        route = v.route("t")
        assert route is not None
        assert [q["brokerName"] for q in route["queueDatas"]] == ["g"]
        assert [b["brokerName"] for b in route["brokerDatas"]] == ["g"]


def test_during_an_election_every_replica_is_a_write_entry() -> None:
    """No leader: the group's own entry has no broker id 0 (stock producers skip it) and each
    replica takes writes, refusing them until one of them leads."""
    route = view_of(leader=None).route("t")
    assert route is not None
    assert {q["brokerName"] for q in route["queueDatas"]} == {"g", "g@0", "g@1", "g@2"}
    assert "0" not in route["brokerDatas"][0]["brokerAddrs"]


def test_the_sdk_leaves_the_write_entries_out() -> None:
    route = view_of(leader=1).route("t")
    parsed = parse_route("t", json.dumps(route).encode())
    assert parsed.groups == ["g"]
    assert parsed.write_queue_nums == parsed.read_queue_nums == 4
    assert {q.broker for q in parsed.write_queues + parsed.read_queues} == {"g"}
    assert parsed.brokers == {"g": ("h:1", "h:0", "h:2")}


async def test_a_follower_without_a_leader_refuses_at_once() -> None:
    """Nothing to forward to: SERVICE_NOT_AVAILABLE (which stock producers retry on another
    queue) without waiting, and nothing sent anywhere."""
    fw = WriteForwarder(view_of(leader=None), "g", 1, lambda: None, 1 << 20)
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "t"}, b"x")
    t0 = time.monotonic()
    resp = await fw.forward(cmd)
    assert resp is not None and resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp
    assert "no leader" in (resp.remark or "")
    assert time.monotonic() - t0 < 0.5
    assert (fw.forwarded, fw.refused) == (0, 1)
    await fw.close()


def replica_entries(route_body: bytes) -> dict[str, str]:
    """``{entry name: address}`` of the write-only entries of a route answer."""
    doc = json.loads(route_body)
    return {
        b["brokerName"]: b["brokerAddrs"]["0"] for b in doc["brokerDatas"] if b.get("replicaOf")
    }


async def test_followers_forward_sends_and_decisions_and_refuse_while_the_leader_is_silent(
    make_cluster: Any,
) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    followers = [r for r in bc.replicas.values() if r.replica != leader.replica]
    async with connected(leader.addr) as lc:
        assert lc.send_header(await lc.send("fwd", b"direct")).queue_offset == 0

        async def routed() -> dict[str, str]:
            resp = await lc.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "fwd"})
            return replica_entries(resp.body) if resp.code == ResponseCode.SUCCESS else {}

        entries = await wait_until(routed, 10, "the topic's route naming the followers")
        assert entries == {replica_entry("g1", r.replica): r.addr for r in followers}
    async with connected(followers[0].addr) as f:
        # A send through a follower is stored by the leader (the answer is the leader's).
        for v2 in (True, False):
            resp = await f.send("fwd", f"via-follower-{v2}".encode(), v2=v2, queue_id=1)
            assert f.send_header(resp).queue_offset == int(not v2), resp
        # A half sent through the follower, decided (oneway, as stock producers do) through it.
        half = await f.send("fwd", b"half-via-follower", transactional=True, group="fwd-tx")
        await f.end_transaction_oneway("fwd-tx", half, 8)
        async with connected(leader.addr) as lc:
            await lc.heartbeat(consumer_groups={"fwd-readers": {"fwd": "*"}})
            want = {b"direct", b"via-follower-True", b"via-follower-False", b"half-via-follower"}

            async def on_leader() -> bool:
                return {m.body for m in await lc.pull_all("fwd")} == want

            await wait_until(on_leader, 10, "the forwarded sends and commit on the leader")
            # The consumer list a stock consumer may ask any route entry for: the leader's.
            resp = await f.call(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "fwd-readers"}
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert json.loads(resp.body)["consumerIdList"] == [lc.client_id]
        # The leader goes silent (SIGSTOP: its port still takes connections): the forwarded
        # send is refused within the forward timeout instead of hanging.
        bc.pause("g1", leader.replica)
        try:
            t0 = time.monotonic()
            resp = await f.send("fwd", b"while-silent", queue_id=2)
            took = time.monotonic() - t0
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, (resp.code, resp.remark)
            assert took < FORWARD_TIMEOUT_S + 1.5, f"refused only after {took:.2f} s"
            new = await bc.wait_leader("g1", not_replica=leader.replica, timeout=30)
        finally:
            bc.resume("g1", leader.replica)
    # The old leader wakes up, finds its lease gone and rejoins; what it may have stored of
    # the refused send was never acknowledged and is cut: no replica serves it.
    await bc.wait_in_sync("g1", [0, 1, 2], timeout=60)
    # A new leader serves reads up to what its in-sync replicas confirmed: wait for that.
    c = await RawClient.connect(new.addr)
    bodies: list[bytes] = []
    try:

        async def all_readable() -> bool:
            bodies[:] = [m.body for m in await c.pull_all("fwd")]
            return want <= set(bodies)

        await wait_until(all_readable, 30, "the acknowledged sends readable on the new leader")
    finally:
        await c.close()
    assert b"while-silent" not in bodies, "a send refused through a follower was stored"
    assert sorted(bodies) == sorted(want), bodies


def _collect(stream: IO[str] | None, into: list[str]) -> None:
    if stream is not None:
        into.extend(stream)


def group_at_end(address: str, group: str, topic: str) -> bool:
    with PullConsumer(group, broker=address) as c:
        for q in c.fetch_queues(topic):
            if (c.committed_offset(topic, q) or 0) != c.max_offset(topic, q):
                return False
    return True


def settled(address: str, group: str) -> None:
    """Until ``group`` has committed the end of every queue of the topic: whatever it pulled
    was consumed, so a duplicate would have been delivered by then."""
    wait_until_sync(
        lambda: group_at_end(address, group, "stock"),
        60,
        f"{group}'s committed offsets at the end of the topic",
    )


@pytest.mark.timeout(360)  # a cluster, two stock clients, a failover and a rejoin
@pytest.mark.parametrize("fault", ["kill", "stop"])
async def test_a_stock_producer_sends_again_within_seconds_of_a_leader_failure(
    make_cluster: Any, tmp_path: Path, fault: str
) -> None:
    """``kill``: SIGKILL (the leader's port refuses); ``stop``: SIGSTOP, a leader alive but
    silent (its port takes connections, nothing answers: the producer's send to it times out
    after 3 s and is retried on a follower), resumed once the producer is done."""
    cpp = cpp_client(tmp_path / "home")
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    namesrv = ";".join(r.addr for r in bc.replicas.values())
    interval = 0.1
    proc = cpp.start(
        "send", namesrv, "stock", "--count", CPP_SENDS, "--interval", interval, "--keep-going"
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while sum('"status": 0' in line for line in lines) < 20:
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line and time.monotonic() < deadline, f"the client stopped early: {lines}"
            lines.append(line)
        t0 = time.monotonic()
        if fault == "stop":
            bc.pause("g1", leader.replica)
        else:
            bc.kill("g1", leader.replica)
        took = None
        while True:
            try:
                line = await asyncio.wait_for(
                    asyncio.to_thread(proc.stdout.readline), LINE_TIMEOUT_S
                )
            except TimeoutError:
                proc.kill()
                _, err = await asyncio.to_thread(proc.communicate, timeout=30)
                pytest.fail(
                    f"the stock producer printed nothing for {LINE_TIMEOUT_S:.0f} s after the "
                    f"SIG{fault.upper()} (each send times out after 3 s): last lines "
                    f"{lines[-5:]}; its stderr {err[-2000:]!r}\n{bc.log_tail()}"
                )
            if not line:
                break
            lines.append(line)
            if took is None and '"status": 0' in line and time.monotonic() - t0 > interval:
                took = time.monotonic() - t0  # (one answered at once was in flight before)
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if fault == "stop":
            bc.resume("g1", leader.replica)
    assert proc.returncode == 0, err[-2000:]
    docs = [json.loads(line) for line in lines if line.startswith("{")]
    acked = {d["msg_id"]: d["i"] for d in docs if d.get("status") == 0}
    failed = [d["i"] for d in docs if "error" in d]
    assert took is not None, f"no send acknowledged after the kill; failed: {failed[:5]}"
    assert took < CPP_BOUND_S, (
        f"the stock producer's first acknowledged send came {took:.2f} s after the leader's "
        f"SIG{fault.upper()} (bound {CPP_BOUND_S} s); {len(failed)} sends failed\n"
        f"{bc.log_tail()}"
    )
    print(f"stock C++ producer: first acknowledged send {took:.2f} s after the SIG"
          f"{fault.upper()}, {len(failed)} of {CPP_SENDS} sends failed")  # fmt: skip
    assert len(acked) + len(failed) == CPP_SENDS
    new = await bc.wait_leader("g1", not_replica=leader.replica, timeout=10)
    if fault == "stop":
        # The resumed old leader finds it was deposed and rejoins as a follower.
        await bc.wait_rejoined("g1", new.replica, leader.replica, timeout=60)

    # Every acknowledged message reaches a stock push consumer and the SDK exactly once
    # (a failed attempt may have been stored too, under its own message id).
    stop = tmp_path / "stop"
    consumer = cpp.start(
        "push", namesrv, "stock", "cpp-readers", "--expect", len(acked), "--stop-file", stop,
        "--timeout", 90,
    )  # fmt: skip
    out: list[str] = []
    readers = [
        threading.Thread(target=_collect, args=(s, into), daemon=True)
        for s, into in ((consumer.stdout, out), (consumer.stderr, []))
    ]
    for r in readers:
        r.start()
    sdk_got: list[MessageExt] = []

    async def on_message(msg: MessageExt) -> None:
        sdk_got.append(msg)

    sdk = AsyncPushConsumer("sdk-readers", bc.seeds("g1"), consume_from="first")
    sdk.subscribe("stock", "*", on_message)
    await sdk.start()
    try:

        def cpp_ids() -> list[str]:
            docs = [json.loads(line) for line in list(out) if line.startswith("{")]
            return [str(d["msg_id"]) for d in docs if d.get("event") == "received"]

        await wait_until(
            lambda: set(acked) <= set(cpp_ids()) or consumer.poll() is not None,
            90,
            "every acknowledged message at the stock push consumer",
        )
        await wait_until(
            lambda: set(acked) <= {m.msg_id for m in sdk_got},
            60,
            "every acknowledged message at the SDK push consumer",
        )
        for group in ("cpp-readers", "sdk-readers"):
            await asyncio.to_thread(settled, new.addr, group)
    finally:
        stop.touch()
        await asyncio.wait_for(sdk.shutdown(), 15)
        try:
            consumer.wait(60)
        except subprocess.TimeoutExpired:
            consumer.kill()
            consumer.wait(30)
        for r in readers:
            r.join(10)
    assert consumer.returncode == 0, "".join(out)[-2000:]
    for who, ids in (("stock", cpp_ids()), ("SDK", [m.msg_id for m in sdk_got])):
        missing = set(acked) - set(ids)
        assert not missing, f"{who} consumer missed acknowledged sends {sorted(missing)[:5]}"
        twice = sorted({i for i in ids if ids.count(i) > 1})
        assert not twice, f"{who} consumer got messages twice: {twice[:5]}"


async def test_forwarded_sends_keep_the_clients_acl_identity(
    make_cluster: Any, tmp_path: Path
) -> None:
    """A follower forwards headers and body unchanged: the leader checks the client's own
    signature and permissions (a signed send is stored, one the account may not make or an
    anonymous one is refused there), never the follower's."""
    acl = write_acl(tmp_path, CLUSTER_ACL_FILE)
    bc: BrokerCluster = make_cluster(settings={"aclEnable": "true", "plainAclFile": str(acl)})
    bc.signer = Credentials("operator", "secret-op-123").sign
    leader = await bc.start_group("g1")
    follower = next(r for r in bc.replicas.values() if r.replica != leader.replica)
    producer = Credentials("producerA", "secret-a-123")
    direct = await RawClient.connect(leader.addr, credentials=producer)
    signed = await RawClient.connect(follower.addr, credentials=producer)
    anonymous = await RawClient.connect(follower.addr)
    try:
        assert (await direct.send("orders", b"direct", group="groupA")).code == 0
        resp = await signed.send("orders", b"signed-via-follower", group="groupA")
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        resp = await signed.send("other", b"not-permitted", group="groupA")
        assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
        resp = await anonymous.send("orders", b"anonymous", group="groupA")
        assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
        admin = await RawClient.connect(
            leader.addr, credentials=Credentials("operator", "secret-op-123")
        )
        try:
            bodies = {m.body for m in await admin.pull_all("orders")}
        finally:
            await admin.close()
    finally:
        for c in (direct, signed, anonymous):
            await c.close()
    assert bodies == {b"direct", b"signed-via-follower"}, bodies


async def test_followers_forward_over_tls_when_it_is_enforced(
    make_cluster: Any, tmp_path: Path
) -> None:
    """With tls.server.mode enforcing, a follower reaches its leader over TLS (as its
    replication does) to forward a send."""
    from tests.support.certs import make_certs

    certs = make_certs(tmp_path / "certs")
    bc: BrokerCluster = make_cluster(settings=enforced_tls(certs))
    bc.ssl = certs.client_context()
    leader = await bc.start_group("g1")
    follower = next(r for r in bc.replicas.values() if r.replica != leader.replica)

    async def connect(addr: str) -> RawClient:
        host, _, port = addr.rpartition(":")
        return RawClient(await open_connection(host, int(port), ssl=certs.client_context()))

    c = await connect(follower.addr)
    try:
        resp = await c.send("tls-fwd", b"over-tls-via-follower")
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    finally:
        await c.close()
    c = await connect(leader.addr)
    try:
        assert [m.body for m in await c.pull_all("tls-fwd")] == [b"over-tls-via-follower"]
    finally:
        await c.close()
