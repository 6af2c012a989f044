"""txmq -> Spark -> txmq with the option ``pipeline`` on a cluster of two broker groups: the
topics have queues in both groups, the pipeline's positions are etcd records.  The checkpoint
loses the offsets and commits of its last batches, g1's leader is SIGKILLed, more input
arrives and the query restarts with larger micro-batches; later the whole checkpoint is
deleted and it starts again.  Every input id is in the output exactly once and no half is left
pending.  Real etcd members, real broker processes, a real Spark ``local[2]`` session."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_cluster_failover import txmq_cli
from tests.spark.helpers import by_state, pull_all, spark_fixture, transactions
from tests.spark.test_spark_pipeline import _batches, _forget_batches, _ids
from tests.spark.test_spark_pipeline import _run as run_pipeline
from tests.support.cluster import BrokerCluster
from txmq.client import Message, Producer

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SOURCE, OUT, PIPE = "pipe-in", "pipe-out", "copy-cluster"
#: Bound of one query run.
RUN_TIMEOUT = 240.0


spark = spark_fixture("local[2]", "txmq-cluster-pipeline-tests")


def _publish(seeds: str, ids: range) -> None:
    with Producer("pipeline-cluster-seed", broker=seeds) as producer:
        for i in ids:
            producer.send(Message(SOURCE, f"id-{i}".encode()))


def _run(spark: Any, seeds: str, ckpt: Path, per_batch: int) -> Any:
    return run_pipeline(spark, seeds, SOURCE, OUT, ckpt, PIPE, per_batch, timeout=RUN_TIMEOUT)


async def _start(make_cluster: Any) -> BrokerCluster:
    """g1 (two replicas, in sync) and g2 (one), both topics placed in both groups."""
    bc: BrokerCluster = make_cluster(groups={"g1": 2, "g2": 1}, settings={"minInSyncReplicas": 1})
    bc.start_all()
    l1 = await bc.wait_leader("g1")
    await bc.wait_leader("g2")
    await bc.wait_in_sync("g1", [0, 1])
    for topic in (SOURCE, OUT):
        for group in ("g1", "g2"):
            await asyncio.to_thread(
                txmq_cli, "cluster", "place", topic, "--group", group, "--queues", "2",
                "--broker", l1.addr,
            )  # fmt: skip

    async def copied() -> bool:
        # Every g1 replica holds the topic table with both topics (a new leader serves them).
        for r in bc.replicas.values():
            table = r.store / "config" / "topics.json"
            if r.group == "g1" and not (table.exists() and SOURCE in table.read_text()):
                return False
            if r.group == "g1" and OUT not in table.read_text():
                return False
        return True

    await bc.wait(copied, 30, "both topics in every g1 replica's copied topic table")
    return bc


async def _output(bc: BrokerCluster, seeds: str, count: int) -> list[int]:
    """The ids in the output topic once ``count`` distinct ones are readable: a batch decided
    through one group commits its halves in the other groups when they apply the etcd record,
    and reads in a group stop at what its in-sync replicas confirmed, so the last rows may be
    readable a moment after the query returns."""
    got: list[int] = []

    async def settled() -> bool:
        nonlocal got
        got = _ids(await asyncio.to_thread(pull_all, seeds, OUT))
        return len(set(got)) >= count

    await bc.wait(settled, 60, f"{count} distinct ids readable in {OUT}")
    return got


async def test_pipeline_on_a_cluster_neither_repeats_nor_skips(
    spark: Any, make_cluster: Any, tmp_path: Path
) -> None:
    bc = await _start(make_cluster)
    seeds = bc.seeds("g1")  # g1's replicas: the query finds g1's leader, and g2 through it
    ckpt = tmp_path / "ckpt"
    await asyncio.to_thread(_publish, seeds, range(0, 600))
    first = _run(spark, seeds, ckpt, 100)
    ran = _batches(first)
    assert sum(n for _, n in ran) == 600 and len(ran) >= 6, ran
    assert await _output(bc, seeds, 600) == list(range(600))
    got = await asyncio.to_thread(pull_all, seeds, OUT)
    assert len({m.store_host for m in got}) == 2, "the output should be in both groups"

    # Spark runs the next-to-last batch again from its logged offsets and plans the last one
    # anew, against g1's next leader, with batches of 250 (a batch planned anew would end
    # later than it did).
    last = max(b for b, _ in ran)
    _forget_batches(ckpt, offsets=[last], commits=[last - 1, last])
    l1 = await bc.wait_leader("g1")
    bc.kill("g1", l1.replica)
    await bc.wait_leader("g1", not_replica=l1.replica)
    await asyncio.to_thread(_publish, seeds, range(600, 900))
    again = _run(spark, seeds, ckpt, 250)
    assert again.id == first.id
    ran = _batches(again)
    assert [b for b, _ in ran[:2]] == [last - 1, last], ran
    assert [n for _, n in ran[:2]] == [n for b, n in _batches(first) if b >= last - 1], ran
    assert sum(n for _, n in ran[2:]) == 300, ran

    # A new checkpoint starts where the pipeline's last decided batch ended.
    shutil.rmtree(ckpt)
    await asyncio.to_thread(_publish, seeds, range(900, 1000))
    fresh = _run(spark, seeds, ckpt, 250)
    assert fresh.id != first.id
    assert sum(n for _, n in _batches(fresh)) == 100, _batches(fresh)

    assert await _output(bc, seeds, 1000) == list(range(1000))
    states: dict[str, Any] = {}
    for group in ("g1", "g2"):
        leader = await bc.wait_leader(group)
        for state, records in by_state(
            await asyncio.to_thread(transactions, leader.addr, f"txmq-spark-{PIPE}")
        ).items():
            states.setdefault(state, []).extend(records)
    assert "PENDING" not in states, states.get("PENDING")
    # The two batches run again wrote halves, rolled back by their replayed decisions.
    assert states.get("ROLLED_BACK"), states.keys()
