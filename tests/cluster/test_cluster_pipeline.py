"""Pipeline positions in a broker cluster: a pipeline's batch decision records the input range
it consumed in the same etcd transaction as the batch's commit point, and moves the pipeline's
head only from the start the decision names.  Across leader SIGKILLs (one between the commit
point and its group's apply) every group's leader answers where the pipeline is and what the
decided batch from a start ended at, and refuses a decision from a stale start; of two
decisions racing from one start exactly one wins.  Real etcd members, real broker processes;
the halves are sent as the Spark sink sends them (a batch key on each)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.cluster.test_cluster_failover import stored_bodies, text
from tests.support.cluster import BrokerCluster, Replica
from tests.support.raw import connected
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.spark_connector.session import BrokerSession

pytestmark = pytest.mark.slow

GROUP, PIPE, TOPIC = "txmq-spark-copy", "copy", "pipe-out"


def offsets(n: int) -> str:
    """The canonical text of a source's offsets after ``n`` messages per queue."""
    return json.dumps({"orders": {"g1:0": n, "g2:0": n}}, sort_keys=True, separators=(",", ":"))


async def call(addr: str, ext: dict[str, Any], doc: dict[str, Any]) -> tuple[int, Any]:
    """One TXMQ_DECIDE_BATCH: (response code, JSON answer or remark)."""
    async with connected(addr) as c:
        resp = await c.call(
            RequestCode.TXMQ_DECIDE_BATCH, ext, json.dumps(doc).encode(), timeout=15
        )
    if resp.code != ResponseCode.SUCCESS:
        return resp.code, resp.remark
    return resp.code, json.loads(resp.body)


async def decide(addr: str, batch: str, commit: list[str], start: str, end: str) -> tuple[int, Any]:
    doc = {"commit": commit, "pipeline": PIPE, "start": start, "end": end}
    return await call(addr, {"producerGroup": GROUP, "batchKey": batch}, doc)


async def where(addr: str, start: str | None = None, batch: str = f"{PIPE}-position") -> Any:
    doc: dict[str, Any] = {"pipeline": PIPE}
    if start is not None:
        doc["start"] = start
    code, answer = await call(
        addr, {"producerGroup": GROUP, "batchKey": batch, "queryOnly": "true"}, doc
    )
    assert code == ResponseCode.SUCCESS, answer
    return answer


async def halves(leaders: dict[str, Replica], batch: str, tag: str) -> list[str]:
    """One half in each group, tagged ``batch``; their transaction ids."""
    ids = []
    for group, leader in leaders.items():
        txid = f"{tag}-{group}"
        async with connected(leader.addr) as c:
            resp = await c.send(
                TOPIC,
                f"row-{txid}".encode(),
                group=GROUP,
                transactional=True,
                props={"TXMQ_BATCH_KEY": batch, "UNIQ_KEY": txid},
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        ids.append(txid)
    return ids


async def rows(leader: Replica) -> list[str]:
    return sorted(text(b) for b in await stored_bodies(leader.addr, TOPIC))


async def check_answers(leader: Replica, ends: list[str], last_batch: str) -> None:
    """``leader`` answers the pipeline's head, each decided range, and refuses a stale start."""
    head = (await where(leader.addr))["pipeline"]
    assert (head["end"], head["batchKey"]) == (ends[-1], last_batch), head
    starts = ["", *ends]
    for a, b in zip(starts, ends, strict=False):
        assert (await where(leader.addr, a))["pipeline"]["next"] == b
    assert (await where(leader.addr, ends[-1]))["pipeline"]["next"] is None
    code, remark = await decide(leader.addr, f"{PIPE}-stale", [], ends[0], offsets(99))
    assert code == ResponseCode.ILLEGAL_OPERATION, remark
    assert f"pipeline {PIPE!r}" in remark and f"is at {ends[-1]}" in remark, remark


async def test_positions_across_leader_kills(make_cluster: Any) -> None:
    """Batch 1 is decided through g1 while g2's leader is stopped, which is then SIGKILLed
    before it applied its part: g2's next leader applies it from the etcd record, and both new
    leaders (g1's leader is killed too) answer the same position, the same ranges, refuse the
    stale start, answer a repeated decision with its first position, and go on from the
    pipeline's end."""
    bc: BrokerCluster = make_cluster(groups={"g1": 2, "g2": 2}, settings={"minInSyncReplicas": 1})
    bc.start_all()
    leaders = {g: await bc.wait_leader(g) for g in ("g1", "g2")}
    for g in leaders:
        await bc.wait_in_sync(g, [0, 1])
    ends = [offsets(10), offsets(25), offsets(30)]
    keys = [f"{PIPE}-run1-{n}" for n in range(3)]

    first = await halves(leaders, keys[0], "b0")
    code, answer = await decide(leaders["g1"].addr, keys[0], first, "", ends[0])
    assert code == ResponseCode.SUCCESS, answer
    assert answer["position"] == {"pipeline": PIPE, "start": "", "end": ends[0]}

    second = await halves(leaders, keys[1], "b1")
    bc.pause("g2", leaders["g2"].replica)
    code, answer = await decide(leaders["g1"].addr, keys[1], second, ends[0], ends[1])
    assert code == ResponseCode.SUCCESS, answer
    # The decision is in etcd; g2's leader, stopped, applied nothing of it and dies so.
    bc.kill("g2", leaders["g2"].replica)
    new2 = await bc.wait_leader("g2", not_replica=leaders["g2"].replica)
    want = {"g1": ["row-b0-g1", "row-b1-g1"], "g2": ["row-b0-g2", "row-b1-g2"]}

    async def applied() -> bool:
        return await rows(leaders["g1"]) == want["g1"] and await rows(new2) == want["g2"]

    await bc.wait(applied, 40, "batch 1 committed in both groups, g2's part by its new leader")
    assert bc.events("g2", new2.replica, "batch_applied_from_commit_point")
    await check_answers(new2, ends[:2], keys[1])
    # A client given a follower's address (as a Spark source may be) gets the same answer
    # through the group's leader.
    follower = next(
        r for r in bc.replicas.values() if r.group == "g1" and r.replica != leaders["g1"].replica
    )

    async def through_follower() -> Any:
        async with BrokerSession(follower.addr, 10.0) as s:
            return await s.decide_batch(GROUP, "q", query_only=True, pipeline=PIPE, start=ends[0])

    answer = (await through_follower())["pipeline"]
    assert (answer["end"], answer["batchKey"], answer["next"]) == (ends[1], keys[1], ends[1])

    bc.kill("g1", leaders["g1"].replica)
    new1 = await bc.wait_leader("g1", not_replica=leaders["g1"].replica)
    await check_answers(new1, ends[:2], keys[1])
    # A decision made again answers the first one, position included, and moves nothing.
    code, again = await decide(new1.addr, keys[1], second, ends[0], ends[1])
    assert code == ResponseCode.SUCCESS, again
    assert again["position"] == {"pipeline": PIPE, "start": ends[0], "end": ends[1]}
    # "committed" is g1's part of it, "batchCommitted" all of it.
    assert (again["committed"], again["batchCommitted"]) == (["b1-g1"], second), again

    third = await halves({"g1": new1, "g2": new2}, keys[2], "b2")
    code, answer = await decide(new2.addr, keys[2], third, ends[1], ends[2])
    assert code == ResponseCode.SUCCESS, answer
    for leader in (new1, new2):
        await check_answers(leader, ends, keys[2])
    want = {"g1": [*want["g1"], "row-b2-g1"], "g2": [*want["g2"], "row-b2-g2"]}

    async def all_rows() -> bool:
        return await rows(new1) == want["g1"] and await rows(new2) == want["g2"]

    await bc.wait(all_rows, 40, "batch 2 committed in both groups")


async def test_racing_decisions_from_one_start(make_cluster: Any) -> None:
    """Two queries run one pipeline: their batches from the same start are decided at once
    through different groups.  Each round exactly one wins; the other is refused (its halves
    stay pending, nothing of it is delivered) and the pipeline ends where the winner ended.
    Two decisions of one batch key racing are both answered with the first one."""
    bc: BrokerCluster = make_cluster(groups={"g1": 1, "g2": 1}, settings={"minInSyncReplicas": 1})
    bc.start_all()
    leaders = {g: await bc.wait_leader(g) for g in ("g1", "g2")}
    start, delivered = "", []
    for n in range(6):
        keys = {g: f"{PIPE}-{g}run-{n}" for g in leaders}
        ends = {"g1": offsets(10 * n + 5), "g2": offsets(10 * n + 7)}
        txids = {g: await halves({g: leaders[g]}, keys[g], f"r{n}") for g in leaders}
        answers = await asyncio.gather(
            *(decide(leaders[g].addr, keys[g], txids[g], start, ends[g]) for g in leaders)
        )
        won = [g for g, (code, _) in zip(leaders, answers, strict=True) if code == 0]
        assert len(won) == 1, answers
        winner, loser = won[0], next(g for g in leaders if g != won[0])
        code, remark = answers[list(leaders).index(loser)]
        assert code == ResponseCode.ILLEGAL_OPERATION and "is at" in remark, remark
        head = (await where(leaders[loser].addr))["pipeline"]
        assert (head["end"], head["batchKey"]) == (ends[winner], keys[winner])
        assert (await where(leaders[winner].addr, start))["pipeline"]["next"] == ends[winner]
        lost = await where(leaders[loser].addr, batch=keys[loser])
        assert not lost["decided"] and lost["pending"] == txids[loser], lost
        delivered.append(f"row-r{n}-{winner}")
        start = ends[winner]

    async def only_winners() -> bool:
        got = sorted(await rows(leaders["g1"]) + await rows(leaders["g2"]))
        return got == sorted(delivered)

    await bc.wait(only_winners, 30, "the winners' rows delivered, the refused ones not")

    # One batch decided twice at once (a retried commit), through both groups.
    key, end = f"{PIPE}-same", offsets(500)
    ids = await halves(leaders, key, "same")
    twice = await asyncio.gather(
        decide(leaders["g1"].addr, key, ids[:1], start, end),
        decide(leaders["g2"].addr, key, ids, start, end),
    )
    assert all(code == ResponseCode.SUCCESS for code, _ in twice), twice
    assert all(a["position"] == {"pipeline": PIPE, "start": start, "end": end} for _, a in twice)
    # Each group twice its part of the one decision in force: g1's half is in both lists,
    # g2's only in the one sent through g2.
    decided = [sorted(a["committed"]) for _, a in twice]
    assert decided[0] == ["same-g1"] and decided[1] in ([], ["same-g2"]), decided
    assert (await where(leaders["g2"].addr))["pipeline"]["end"] == end


async def test_ranges_are_kept_for_the_batch_retention(make_cluster: Any) -> None:
    """The decided ranges live as long as ``transactionBatchRetention`` (here 3 s) and are then
    pruned by etcd; where the pipeline is stays, so the next batch is decided from there and
    one planned again from a forgotten start is refused rather than delivered twice."""
    bc: BrokerCluster = make_cluster(
        groups={"g1": 1}, settings={"minInSyncReplicas": 1, "transactionBatchRetention": 3000}
    )
    bc.start_all()
    leader = await bc.wait_leader("g1")
    only = {"g1": leader}
    ends = [offsets(10), offsets(20)]
    code, answer = await decide(leader.addr, "b0", await halves(only, "b0", "k0"), "", ends[0])
    assert code == ResponseCode.SUCCESS, answer
    assert (await where(leader.addr, ""))["pipeline"]["next"] == ends[0]

    async def pruned() -> bool:
        return bool((await where(leader.addr, ""))["pipeline"]["next"] is None)

    await bc.wait(pruned, 30, "the decided range pruned after the batch retention")
    head = (await where(leader.addr))["pipeline"]
    assert (head["end"], head["batchKey"]) == (ends[0], "b0")
    code, remark = await decide(leader.addr, "b0-again", [], "", ends[0])
    assert code == ResponseCode.ILLEGAL_OPERATION and f"is at {ends[0]}" in remark, remark
    code, answer = await decide(leader.addr, "b1", await halves(only, "b1", "k1"), *ends)
    assert code == ResponseCode.SUCCESS, answer
    assert (await where(leader.addr, ends[0]))["pipeline"]["next"] == ends[1]
