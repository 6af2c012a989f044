"""The Spark sink and source over a cluster of two broker groups, given one group's address: a
streaming query's rows spread over the queues of both groups, each row delivered exactly once,
also when a batch is replayed after the driver "crashed" between the sink's decision and Spark's
commit log; batch and streaming reads cover every group's queues.  Real etcd members, real
broker processes, a real Spark ``local[2]`` session."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_cluster_sdk import two_groups
from tests.spark.helpers import bodies, forget_commit, pull_all, spark_fixture

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "spread"


spark = spark_fixture("local[2]", "txmq-cluster-tests", batch_rows=100)


def _rows(spark: Any, folder: str) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.schema("id INT")
        .option("maxFilesPerTrigger", 1)
        .json(folder)
        .repartition(2)
        .select(F.concat(F.lit("row-"), F.col("id").cast("string")).alias("body"))
    )


async def test_stream_sink_spreads_over_both_groups_exactly_once(
    spark: Any, make_cluster: Any, tmp_path: Path
) -> None:
    _bc, g1, _g2 = await two_groups(make_cluster)
    folder = tmp_path / "input"
    folder.mkdir()
    for r in (range(0, 300), range(300, 600)):
        lines = [f'{{"id": {i}}}' for i in r]
        (folder / f"part-{r.start:06d}.json").write_text("\n".join(lines) + "\n")
    ckpt = tmp_path / "ckpt"

    def run_query() -> Any:
        query = (
            _rows(spark, str(folder))
            .writeStream.format("txmq")
            .option("broker", g1)
            .option("topic", TOPIC)
            .option("batchSize", "32")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        return query

    run_query()
    # The driver "crashed" after the sink decided batch 1 and before Spark recorded it: the
    # restarted query runs batch 1 again, and the broker's recorded decision makes it a no-op.
    forget_commit(ckpt, 1)
    run_query()

    got = pull_all(g1, TOPIC)
    assert bodies(got) == sorted(f"row-{i}" for i in range(600))
    per_group = collections.Counter(m.store_host for m in got)
    assert len(per_group) == 2, f"rows should be stored by both groups' leaders: {per_group}"

    # The source reads both groups: a batch read, and a streaming read whose offsets name each
    # queue by group.
    df = spark.read.format("txmq").option("broker", g1).option("topic", TOPIC).load()
    rows = df.select("body", "broker", "queue_id").collect()
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"row-{i}" for i in range(600))
    assert {r.broker for r in rows} == {"g1", "g2"}

    seen: list[str] = []

    def collect(batch: Any, _batch_id: int) -> None:
        seen.extend(bytes(r.body).decode() for r in batch.select("body").collect())

    query = (
        spark.readStream.format("txmq")
        .option("broker", g1)
        .option("topic", TOPIC)
        .option("maxMessagesPerTrigger", "250")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "read-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    assert sorted(seen) == sorted(f"row-{i}" for i in range(600))
    end = query.lastProgress["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    assert sorted(end[TOPIC]) == ["g1:0", "g1:1", "g2:0", "g2:1"]
