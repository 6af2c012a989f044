"""Rows of nothing but a body in real Spark (``local[2,4]``, Arrow batches of 50 rows): they take
the sink's column-wise encoding, and a task that fails after storing halves is retried with
every row delivered exactly once and the failed attempt's halves rolled back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import (
    attempt_of,
    by_state,
    failing_body_udf,
    order_ids,
    order_rows,
    pull_all,
    spark_fixture,
    transactions,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


spark = spark_fixture("local[2,4]", "txmq-plain-rows-tests", batch_rows=50)


def test_body_only_rows_survive_a_retried_task_exactly_once(
    spark: Any, spark_broker: BrokerThread, json_input: Any, tmp_path: Path
) -> None:
    address = spark_broker.address
    folder = json_input([range(0, 1000), range(1000, 2000)])
    # In the second batch, the first attempt of partition 0 fails after storing halves.
    flaky = failing_body_udf(address, ids=range(1000, 2000), after=300, attempts=(0,))
    df = order_rows(spark, folder)
    query = (
        df.select(flaky("id").alias("body"))  # a string body and no other column
        .writeStream.format("txmq")
        .option("broker", address)
        .option("topic", "plain-out")
        .option("batchSize", "20")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    except Exception:
        pass  # query.exception() tells the test
    assert query.exception() is None

    got = pull_all(address, "plain-out")
    assert order_ids(got) == list(range(2000))
    assert len({m.msg_id for m in got}) == 2000
    assert all(len(m.body) == 1024 and m.user_properties == {} for m in got)
    states = by_state(transactions(address, f"txmq-spark-{query.id}"))
    assert "PENDING" not in states
    orphans = [r for r in states["ROLLED_BACK"] if r["batchKey"] == f"{query.id}-1"]
    assert orphans and all(attempt_of(r["transactionId"])[1] == 0 for r in orphans)
    assert sum(len(r["halves"]) for r in orphans) > 0
    assert sum(len(r["halves"]) for r in states["COMMITTED"]) == 2000
