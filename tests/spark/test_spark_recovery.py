"""Failures and recovery of the streaming sink in real Spark (``local[2,4]``: a task may fail up
to three times and be retried): a retried task, a replayed batch and an aborted batch each end
with every row delivered exactly once and nothing from a failed attempt ever visible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import (
    attempt_of,
    by_state,
    failing_body_udf,
    forget_commit,
    order_ids,
    order_rows,
    pull_all,
    spark_fixture,
    transactions,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


spark = spark_fixture("local[2,4]", "txmq-recovery-tests", batch_rows=50)


def _start(
    spark: Any, folder: str, address: str, topic: str, checkpoint: Path, body_udf: Any = None
) -> Any:
    """Stream the JSON files of ``folder`` (one file per micro-batch, two tasks per batch) into
    ``topic`` and wait for the query to end."""
    from pyspark.sql import functions as F

    df = order_rows(spark, folder)
    if body_udf is None:
        body = F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit("|"))
    else:
        body = body_udf(F.col("id"))
    query = (
        df.select(body.alias("body"), "customer")
        .writeStream.format("txmq")
        .option("broker", address)
        .option("topic", topic)
        .option("batchSize", "20")
        .option("queueColumn", "customer")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    except Exception:
        pass  # query.exception() tells the test
    return query


def test_retried_task_leaves_no_duplicates_and_its_orphans_are_rolled_back(
    spark: Any, spark_broker: BrokerThread, json_input: Any, tmp_path: Path
) -> None:
    address = spark_broker.address
    folder = json_input([range(0, 1000), range(1000, 2000), range(2000, 3000)])
    # In the second batch, the first attempt of partition 0 fails after storing halves.
    flaky = failing_body_udf(address, ids=range(1000, 2000), after=400, attempts=(0,))
    query = _start(spark, folder, address, "retry-out", tmp_path / "ckpt", flaky)
    assert query.exception() is None

    assert order_ids(pull_all(address, "retry-out")) == list(range(3000))
    states = by_state(transactions(address, f"txmq-spark-{query.id}"))
    assert "PENDING" not in states
    orphans = [r for r in states["ROLLED_BACK"] if r["batchKey"] == f"{query.id}-1"]
    assert orphans and all(attempt_of(r["transactionId"])[1] == 0 for r in orphans)
    assert sum(len(r["halves"]) for r in orphans) > 0
    # The retry of the failed task committed under attempt number 1.
    assert any(attempt_of(r["transactionId"])[1] == 1 for r in states["COMMITTED"])


def test_replayed_batch_is_not_delivered_twice(
    spark: Any, spark_broker: BrokerThread, json_input: Any, tmp_path: Path
) -> None:
    address = spark_broker.address
    folder = json_input([range(0, 300), range(300, 600), range(600, 900)])
    ckpt = tmp_path / "ckpt"
    first = _start(spark, folder, address, "replay-out", ckpt)
    assert first.exception() is None
    assert order_ids(pull_all(address, "replay-out")) == list(range(900))
    committed_before = by_state(transactions(address, f"txmq-spark-{first.id}"))["COMMITTED"]

    forget_commit(ckpt, 2)
    again = _start(spark, folder, address, "replay-out", ckpt)
    assert again.exception() is None and again.id == first.id
    # Spark really ran batch 2 again, with its 300 rows ...
    assert [
        (p["batchId"], p["numInputRows"]) for p in again.recentProgress if p["numInputRows"]
    ] == [(2, 300)]
    # ... and the sink, finding the batch decided, wrote nothing.
    assert order_ids(pull_all(address, "replay-out")) == list(range(900))
    states = by_state(transactions(address, f"txmq-spark-{first.id}"))
    assert set(states) == {"COMMITTED"}
    assert len(states["COMMITTED"]) == len(committed_before)


def test_aborted_batch_delivers_nothing_until_it_is_replayed(
    spark: Any, spark_broker: BrokerThread, json_input: Any, tmp_path: Path
) -> None:
    address = spark_broker.address
    folder = json_input([range(0, 300), range(300, 1300)])
    ckpt = tmp_path / "ckpt"
    marker = tmp_path / "fail"
    marker.write_text("while this file exists, every attempt of one task of batch 1 fails")
    flaky = failing_body_udf(address, ids=range(300, 1300), after=400, marker=str(marker))

    failed = _start(spark, folder, address, "abort-out", ckpt, flaky)
    assert "injected failure" in str(failed.exception())
    # Batch 0 was committed; nothing of the aborted batch 1 is visible.
    assert order_ids(pull_all(address, "abort-out")) == list(range(300))
    states = by_state(transactions(address, f"txmq-spark-{failed.id}"))
    batch1 = [r for s in states.values() for r in s if r["batchKey"] == f"{failed.id}-1"]
    assert batch1 and not any(r["state"] == "COMMITTED" for r in batch1)
    # Four failed attempts of the failing task left orphans; they wait, invisible.
    assert sum(len(r["halves"]) for r in batch1 if r["state"] == "PENDING") > 0

    # Restart without the failure: Spark replays batch 1, the sink commits it once and the
    # broker rolls back every orphan of the aborted run.
    marker.unlink()
    again = _start(spark, folder, address, "abort-out", ckpt, flaky)
    assert again.exception() is None
    assert order_ids(pull_all(address, "abort-out")) == list(range(1300))
    states = by_state(transactions(address, f"txmq-spark-{failed.id}"))
    assert "PENDING" not in states
    assert {r["transactionId"] for r in batch1} <= {
        r["transactionId"] for r in states["ROLLED_BACK"]
    }
