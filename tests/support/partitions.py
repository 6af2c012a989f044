"""A broker group under network faults: 3 etcd members and 3 replicas, each in its own network
namespace (:mod:`tests.support.netns`), clients in another; a workload that records every
operation in a :class:`~tests.support.history.History`; a nemesis that partitions, heals, kills
and pauses.  Used by ``tests/cluster/test_partitions.py`` (a few minutes) and
``bench/soak.py`` (an hour).

The calling thread runs in the clients' namespace (:func:`tests.support.netns.entered`) for the
whole run: its sockets (the SDK, the status probes) reach the brokers over the bridge, like any
client, and are cut off or not as the nemesis decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import netns
from tests.support.cluster import BrokerCluster, Replica
from tests.support.etcd import etcd_binary, member_args
from tests.support.history import CheckResult, History, Op, check, leader_events
from tests.support.netns import Network, entered
from tests.support.raw import RawClient, connected
from txmq.client import (
    AsyncProducer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionListener,
)
from txmq.protocol.codes import RequestCode, ResponseCode

TOPIC = "jepsen"
GROUP = "g1"
ETCD = ["e0", "e1", "e2"]
BROKERS = ["b0", "b1", "b2"]
CLIENT = "client"
BROKER_PORT = 10911
OPS_PORT = 8080


@dataclass
class NsReplica(Replica):
    host: str = "127.0.0.1"
    node: str = ""

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


class NsEtcd:
    """Three etcd members, one per namespace, on the standard ports of their own address."""

    def __init__(self, net: Network, base: Path) -> None:
        self.net = net
        self.binary = etcd_binary()
        self.base = base
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def endpoints(self) -> str:
        return ",".join(f"{self.net.ip(n)}:2379" for n in ETCD)

    def start(self, timeout: float = 60.0) -> None:
        initial = ",".join(f"{n}=http://{self.net.ip(n)}:2380" for n in ETCD)
        for n in ETCD:
            ip = self.net.ip(n)
            d = self.base / n
            d.mkdir(parents=True, exist_ok=True)
            args = [
                *self.net.exec_prefix(n),
                self.binary,
                *member_args(
                    n,
                    str(d / "data"),
                    f"{ip}:2379",
                    f"{ip}:2380",
                    initial,
                    f"txmq-part-{os.getpid()}",
                    str(d / "etcd.log"),
                ),
            ]
            self.procs[n] = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        ctl = str(Path(self.binary).with_name("etcdctl"))
        deadline = time.monotonic() + timeout
        for n in ETCD:
            while True:
                r = subprocess.run(
                    [*self.net.exec_prefix(CLIENT), ctl, "--endpoints", f"{self.net.ip(n)}:2379"]
                    + ["--command-timeout=2s", "get", "/health-probe"],
                    capture_output=True,
                    env=dict(os.environ, ETCDCTL_API="3"),
                    timeout=10,
                )
                if r.returncode == 0:
                    break
                if self.procs[n].poll() is not None:
                    raise AssertionError(f"etcd member {n} exited: see {self.base / n}/etcd.log")
                if time.monotonic() > deadline:
                    raise AssertionError(f"etcd member {n} not serving: {r.stderr!r}")
                time.sleep(0.2)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


class NsBrokerCluster(BrokerCluster):
    """:class:`BrokerCluster` with each replica in its own namespace, on its own address."""

    def __init__(self, net: Network, base: Path, etcd_endpoints: str, **kw: Any) -> None:
        super().__init__(base, etcd_endpoints, name="part", groups={GROUP: 3}, **kw)
        self.net = net
        for rid, node in enumerate(BROKERS):
            old = self.replicas[(GROUP, rid)]
            self.replicas[(GROUP, rid)] = NsReplica(
                GROUP,
                rid,
                BROKER_PORT,
                old.store,
                old.log,
                ops_port=OPS_PORT,
                host=net.ip(node),
                node=node,
            )

    def command(self, r: Replica) -> list[str]:
        assert isinstance(r, NsReplica)
        return [
            *self.net.exec_prefix(r.node),
            *super().command(r),
            "--set",
            f"brokerIP1={r.host}",
            "--set",
            f"bindAddress={r.host}",
        ]

    def node(self, rid: int) -> str:
        return BROKERS[rid]

    def leader_events(self) -> list[dict[str, Any]]:
        out = []
        for r in self.replicas.values():
            if r.log.exists():
                out += leader_events(
                    r.log.read_text(errors="replace").splitlines(), GROUP, r.replica
                )
        return out

    def resource_figures(self) -> dict[int, tuple[int, int]]:
        """Per running replica: (RSS in KiB, open files)."""
        out = {}
        for r in self.replicas.values():
            if r.proc is None or r.proc.poll() is not None:
                continue
            pid = r.proc.pid
            try:
                rss = next(
                    int(line.split()[1])
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")
                )
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, StopIteration):
                continue
            out[r.replica] = (rss, fds)
        return out


@contextlib.contextmanager
def built_network(prefix: str) -> Iterator[Network]:
    """A :class:`Network` of namespaces named ``prefix``… with the cluster's members built in
    (:func:`build`), torn down at the end; the test is skipped where namespaces are missing."""
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"network partition tests need namespaces: {why}")
    with netns.network(prefix) as n:
        build(n)
        yield n


def build(net: Network) -> None:
    """The nodes: etcd members .10-.12, brokers .20-.22, the clients .30."""
    for i, n in enumerate(ETCD):
        net.add(n, 10 + i)
    for i, n in enumerate(BROKERS):
        net.add(n, 20 + i)
    net.add(CLIENT, 30)


@contextlib.asynccontextmanager
async def group_in_namespaces(
    net: Network, base: Path, settings: dict[str, Any] | None = None
) -> AsyncIterator[tuple[NsEtcd, NsBrokerCluster]]:
    """The etcd members and the group started (a leader, every replica in sync; broker
    ``settings`` over the test timers), the calling thread in the clients' namespace;
    everything stopped (bounded) however the block ends, the logs kept under ``base/logs``."""
    with entered(net.nodes[CLIENT].ns):
        etcd = NsEtcd(net, base / "etcd")
        bc = NsBrokerCluster(net, base / "brokers", etcd.endpoints, settings=settings)
        try:
            etcd.start()
            await bc.start_group(GROUP)
            yield etcd, bc
        finally:
            copy_logs(bc, base / "etcd", base / "logs")
            bc.stop_all()
            etcd.stop()


# -- the workload ----------------------------------------------------------------------------


class Oracle(TransactionListener):
    """Answers check-backs with the decision the workload took; UNKNOW until it took one."""

    def __init__(self) -> None:
        self.decided: dict[str, LocalTransactionState] = {}

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW  # multi-message transactions decide explicitly

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        body = message.body.decode() if isinstance(message.body, bytes) else str(message.body)
        return self.decided.get(body.rpartition(".")[0], LocalTransactionState.UNKNOW)


def outcome(exc: BaseException) -> str:
    """``fail`` when the request certainly stored nothing (a follower refused it), else
    ``info``: a timeout, a lost connection or a refusal after the leader may have stored it."""
    return "fail" if "is a follower" in str(exc) else "info"


@dataclass
class Workload:
    history: History
    seeds: str
    senders: int = 2
    txn_workers: int = 1
    seed: int = 1
    pace: float = 0.01
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    oracle: Oracle = field(default_factory=Oracle)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    txp: AsyncTransactionProducer | None = None
    consumer: AsyncPushConsumer | None = None
    errors: list[str] = field(default_factory=list)

    def acked(self) -> int:
        return sum(1 for op in self.history.ops if op.type == "ok" and op.f in ("send", "txn"))

    async def start(self) -> None:
        self.txp = AsyncTransactionProducer(
            "part-tx", self.oracle, self.seeds, retry_times_when_send_failed=0, request_timeout=5.0
        )
        await self.txp.start()
        self.consumer = AsyncPushConsumer(
            "part-readers", self.seeds, consume_from="first", rebalance_interval=1.0
        )
        self.consumer.subscribe(TOPIC, "*", self._on_message)
        loop = asyncio.get_running_loop()
        for w in range(self.senders):
            self.tasks.append(loop.create_task(self._send_loop(w)))
        for w in range(self.txn_workers):
            self.tasks.append(loop.create_task(self._txn_loop(w)))
        await self.consumer.start()

    async def _on_message(self, msg: MessageExt) -> None:
        body = msg.body.decode() if isinstance(msg.body, bytes) else str(msg.body)
        inv = self.history.invoke("c0", "read", None)
        self.history.ok(inv, [body])

    async def _send_loop(self, w: int) -> None:
        p = AsyncProducer(
            f"part-{w}", self.seeds, retry_times_when_send_failed=0, request_timeout=5.0
        )
        await p.start()
        try:
            i = 0
            while not self.stop.is_set():
                mid = f"s{w}-{i}"
                i += 1
                inv = self.history.invoke(f"p{w}", "send", mid)
                try:
                    await p.send(Message(TOPIC, mid.encode()))
                except asyncio.CancelledError:
                    self.history.info(inv, "cancelled")
                    raise
                except Exception as exc:
                    self.history.complete(inv, outcome(exc), error=f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.1)
                    continue
                self.history.ok(inv)
                await asyncio.sleep(self.pace)
        finally:
            await asyncio.wait_for(p.shutdown(), 15)

    async def _txn_loop(self, w: int) -> None:
        assert self.txp is not None
        rnd = random.Random(self.seed * 1000 + w)
        i = 0
        while not self.stop.is_set():
            tid = f"t{w}-{i}"
            i += 1
            msgs = [f"{tid}.{k}" for k in range(3)]
            want = "commit" if rnd.random() < 0.7 else "rollback"
            inv = self.history.invoke(f"t{w}", "txn", {"id": tid, "msgs": msgs, "decision": want})
            await self._one_txn(inv, tid, msgs, want)
            await asyncio.sleep(self.pace)

    async def _one_txn(self, inv: Op, tid: str, msgs: list[str], want: str) -> None:
        assert self.txp is not None
        value = {"id": tid, "msgs": msgs, "decision": want}
        halves_stored = False
        try:
            async with self.txp.transaction(tid) as txn:
                await asyncio.gather(
                    *(txn.send(Message(TOPIC, m.encode(), keys=tid)) for m in msgs)
                )
                halves_stored = True
                state = (
                    LocalTransactionState.COMMIT_MESSAGE
                    if want == "commit"
                    else LocalTransactionState.ROLLBACK_MESSAGE
                )
                # The decision is known before it is sent: a check-back answers it.
                self.oracle.decided[tid] = state
                if want == "commit":
                    await txn.commit()
                else:
                    await txn.rollback("decided rollback")
        except asyncio.CancelledError:
            self.history.info(inv, "cancelled", value)
            raise
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
            if not halves_stored:
                # Rolled back (by the block, and by the check-back from now on).
                self.oracle.decided[tid] = LocalTransactionState.ROLLBACK_MESSAGE
                value = {**value, "decision": "rollback"}
            self.history.complete(inv, outcome(exc) if halves_stored else "info", value, err)
            await asyncio.sleep(0.1)
            return
        self.history.ok(inv, value)

    async def stop_writers(self) -> None:
        self.stop.set()
        done, pending = await asyncio.wait(self.tasks, timeout=30)
        for t in pending:
            t.cancel()
        await asyncio.wait(self.tasks, timeout=10)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                self.errors.append(repr(t.exception()))

    async def shutdown(self) -> None:
        if self.consumer is not None:
            await asyncio.wait_for(self.consumer.shutdown(), 20)
        if self.txp is not None:
            await asyncio.wait_for(self.txp.shutdown(), 20)


# -- the nemesis -----------------------------------------------------------------------------


@dataclass
class Nemesis:
    net: Network
    bc: NsBrokerCluster
    history: History
    work: Workload
    log: Callable[[str], None] = print
    #: Seconds each fault lasts.
    hold: float = 8.0

    async def leader(self) -> NsReplica:
        r = await self.bc.wait_leader(GROUP, timeout=60)
        assert isinstance(r, NsReplica)
        return r

    def followers(self, leader: NsReplica) -> list[str]:
        return [n for n in BROKERS if n != leader.node]

    async def step(self, name: str, fault: Callable[[], Awaitable[None]]) -> None:
        """Apply a fault, hold it while the workload runs, heal, and wait until the group is
        whole again (a leader, every replica in sync) and acknowledges writes."""
        inv = self.history.invoke("nemesis", "fault", name)
        self.log(f"nemesis: {name}")
        t0 = time.monotonic()
        try:
            await fault()
        finally:
            self.net.heal()
            for r in self.bc.replicas.values():
                if r.proc is not None and r.proc.poll() is None:
                    r.proc.send_signal(signal.SIGCONT)
        self.history.ok(inv, name)
        await self.recovered(name)
        self.log(f"nemesis: {name} healed, group whole after {time.monotonic() - t0:.1f}s")

    async def recovered(self, after: str) -> None:
        for r in self.bc.replicas.values():
            if not r.running:
                self.bc.start(GROUP, r.replica)
        await self.bc.wait_leader(GROUP, timeout=60)
        await self.bc.wait_in_sync(GROUP, [0, 1, 2], timeout=90)
        target = self.work.acked() + 5

        async def resumed() -> bool:
            return self.work.acked() >= target

        await self.bc.wait(resumed, 60, f"writes acknowledged again after {after}")

    # The faults.

    async def leader_cut_from_followers(self) -> None:
        lead = await self.leader()
        for f in self.followers(lead):
            self.net.cut(lead.node, f)
        await asyncio.sleep(self.hold)

    async def leader_cut_from_etcd(self) -> None:
        lead = await self.leader()
        for e in ETCD:
            self.net.cut(lead.node, e)
        await asyncio.sleep(self.hold)

    async def follower_cut_off(self) -> None:
        lead = await self.leader()
        f = self.followers(lead)[0]
        self.net.isolate(f, ETCD + BROKERS + [CLIENT])
        await asyncio.sleep(self.hold)

    async def flapping(self) -> None:
        lead = await self.leader()
        end = time.monotonic() + 2 * self.hold
        while time.monotonic() < end:
            for f in self.followers(lead):
                self.net.cut(lead.node, f)
            await asyncio.sleep(1.0)
            self.net.heal()
            await asyncio.sleep(1.0)

    async def one_way_loss_and_delay(self) -> None:
        lead = await self.leader()
        for f in self.followers(lead):
            self.net.loss(lead.node, f, 0.3)
        self.log("  " + self.net.netem(lead.node, delay_ms=150, jitter_ms=50, reorder=0.2))
        await asyncio.sleep(self.hold)

    async def one_way_cut(self) -> None:
        lead = await self.leader()
        for f in self.followers(lead):
            self.net.one_way_cut(f, lead.node)  # the leader sends, hears nothing back
        await asyncio.sleep(self.hold)

    async def kill_leader(self) -> None:
        lead = await self.leader()
        self.bc.kill(GROUP, lead.replica)
        await asyncio.sleep(self.hold)
        self.bc.start(GROUP, lead.replica)

    async def pause_leader(self) -> None:
        lead = await self.leader()
        self.bc.pause(GROUP, lead.replica)
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.bc.resume(GROUP, lead.replica)

    def schedule(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        return [
            ("leader cut off from its followers, not from etcd", self.leader_cut_from_followers),
            ("leader cut off from etcd, not from its followers", self.leader_cut_from_etcd),
            ("a follower cut off from everything", self.follower_cut_off),
            ("flapping: leader and followers cut and healed every second", self.flapping),
            ("one-way loss and delay from the leader", self.one_way_loss_and_delay),
            ("one-way cut: followers to leader", self.one_way_cut),
            ("leader killed (SIGKILL) and restarted", self.kill_leader),
            ("leader paused (SIGSTOP) past its lease", self.pause_leader),
        ]

    async def run(self, rounds: int = 1, deadline: float | None = None) -> None:
        for _ in range(rounds):
            for name, fault in self.schedule():
                if deadline is not None and time.monotonic() > deadline:
                    return
                await self.step(name, fault)


# -- after heal ------------------------------------------------------------------------------


async def no_pending_transactions(addr: str) -> bool:
    try:
        c = await RawClient.connect(addr)
    except Exception:
        return False
    try:
        resp = await c.call(RequestCode.TXMQ_LIST_TRANSACTIONS, {"state": "PENDING"})
    except Exception:
        return False
    finally:
        await c.close()
    return resp.code == ResponseCode.SUCCESS and resp.body in (b"[]", b"")


async def drain(history: History, addr: str, queues: int) -> list[str]:
    """Read every stored message of the topic from ``addr`` (the leader) into the history."""
    inv = history.invoke("final", "drain", None)
    async with connected(addr) as c:
        msgs = await c.pull_all(TOPIC, queues)
    ids = [m.body.decode() for m in msgs]
    history.ok(inv, ids)
    return ids


def commit_log_bytes(r: Replica) -> bytes:
    files = sorted((r.store / "commitlog").iterdir())
    return b"".join(f.read_bytes() for f in files).rstrip(b"\0")


def copy_logs(bc: NsBrokerCluster, etcd_base: Path, dest: Path) -> None:
    """Keep the brokers' and etcd's logs beside the history (for a failure's post-mortem)."""
    dest.mkdir(parents=True, exist_ok=True)
    for r in bc.replicas.values():
        if r.log.exists():
            shutil.copy(r.log, dest / f"{r.group}-{r.replica}.log")
    for n in ETCD:
        p = etcd_base / n / "etcd.log"
        if p.exists():
            shutil.copy(p, dest / f"{n}.log")


def dump_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))


async def nemesis_run(
    net: Network,
    base: Path,
    workload: Callable[[History, NsBrokerCluster], Workload],
) -> tuple[History, Workload, CheckResult, list[dict[str, Any]]]:
    """The partition test's run: the group in its namespaces, ``workload(history, cluster)``
    running while the nemesis applies every fault and heals; then every pending transaction
    resolved, everything read back, every replica's commit log the same; the history (also
    dumped to ``base/history.jsonl``), the workload, the checker's verdict and the replicas'
    leader events."""
    history = History()
    async with group_in_namespaces(net, base) as (_etcd, bc):
        work = workload(history, bc)
        await work.start()
        nemesis = Nemesis(net, bc, history, work, hold=7.0)
        try:
            await nemesis.recovered("start")
            await nemesis.run()
        finally:
            await work.stop_writers()
            history.dump(base / "history.jsonl")
        leader = await nemesis.leader()
        await bc.wait_in_sync(GROUP, [0, 1, 2], timeout=60)

        async def resolved() -> bool:
            return await no_pending_transactions(leader.addr)

        await bc.wait(resolved, 90, "every pending transaction resolved by check-back")
        await drain(history, leader.addr, 4)
        history.dump(base / "history.jsonl")
        await work.shutdown()

        async def same_logs() -> bool:
            return len({commit_log_bytes(r) for r in bc.replicas.values()}) == 1

        await bc.wait(same_logs, 60, "every replica holds the same commit log after heal")
    events = list(bc.leader_events())
    return history, work, check(history, events), events
