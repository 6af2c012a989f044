"""SDK transactions across broker groups: two groups, topic ``xa`` placed in g1 and ``xb`` in
g2, one transaction with halves in both (``transaction(across_groups=True)``).  It commits or
rolls back as a whole: on a clean run, when a group's leader is SIGKILLed at each step of the
commit (before the decision record is written, right after it, between the groups' commits),
and when its producer leaves it undecided (check-back, answered through the same record).  A
single broker refuses such a transaction.  Real etcd members, real broker processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_cluster_failover import txmq_cli
from tests.support.cluster import BrokerCluster
from tests.support.raw import connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncPullConsumer,
    AsyncTransaction,
    AsyncTransactionProducer,
    CrossGroupUnavailableError,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionFailedError,
    TransactionInDoubtError,
    TransactionListener,
    TransactionProducer,
)
from txmq.client._txn_common import PAUSE_AT_ENV, PAUSE_FILE_ENV
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import TxmqError

pytestmark = pytest.mark.slow

GROUP = "xgroup-tx"
TOPICS = {"xa": "g1", "xb": "g2"}


class ByBody(TransactionListener):
    """Check-back answers by the body: ``c...`` commit, ``r...`` roll back."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        body = message.body.decode()
        self.checked.append(body)
        if body.startswith("c"):
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE


async def start_groups(make_cluster: Any, replicas: int) -> BrokerCluster:
    """g1 and g2 with ``replicas`` replicas each, in sync; ``xa`` placed in g1 only and ``xb``
    in g2 only (2 queues each), routed so by every broker."""
    bc: BrokerCluster = make_cluster(
        groups={"g1": replicas, "g2": replicas}, settings={"minInSyncReplicas": 1}
    )
    bc.start_all()
    l1 = await bc.wait_leader("g1")
    await bc.wait_leader("g2")
    for g in ("g1", "g2"):
        await bc.wait_in_sync(g, list(range(replicas)))
    for topic, group in TOPICS.items():
        await asyncio.to_thread(
            txmq_cli, "cluster", "place", topic, "--group", group, "--queues", "2",
            "--broker", l1.addr,
        )  # fmt: skip

    async def routed() -> bool:
        async with AsyncPullConsumer("route-probe", bc.seeds("g1")) as c:
            try:
                for topic, group in TOPICS.items():
                    if {q.broker for q in await c.fetch_message_queues(topic)} != {group}:
                        return False
            except TxmqError:
                return False
        return True

    await bc.wait(routed, 30, "xa routed to g1 only and xb to g2 only")

    async def copied() -> bool:
        # Every replica holds its group's topic table with the topic (a new leader serves it).
        for r in bc.replicas.values():
            table = r.store / "config" / "topics.json"
            topic = next(t for t, g in TOPICS.items() if g == r.group)
            if not table.exists() or f'"{topic}"' not in table.read_text():
                return False
        return True

    await bc.wait(copied, 30, "each group's topic in every replica's copied topic table")
    return bc


async def consumed(seeds: str, topic: str) -> list[str] | None:
    """What a consumer of ``topic`` reads from the start (None while a group is unreachable)."""
    try:
        async with AsyncPullConsumer("xgroup-reader", seeds, request_timeout=2.0) as c:
            out: list[str] = []
            for q in await c.fetch_message_queues(topic):
                r = await c.pull(topic, q.queue_id, 0, max_nums=64, broker=q.broker)
                out += [m.body.decode() for m in r.messages]
            return sorted(out)
    except TxmqError:
        return None


async def both_topics(bc: BrokerCluster) -> dict[str, list[str] | None]:
    return {t: await consumed(bc.seeds("g1"), t) for t in TOPICS}


async def batch_state(bc: BrokerCluster, group: str, txid: str) -> dict[str, Any] | None:
    """The decision of ``txid`` (its batch of one) as ``group``'s leader knows it."""
    leader = await bc.wait_leader(group)
    async with connected(leader.addr) as c:
        resp = await c.call(
            RequestCode.TXMQ_DECIDE_BATCH,
            {"producerGroup": GROUP, "batchKey": txid, "queryOnly": "true"},
        )
    if resp.code != ResponseCode.SUCCESS:
        return None
    doc: dict[str, Any] = json.loads(resp.body)
    return doc


async def send_halves(txn: AsyncTransaction, tag: str, n: int = 3) -> None:
    """``n`` halves to each topic: xa first, so g1 is the first group (the commit point)."""
    for topic in TOPICS:
        await asyncio.gather(*(txn.send(Message(topic, f"{tag}-{topic}-{i}")) for i in range(n)))
    assert txn.groups == ["g1", "g2"]


def expected(*tags: str, n: int = 3) -> dict[str, list[str] | None]:
    """What each topic holds once the transactions ``tags`` are committed."""
    return {t: sorted(f"{tag}-{t}-{i}" for tag in tags for i in range(n)) for t in TOPICS}


def sync_commit(seeds: str, tag: str) -> list[str]:
    """A transaction across groups through the blocking facade; the groups it wrote."""
    with TransactionProducer(GROUP, ByBody(), broker=seeds) as tx:
        with tx.transaction(across_groups=True) as txn:
            for topic in TOPICS:
                for i in range(3):
                    txn.send(Message(topic, f"{tag}-{topic}-{i}"))
        assert txn.core.state is LocalTransactionState.COMMIT_MESSAGE
        return txn.core.groups


async def test_commit_rollback_and_check_back_across_groups(make_cluster: Any) -> None:
    """A committed transaction is read in both topics, a rolled-back one in neither; one left
    undecided by a producer that went away is committed in both groups by the check-back
    answer of another producer of the group; one the check-back rolled back cannot be
    committed by its late producer."""
    bc = await start_groups(make_cluster, 1)
    seeds = bc.seeds("g1")
    listener = ByBody()
    async with AsyncTransactionProducer(GROUP, listener, seeds) as tx:
        async with tx.transaction(across_groups=True) as txn:
            await send_halves(txn, "c1")
        assert txn.state is LocalTransactionState.COMMIT_MESSAGE
        with pytest.raises(RuntimeError, match="local work failed"):
            async with tx.transaction(across_groups=True) as rolled:
                await send_halves(rolled, "r1")
                raise RuntimeError("local work failed")
        assert rolled.state is LocalTransactionState.ROLLBACK_MESSAGE
        # Offsets cannot ride on a two-phase transaction (its coordinator does not check them).
        offsets = AsyncTransaction(tx, "offsets-refused", two_phase=True)
        with pytest.raises(ValueError, match="two-phase"):
            offsets.send_offsets(object(), None)  # type: ignore[arg-type]

    # The blocking facade does the same.
    assert await asyncio.to_thread(sync_commit, seeds, "c3") == ["g1", "g2"]
    await bc.wait(
        lambda: _equal(both_topics(bc), expected("c1", "c3")),
        30,
        "the committed transactions read in both topics, the rolled-back one in neither",
    )
    for g in ("g1", "g2"):
        st = await batch_state(bc, g, rolled.transaction_id)
        assert st is not None and st["decided"], st
        assert (st["committed"], st["rolledBack"]) == ([], [rolled.transaction_id]), st

    # A producer leaves one transaction undecided and goes away; another producer of the group
    # answers the groups' checks: the first answer is recorded and both groups commit.
    gone = AsyncTransactionProducer(GROUP, ByBody(), seeds)
    await gone.start()
    abandoned = AsyncTransaction(gone, "xgroup-abandoned-c", across_groups=True)
    await send_halves(abandoned, "c2")
    await gone.shutdown()
    answering = ByBody()
    async with AsyncTransactionProducer(GROUP, answering, seeds) as tx2:
        want = expected("c1", "c2", "c3")
        await bc.wait(
            lambda: _equal(both_topics(bc), want),
            40,
            "the abandoned transaction committed in both groups by a check-back answer",
        )
        assert any(b.startswith("c2") for b in answering.checked)

        # Left undecided by a live producer whose check-back answer is rollback: rolled back
        # in both groups; the late commit is refused and says so.
        late = AsyncTransaction(tx2, "xgroup-late-r", across_groups=True)
        await send_halves(late, "r2")

        async def rolled_back_everywhere() -> bool:
            for g in ("g1", "g2"):
                st = await batch_state(bc, g, late.transaction_id)
                if st is None or not st["decided"]:
                    return False
                assert (st["committed"], st["rolledBack"]) == ([], [late.transaction_id]), st
            return True

        await bc.wait(rolled_back_everywhere, 40, "the check-back rolled back both groups")
        with pytest.raises(TransactionFailedError, match="rolled back before this commit"):
            await late.commit()
    assert await both_topics(bc) == want


async def _equal(got: Awaitable[Any], want: Any) -> bool:
    return bool(await got == want)


#: point -> (the step the producer pauses at, the group whose leader is SIGKILLed there (or
#: SIGSTOPped, for the in-doubt points),
#: whether g2's leader is SIGSTOPped at the commit point so that it applies nothing by itself
#: before it dies, the producer's ``decision_timeout``: 1 s is shorter than a failover, so the
#: first group cannot confirm the decision and the call reports it in doubt)
KILL_POINTS = {
    "before-the-record": ("commit-point", "g1", False, 40.0),
    "before-the-record-in-doubt": ("commit-point", "g1", False, 1.0),
    "right-after-the-record": ("after-commit-point", "g1", False, 40.0),
    "between-the-group-commits": ("group:g2", "g2", True, 40.0),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_leader_killed_during_the_decision(
    make_cluster: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    outcome: str,
) -> None:
    """A group's leader is SIGKILLed while the producer stops at a step of the decision: after
    the group's new leader takes over, both groups hold all the halves (commit) or none
    (rollback).  The call returned that outcome, or (when the first group could not confirm
    the decision in time) raised TransactionInDoubtError saying how it is resolved, and it
    was: through check-back, answered by the same producer."""
    step, victim_group, stop_other, decision_timeout = KILL_POINTS[point]
    in_doubt = decision_timeout < 5
    bc = await start_groups(make_cluster, 2)
    leaders = {g: await bc.wait_leader(g) for g in ("g1", "g2")}
    victim = leaders[victim_group]
    pause = tmp_path / "pause"
    steps = [step, "commit-point"] if stop_other else [step]
    monkeypatch.setenv(PAUSE_AT_ENV, ",".join(steps))
    monkeypatch.setenv(PAUSE_FILE_ENV, str(pause))

    def paused_at(s: str) -> Callable[[], bool]:
        return lambda: Path(f"{pause}.{s}.paused").exists()

    def go(s: str) -> None:
        Path(f"{pause}.{s}.go").touch()

    tag = f"{outcome[0]}-{point}"
    if outcome == "commit":
        want, committed_ids = expected(tag), True
        said_ok = "in doubt" if in_doubt else "committed"
    else:
        want, committed_ids = {t: [] for t in TOPICS}, False
        said_ok = "rollback unconfirmed" if in_doubt else "rolled back"
    listener = ByBody()
    async with AsyncTransactionProducer(
        GROUP, listener, bc.seeds("g1"), decision_timeout=decision_timeout
    ) as tx:
        made: list[AsyncTransaction] = []

        async def run() -> str:
            try:
                async with tx.transaction(across_groups=True) as txn:
                    made.append(txn)
                    await send_halves(txn, tag)
                    if outcome == "rollback":
                        raise RuntimeError("roll it back")
            except TransactionInDoubtError as exc:
                return f"in doubt: {exc}"
            except RuntimeError:
                return "rolled back" if txn.state is not None else "rollback unconfirmed"
            return "committed"

        task = asyncio.ensure_future(run())
        try:
            if stop_other:
                await wait_until(paused_at("commit-point"), 30, "paused at the commit point")
                bc.pause("g2", leaders["g2"].replica)
                go("commit-point")
            await wait_until(paused_at(step), 30, f"the producer paused at {step}")
            if in_doubt:
                # A stalled leader (SIGSTOP): it keeps its lease, so its group has no leader
                # for longer than the decision timeout (a killed one is replaced in under a
                # second, faster than any timeout worth testing).
                bc.pause(victim.group, victim.replica)
            else:
                bc.kill(victim.group, victim.replica)
            go(step)
            said = await asyncio.wait_for(task, 90)
            if in_doubt:
                await bc.wait_leader(victim_group, not_replica=victim.replica, timeout=40)
        finally:
            if in_doubt:
                bc.resume(victim.group, victim.replica)  # fenced: it rejoins as a follower
            for s in steps:
                go(s)
            if stop_other and bc.replicas[("g2", leaders["g2"].replica)].running:
                bc.resume("g2", leaders["g2"].replica)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=10)
        assert said.startswith(said_ok), said
        if said.startswith("in doubt"):
            assert "is in doubt" in said and "check-back" in said, said
        await bc.wait_leader(victim_group, not_replica=victim.replica, timeout=40)
        txid = made[0].transaction_id

        async def settled() -> bool:
            # Decided in both groups (by the producer, by the recorded decision, or through
            # check-back, while the producer is still there to answer) and read so.
            for g in ("g1", "g2"):
                st = await batch_state(bc, g, txid)
                if st is None or not st["decided"]:
                    return False
                if (st["committed"], st["rolledBack"]) != (
                    ([txid], []) if committed_ids else ([], [txid])
                ):
                    pytest.fail(f"{g} decided {st} for {outcome}")
            return await both_topics(bc) == want

        await bc.wait(settled, 60, f"both groups hold {'all' if outcome == 'commit' else 'none'}")
    if in_doubt:
        assert any(b.startswith(tag) for b in listener.checked), listener.checked


async def test_single_broker_refuses_a_transaction_across_groups(
    broker: BrokerController,
) -> None:
    """Without etcd there is nowhere to record a decision for several groups: a clear error,
    before anything is sent."""
    async with AsyncTransactionProducer(GROUP, ByBody(), broker.address) as tx:
        with pytest.raises(CrossGroupUnavailableError, match="single broker"):
            async with tx.transaction(across_groups=True):
                pytest.fail("the transaction should not start")
        txn = AsyncTransaction(tx, "built-directly", across_groups=True)
        with pytest.raises(CrossGroupUnavailableError, match="needs etcd"):
            await txn.send(Message("xa", "never"))
        assert txn.halves == []


def test_sync_facade_refuses_it_too(broker_thread: BrokerController) -> None:
    with TransactionProducer(GROUP, ByBody(), broker=broker_thread.address) as tx:
        with pytest.raises(CrossGroupUnavailableError, match="single broker"):
            with tx.transaction(across_groups=True):
                pytest.fail("the transaction should not start")


async def test_an_operator_decision_applies_in_every_group(make_cluster: Any) -> None:
    """A transaction across groups whose producer went away (no producer left to answer
    checks) is committed by an operator through one group's leader: the decision is recorded
    for the transaction, so the other group commits too; a contrary decision asked of the other
    group afterwards is refused."""
    bc = await start_groups(make_cluster, 1)
    seeds = bc.seeds("g1")
    gone = AsyncTransactionProducer(GROUP, ByBody(), seeds)
    await gone.start()
    orphan = AsyncTransaction(gone, "xgroup-operator-c", across_groups=True)
    await send_halves(orphan, "op")
    await gone.shutdown()
    leader = await bc.wait_leader("g1")
    async with AsyncAdminClient(leader.addr) as admin:
        await admin.force_decide(orphan.transaction_id, True, "verified by hand")
    await bc.wait(
        lambda: _equal(both_topics(bc), expected("op")),
        40,
        "the operator's commit applied in both groups",
    )
    other = await bc.wait_leader("g2")
    async with AsyncAdminClient(other.addr) as admin:
        with pytest.raises(TxmqError):
            await admin.force_decide(orphan.transaction_id, False, "too late")
    assert await both_topics(bc) == expected("op")
