"""The ``txmq`` data source in real Spark (``local[2]``) against a real broker: the streaming
sink delivers every row once, the source reads back what the sink wrote and resumes from its
checkpoint, the batch writer is all-or-nothing, and the Spark 3.5 ``foreachBatch`` helper keeps
the same guarantee."""

from __future__ import annotations

import importlib.util
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import (
    attempt_of,
    bodies,
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


spark = spark_fixture("local[2]", "txmq-sink-tests", batch_rows=100)


def _orders(spark: Any, folder: str) -> Any:
    from pyspark.sql import functions as F

    return order_rows(spark, folder).select(
        F.concat(F.lit("order-"), F.col("id").cast("string")).alias("body"),
        F.col("customer").alias("keys"),
        F.lit("created").alias("tags"),
        F.create_map(F.lit("amount"), F.col("amount").cast("string")).alias("properties"),
        "customer",
    )


def test_stream_sink_delivers_every_row_exactly_once(
    spark: Any, spark_broker: BrokerThread, json_input: Any, tmp_path: Path
) -> None:
    address = spark_broker.address
    folder = json_input([range(0, 400), range(400, 800), range(800, 1200)])
    query = (
        _orders(spark, folder)
        .writeStream.format("txmq")
        .option("broker", address)
        .option("topic", "sink-orders")
        .option("queueColumn", "customer")
        .option("batchSize", "64")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [400, 400, 400]

    got = pull_all(address, "sink-orders")
    assert bodies(got) == sorted(f"order-{i}" for i in range(1200))
    for m in got:
        i = int(m.body.decode().split("-")[1])
        assert (m.tags, m.keys, m.user_properties) == (
            "created",
            f"c{i % 7}",
            {"amount": str(i * 1.5)},
        )
        assert m.queue_id == zlib.crc32(f"c{i % 7}".encode()) % 4
    # One transaction per task attempt, all committed; none left pending.
    states = by_state(transactions(address, f"txmq-spark-{query.id}"))
    assert set(states) == {"COMMITTED"}
    assert sum(len(r["halves"]) for r in states["COMMITTED"]) == 1200
    assert {r["batchKey"] for r in states["COMMITTED"]} == {f"{query.id}-{b}" for b in range(3)}


def test_source_reads_back_what_the_sink_wrote_and_resumes(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    address = spark_broker.address

    def batch_write(ids: range) -> None:
        df = spark.createDataFrame([(f"msg-{i}", f"k{i}") for i in ids], "body STRING, keys STRING")
        (
            df.write.format("txmq")
            .mode("append")
            .option("broker", address)
            .option("topic", "src-roundtrip")
            .save()
        )

    seen: list[tuple[int, Any]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend((batch_id, r) for r in df.collect())

    def read_available() -> None:
        query = (
            spark.readStream.format("txmq")
            .option("broker", address)
            .option("topic", "src-roundtrip")
            .option("maxMessagesPerTrigger", "150")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "src-ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    batch_write(range(500))
    read_available()
    first = [r for _, r in seen]
    assert sorted(r.body.decode() for r in first) == sorted(f"msg-{i}" for i in range(500))
    per_batch: dict[int, int] = {}
    for b, _ in seen:
        per_batch[b] = per_batch.get(b, 0) + 1
    assert len(per_batch) >= 4 and max(per_batch.values()) <= 150  # maxMessagesPerTrigger
    r0 = first[0]
    assert r0.topic == "src-roundtrip" and r0.keys == r0.body.decode().replace("msg-", "k")
    assert r0.born_timestamp <= r0.store_timestamp and r0.msg_id
    assert len({(r.queue_id, r.queue_offset) for r in first}) == 500

    # Restart from the checkpoint after more messages arrived: only the new ones are read.
    batch_write(range(500, 700))
    seen.clear()
    read_available()
    assert sorted(r.body.decode() for _, r in seen) == sorted(f"msg-{i}" for i in range(500, 700))

    # The batch reader reads everything committed.
    everything = (
        spark.read.format("txmq").option("broker", address).option("topic", "src-roundtrip").load()
    )
    assert everything.count() == 700


def test_batch_write_is_all_or_nothing(spark: Any, spark_broker: BrokerThread) -> None:
    from pyspark.sql import functions as F

    address = spark_broker.address
    # Partition 0 (ids 0..499) fails after 400 rows, once it has stored halves.
    flaky = failing_body_udf(address, ids=range(0, 500), after=400, group="job-g")
    df = spark.range(0, 1000, 1, 2).select(flaky(F.col("id")).alias("body"))
    writer = (
        df.write.format("txmq")
        .mode("append")
        .option("broker", address)
        .option("topic", "job-out")
        .option("producerGroup", "job-g")
        .option("batchSize", "20")
    )
    with pytest.raises(Exception, match="injected failure"):
        writer.save()
    assert pull_all(address, "job-out") == []
    states = by_state(transactions(address, "job-g"))
    assert set(states) == {"ROLLED_BACK"}  # the abort decided the job: nothing pending
    assert any(
        attempt_of(r["transactionId"]) == (0, 0) and r["halves"] for r in states["ROLLED_BACK"]
    )

    # The same job without the failure is delivered whole.
    ok = spark.range(0, 1000, 1, 2).select(
        F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit("|")).alias("body")
    )
    (
        ok.write.format("txmq")
        .mode("append")
        .option("broker", address)
        .option("topic", "job-out")
        .option("producerGroup", "job-g")
        .save()
    )
    assert order_ids(pull_all(address, "job-out")) == list(range(1000))


def test_foreach_batch_helper_is_exactly_once(
    spark: Any, spark_broker: BrokerThread, json_input: Any, tmp_path: Path
) -> None:
    from txmq.spark_connector import txmq_foreach_batch

    address = spark_broker.address
    folder = json_input([range(0, 300), range(300, 600)])
    ckpt = tmp_path / "fe-ckpt"

    def run() -> Any:
        query = (
            _orders(spark, folder)
            .writeStream.foreachBatch(
                txmq_foreach_batch(broker=address, topic="fe-orders", queue_column="customer")
            )
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None
        return query

    query = run()
    expected = sorted(f"order-{i}" for i in range(600))
    assert bodies(pull_all(address, "fe-orders")) == expected
    # Replay batch 1 as after a driver crash between the sink's commit and Spark's commit log.
    forget_commit(ckpt, 1)
    again = run()
    assert [p["batchId"] for p in again.recentProgress if p["numInputRows"]] == [1]
    assert bodies(pull_all(address, "fe-orders")) == expected
    assert set(by_state(transactions(address, f"txmq-spark-{query.id}"))) == {"COMMITTED"}


def _example() -> Any:
    path = Path(__file__).resolve().parents[2] / "examples" / "pipeline.py"
    spec = importlib.util.spec_from_file_location("txmq_example_pipeline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_pipeline_bills_every_order_exactly_once(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    example = _example()
    address = spark_broker.address
    common = ["--broker", address, "--source", "ex-orders", "--sink", "ex-billing"]
    run = ["run", *common, "--checkpoint", str(tmp_path / "ckpt"), "--available-now"]

    def check() -> int:
        orders = {
            json.loads(m.body)["order_id"]: (json.loads(m.body), m.msg_id)
            for m in pull_all(address, "ex-orders")
        }
        billed = pull_all(address, "ex-billing")
        expected = {oid for oid, (o, _) in orders.items() if o["amount"] > 0}
        assert sorted(m.keys or "" for m in billed) == sorted(expected)  # each order billed once
        for m in billed:
            order, msg_id = orders[m.keys]
            assert json.loads(m.body) == {
                "order_id": order["order_id"],
                "customer": order["customer"],
                "amount_cents": round(order["amount"] * 100),
            }
            assert m.user_properties == {"source_msg_id": msg_id}
            assert m.queue_id == zlib.crc32(order["customer"].encode()) % 4
        return len(billed)

    assert example.main(["seed", *common, "--count", "300"]) == 0
    assert example.main(run) == 0
    first = check()
    assert 200 < first < 300  # about one order in ten is dropped
    # A restart bills only the orders published since.
    assert example.main(["seed", *common, "--count", "100", "--start", "300"]) == 0
    assert example.main(run) == 0
    assert check() > first
    assert example.main(run) == 0
    assert len(pull_all(address, "ex-billing")) == check()
    # `show` counts the messages and their distinct order ids: no duplicate.
    assert example.count_messages(address, "ex-billing") == (check(), check())
    assert example.main(["show", *common]) == 0
